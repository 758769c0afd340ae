# runner.py -- the run pipeline behind `rtkit run`, `rtkit demo` and each run of `rtkit bench`: settings, launch, report.
"""resolve() turns the CLI's values into settings (bad input: UserError); execute() makes the run directory,
starts the command under rtkit, assembles report.json (always, also when the command failed or was killed)
and prints the short summary. The command's exit code is the result. `rtkit bench` starts one `rtkit run`
process per run, so every bench run goes through this same pipeline."""
from __future__ import annotations

import os
import stat
import time
from datetime import datetime
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from rtkit import config as cfg
from rtkit import rundir, std_streams
from rtkit.errors import UserError


def _eprint(msg: str) -> None:
    std_streams.say(msg)   # a reader that is gone loses rtkit's lines, never the job's exit code


def resolve(sets: Sequence[str] = (), profile: Optional[str] = None, plan: Optional[str] = None,
            options: Optional[Mapping[str, Any]] = None, defaults: Optional[Mapping[str, Any]] = None,
            who: str = "rtkit run") -> cfg.Resolved:
    """Settings for a run from the CLI: `--set KEY=VALUE` items; `options` (dedicated flags such as --out) win over
    them when given, `defaults` apply where neither set the key; a plan file the allocator cannot read is one
    line on stderr, and the job runs. Bad input raises UserError with the one line to show."""
    try:
        cli_values: Dict[str, Any] = cfg.parse_assignments(list(sets))
        cli_values.update({k: v for k, v in (options or {}).items() if v})
        for key, value in (defaults or {}).items():
            cli_values.setdefault(key, value)
        if plan:
            cli_values["malloc_plan"] = _plan_path(plan)
        resolved = cfg.resolve(cli=cli_values, profile=profile)
    except cfg.ConfigError as exc:
        msg = str(exc)
        raise UserError(msg if msg.startswith("rtkit") else f"{who}: error: {msg}") from None
    from rtkit import pool_room

    room = pool_room.pool_room_problem(resolved["tier_pool_path"], resolved["tier_pool_size"])
    if room:  # tier mode without room would fail inside the job (or fill the disk): say so before it starts
        raise UserError(f"{who}: error: {room}")
    problem = _plan_problem(resolved["malloc_plan"])
    if problem:  # whichever route named it (--plan, --set, environment, profile): the job runs without it
        _eprint(f"{who}: {cfg.BY_KEY['malloc_plan'].env}={resolved['malloc_plan']} not used: {problem}; the job "
                "runs without it (give RUN_DIR/malloc-plan.txt of an earlier run that made a plan)")
    return resolved


def _plan_path(plan: str) -> str:
    """--plan's file as the allocator will read it: the link resolved here, since the allocator does not follow
    links; a path that does not exist is passed on as given (the job runs, and the report says why it was not
    used)."""
    return os.path.realpath(plan) if os.path.exists(plan) else os.path.abspath(plan)


def _plan_problem(path: str) -> Optional[str]:
    """Why the allocator would not read the plan file (docs/safety.md: regular files only), or None."""
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError as exc:
        return (exc.strerror or "cannot be read").lower()
    if stat.S_ISDIR(st.st_mode):
        return "is a directory (the plan is the file malloc-plan.txt in a run directory)"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a FIFO or device is never read)"
    return None


def execute(command: List[str], resolved: cfg.Resolved, run_dir: Optional[str] = None, html: bool = False,
            quiet: bool = False, task=None) -> Tuple[int, str]:
    """Run the command under rtkit; returns (exit code, run directory). `task`: the cluster task
    (rtkit.cluster.spec.Task) the command is, which names the run directory and joins the report."""
    from rtkit import launch
    from rtkit.report import model

    for line in resolved.errors:  # bad RTKIT_* values: one line each, the job still runs
        _eprint(line)
    notes: List[str] = [e.replace("rtkit: ", "", 1) for e in resolved.errors]
    name = resolved["name"] or rundir.default_name(command)
    attempt = 0
    if task is not None and not run_dir:   # OUT/<role>-<index>[.restartN], claimed atomically
        try:
            run_dir, attempt = rundir.make_task_dir(resolved["out"], task.name)
        except OSError as exc:
            _eprint(f"rtkit: cannot create a run directory for {task.name} in {resolved['out']}: {exc}")
    try:
        run_dir, dir_note = rundir.make_run_dir(resolved["out"], rundir.slug(name), run_dir)
    except rundir.RunDirRefused as exc:
        raise UserError(f"rtkit run: error: {exc}") from None
    if dir_note:
        _eprint(dir_note)
        notes.append(dir_note.replace("rtkit: ", "", 1))
    base_env = dict(os.environ)
    for var in list(base_env):  # a parent run's leftovers must not leak into this one
        if var in ("RTKIT_RUN_DIR", "RTKIT_ACTIVE", "RTKIT_LAUNCHER_PID", "RTKIT_RUN_PID"):
            del base_env[var]
    child_env = launch.build_child_env(resolved, run_dir, base_env, notes)
    interval = resolved["sample_interval_ms"] / 1000.0
    from rtkit.live import start as live_start

    live = live_start(command, resolved, run_dir, child_env, base_env, notes, assemble, task)
    result = launch.run_child(command, child_env, interval, on_start=live.start)
    if result.error:
        _eprint(f"rtkit: {result.error}")
        notes.append(result.error)
    if getattr(result, "leftovers", None):
        _eprint(f"rtkit: {result.leftovers}")
        notes.append(result.leftovers)
    report = assemble(command, resolved, run_dir, child_env, base_env, result, notes)
    report["live"] = live.final_section(report)
    if task is not None:
        from rtkit.cluster import taskdir

        taskdir.finish(run_dir, report, task, attempt, result.start)
    report_path = os.path.join(run_dir, model.REPORT_FILE)
    try:
        report_path, run_dir = _write_report(report, run_dir, name)
    except OSError as exc:  # nowhere takes it: the summary below still tells the essentials
        _eprint(f"rtkit: cannot write {report_path}: {exc.strerror or exc}; no report file was kept")
        html = False
        live.finish(report, keep_snapshot=True)
    else:
        live.finish(report)
    if html:
        try:
            from rtkit.report import html as html_report

            html_path = os.path.join(run_dir, "report.html")
            html_report.write(report, html_path)
            if not quiet:
                _eprint(f"rtkit: html report: {html_path}")
        except Exception as exc:  # the report is a convenience; never change the job's exit code
            _eprint(f"rtkit: could not write report.html: {exc}")
    # --quiet: nothing on success; a failed command still gets its summary (that is when it is read)
    quiet = quiet or resolved["log"] == "quiet"
    lines = summary_lines(report) if not quiet or report["run"]["status"] != "ok" else []
    for line in lines:
        _eprint(line if line.startswith("rtkit") else f"rtkit: {line}")
    if lines and not any(report_path in line for line in lines):
        _eprint(f"rtkit: report: {report_path}")
    return result.exit_code, run_dir


