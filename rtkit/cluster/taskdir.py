# taskdir.py -- one run directory per cluster task and restart in a shared folder, and its compact task.json.
"""Layout of a cluster folder (the ``--out`` every task of one job shares)::

    OUT/ps-0/              first run of ps task 0
    OUT/worker-1/          first run of worker 1
    OUT/worker-1.restart1/ worker 1 started again (by rtkit launch, a TFJob restart policy, ...)
    OUT/cluster.json       written by `rtkit launch` only: the job, its events, examples per step
    OUT/worker-0/ps-tables.json   the chief's record of each PS's tables (also copied into its task.json)

A directory is claimed with one ``mkdir`` (atomic, also on NFS; ``rtkit.rundir.make_task_dir``), so tasks
on different machines and a task's restarts never collide: the first free ``.restartN`` wins. One folder per job: a second job
in the same folder would be read as restarts of the first.

Each task directory holds the usual report.json plus ``task.json``: a few kilobytes of the figures
the cluster report needs, so merging thousands of tasks never parses their full reports.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from rtkit.cluster.spec import Task

TASK_FILE = "task.json"
# the step signature of a serving TF2 task that follows the coordinator's count (rtkit/hooks/tf2_cluster.py)
FOLLOWER_SIGNATURE = "cluster step clock advanced"
TABLES_FILE = "ps-tables.json"  # written in the chief's run dir by rtkit/hooks/ps_tables.py
TASK_SCHEMA = 1
TIMELINE_POINTS = 60            # per series in task.json: enough for a plot, small for a merge


def _thin(points: Sequence[Sequence[float]], limit: int = TIMELINE_POINTS) -> List[List[float]]:
    if len(points) <= limit:
        return [list(p) for p in points]
    step = (len(points) - 1) / (limit - 1)
    return [list(points[round(i * step)]) for i in range(limit)]


def _allocator_state(report: Dict[str, Any]) -> Optional[str]:
    from rtkit.report.contract import Allocator
    from rtkit.report.fmt import get

    state = get(report.get("allocator"), Allocator.STATE) if isinstance(report.get("allocator"), dict) else None
    return None if state is None else str(state)


def _tier(report: Dict[str, Any]) -> Dict[str, Any]:
    """DRAM (anonymous) peak and bytes in the tier pool: what tier mode on a PS changes."""
    from rtkit.report.contract import Pmem

    pm = report.get("pmem")
    if not isinstance(pm, dict):
        return {}
    # the anonymous-RSS peak is written by prmalloc/tier_stats.c beside the contract's keys (not declared there)
    return {"rss_anon_peak_bytes": pm.get("process_rss_anon_peak_sampled_bytes"),
            "tier_peak_bytes": pm.get(Pmem.TIER_PEAK_BYTES) or None}


def summary(report: Dict[str, Any], task: Task, attempt: int, start_unix: float) -> Dict[str, Any]:
    """The compact per-task record the cluster merge reads (see module docstring)."""
    run, steps, proc = report.get("run", {}), report.get("steps", {}), report.get("process", {})
    stats = steps.get("summary", {})
    per_step = steps.get("per_step") or []
    return {
        "task_schema": TASK_SCHEMA, **task.as_dict(), "attempt": attempt, "start_unix": round(start_unix, 3),
        "duration_s": run.get("duration_s"), "status": run.get("status"), "exit_code": run.get("exit_code"),
        "signal": run.get("signal"), "steps": steps.get("count", 0), "step_signature": steps.get("signature"),
        "step_ms_median": stats.get("step_ms_median"), "steps_per_s": stats.get("steps_per_s"),
        "minor_faults_per_step": stats.get("minor_faults_per_step_median"),
        "peak_rss_bytes": proc.get("peak_rss_bytes"), "allocator_state": _allocator_state(report),
        **_tier(report),
        # (t_s since start, steps done) and (t_s, rss_bytes): the cluster timeline and the per-role plots
        "steps_timeline": _thin([(s["t_s"], s["step"]) for s in per_step if s.get("t_s") is not None]),
        "rss_timeline": _thin([(s["t_s"], s["rss_bytes"]) for s in proc.get("samples") or []]),
    }


def _ps_tables(run_dir: str) -> Optional[Dict[str, Any]]:
    """What the chief recorded about each PS's tables (rtkit/hooks/ps_tables.py), None in other tasks."""
    import json

    try:
        with open(os.path.join(run_dir, TABLES_FILE), encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("ps"), dict) else None


def finish(run_dir: str, report: Dict[str, Any], task: Task, attempt: int, start_unix: float) -> None:
    """Add the cluster section to `report` (in place) and write task.json beside report.json."""
    from rtkit import atomic

    report["cluster"] = {**task.as_dict(), "attempt": attempt}
    rec = summary(report, task, attempt, start_unix)
    tables = _ps_tables(run_dir)
    if tables is not None:
        rec["ps_tables"] = tables
    try:
        atomic.write_json(os.path.join(run_dir, TASK_FILE), rec)
    except OSError:
        pass    # report.json still carries the cluster section; the merge falls back to it
