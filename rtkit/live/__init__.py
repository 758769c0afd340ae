# live -- what a running job shows while it runs: the report snapshot, `rtkit top`, exporters, `rtkit recommend`.
"""The parent of `rtkit run` keeps live.json (the report model's own output, marked running) up to date and
hands each snapshot to the exporters (TensorBoard, Prometheus). Never imports TensorFlow."""
from __future__ import annotations

from typing import Any, Dict, List

from rtkit import std_streams


def start(command: List[str], resolved: Any, run_dir: str, child_env: Dict[str, str], base_env: Dict[str, str],
          notes: List[str], assemble, task: Any = None):
    """The run's live loop (snapshots built by `assemble`, the code that builds report.json) with the
    exporters its settings ask for (one that cannot start: one line on stderr and a note; the job runs)."""
    from rtkit.live.snapshot import Live

    exporters = []
    task_name = getattr(task, "name", None)
    if resolved["tensorboard_dir"]:
        exporters += _exporter(notes, "tensorboard_dir", resolved["tensorboard_dir"], "tensorboard",
                               "pass --tensorboard with a folder you can write", task_name)
    if resolved["metrics_port"]:
        from rtkit import rundir

        name = resolved["name"] or rundir.default_name(command)
        from rtkit.live.metrics import task_port

        port = task_port(resolved["metrics_port"], task) if task is not None else resolved["metrics_port"]
        exporters += _exporter(notes, "metrics_port", port, "metrics",
                               "pass --metrics-port with a free port", resolved["metrics_host"], name, task)
    return Live(command, resolved, run_dir, child_env, base_env, notes, assemble, exporters=exporters)


def _exporter(notes: List[str], key: str, value: Any, kind: str, fix: str, *args) -> List[Any]:
    """[the exporter] or, when it cannot start, [] and one line on stderr (also a note of the report)."""
    try:
        if kind == "tensorboard":
            from rtkit.live.tensorboard import TensorBoardExporter

            return [TensorBoardExporter(value, *args)]
        from rtkit.live.metrics import MetricsExporter

        return [MetricsExporter(value, *args)]
    except ImportError as exc:
        why = f"the {exc.name} package is not installed (pip install 'rtkit[{'metrics' if kind == 'metrics' else 'tensorboard'}]')"
    except OSError as exc:   # a folder that cannot be written, a port in use, an address not of this host
        why = exc.strerror or str(exc)
    line = f"{key} {value}: {why}; the job runs without the {kind} export ({fix})"
    std_streams.say(f"rtkit: {line}")
    notes.append(line)
    return []