def _write_report(report: Dict[str, Any], run_dir: str, name: str) -> Tuple[str, str]:
    """Write report.json into the run directory, or, when its disk refuses (full, I/O error, read-only), into a
    fallback folder with one line saying where; the refused place keeps no half-written file. Returns
    (report path, run directory). OSError when the fallback refuses too."""
    from rtkit import atomic
    from rtkit.report import model

    report_path = os.path.join(run_dir, model.REPORT_FILE)
    try:
        atomic.write_json(report_path, report)
        return report_path, run_dir
    except OSError as exc:
        first_error = exc
    rundir.remove_temporaries(run_dir)
    fallback = rundir.fallback_dir(rundir.slug(name))
    report["run"]["run_dir"] = fallback
    report["notes"].append(f"report.json could not be written to {run_dir} ({first_error.strerror}); written here")
    fallback_path = os.path.join(fallback, model.REPORT_FILE)
    try:
        atomic.write_json(fallback_path, report)
    except OSError:
        rundir.remove_temporaries(fallback)
        raise first_error from None
    _eprint(f"rtkit: cannot write {report_path} ({first_error.strerror}): the report went to {fallback_path}")
    return fallback_path, fallback


def summary_lines(report: Dict[str, Any]) -> List[str]:
    try:
        from rtkit.report import summary

        return list(summary.lines(report))
    except Exception:  # renderer absent or failing: a plain summary still tells the essentials
        run, steps = report["run"], report["steps"]
        med = steps["summary"].get("step_ms_median")
        return [f"rtkit: {run['status']} (exit {run['exit_code']}) in {run['duration_s']:.1f} s; "
                f"steps: {steps['count']}" + (f", median {med:.1f} ms" if med else "") +
                f"; peak RSS {report['process']['peak_rss_bytes'] / 2**20:.0f} MiB"]


def assemble(command: List[str], resolved: cfg.Resolved, run_dir: str, child_env: Mapping[str, str],
             base_env: Mapping[str, str], result, notes: List[str]) -> Dict[str, Any]:
    """report.json's content: the parent's samples and the child's files (schema in docs/report.md)."""
    from rtkit import launch
    from rtkit.report import bounds, model

    steps, step_notes = model.steps_section(run_dir, result.start, resolved["warmup_steps"], None,
                                            hooks_on=bool(resolved["hooks"]))
    notes = notes + step_notes
    train_pid = steps.get("pid")
    sections = {name: model.component_section(run_dir, name, train_pid) for name in model.COMPONENT_SECTIONS}
    if result.status == "killed":
        notes.append(f"the command was killed by {result.signal_name}; figures cover the time until then")
    report = {
        "schema_version": model.SCHEMA_VERSION,
        "run": {
            "name": resolved["name"] or rundir.default_name(command),
            "run_dir": run_dir,
            "command": command,
            "cwd": os.getcwd(),
            "start_time": datetime.fromtimestamp(result.start).astimezone().isoformat(timespec="seconds"),
            "end_time": datetime.fromtimestamp(result.end).astimezone().isoformat(timespec="seconds"),
            "duration_s": round(result.end - result.start, 3),
            "exit_code": result.exit_code,
            "signal": result.signal_name,
            "status": result.status,
            "error": result.error,
            "versions": model.versions(steps["hook"].get("tensorflow_version")),
            "profile": resolved.profile,
            "settings": resolved.as_report(),
            "child_env": launch.changed_env(base_env, child_env),
            "host": model.host_info(),
        },
        "process": model.process_section(result.samples, result.rusage, resolved["sample_interval_ms"]),
        "steps": steps,
        **sections,
        "notes": notes,
        "generated_unix": time.time(),
    }
    if report["process"].get("disk_written_bytes") is not None:
        report["process"]["run_files_written_bytes"] = model.run_files_written(run_dir)
    report["bounds"] = bounds.build(report)
    return report
