# run.py -- `rtkit run [options] -- CMD ...`: resolve settings, launch, sample, and always leave a report.
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from datetime import datetime
from typing import Any, Dict, List, Optional

from rtkit import config as cfg


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="run a command (a training script) under rtkit",
                              description="Run CMD with rtkit's allocator, hooks and scheduler, then write a report.",
                              usage="rtkit run [options] -- CMD [ARGS...]")
    add_run_options(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    p.set_defaults(func=main)


def add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", help="named tuning profile (see `rtkit config --profiles`) or a .toml path")
    p.add_argument("--out", help="folder for run directories (default: rtkit-runs)")
    p.add_argument("--name", help="name of this run (default: the command's name)")
    p.add_argument("--run-dir", help="exact run directory to use instead of OUT/<time>-<name>")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="set any rtkit setting for this run (repeatable), e.g. --set malloc_min_size=64K")
    p.add_argument("--plan", help="allocator plan from an earlier run (RUN_DIR/malloc-plan.txt) to start with")
    p.add_argument("--html", action="store_true", help="also write report.html into the run directory")
    p.add_argument("--quiet", action="store_true", help="print no summary at the end (the report is still written)")


def _eprint(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:60] or "run"


def default_name(command: List[str]) -> str:
    parts = [os.path.basename(c) for c in command[:3]]
    if parts and re.match(r"python[0-9.]*$", parts[0]) and len(parts) > 1:
        parts = parts[1:]
        if parts[0] == "-m" and len(parts) > 1:
            parts = parts[1:]
    return _slug(parts[0] if parts else "run")


def make_run_dir(out: str, name: str, exact: Optional[str]) -> tuple:
    """Create the run directory. An unwritable place is not fatal: the run goes on with a temporary
    directory and the returned note says where the report went."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    wanted = exact or os.path.join(out, f"{stamp}-{name}")
    try:
        if not exact:
            base, n = wanted, 1
            while os.path.exists(wanted):
                n += 1
                wanted = f"{base}-{n}"
        os.makedirs(wanted, exist_ok=True)
        probe = os.path.join(wanted, ".rtkit-write-test")
        with open(probe, "w"):
            pass
        os.unlink(probe)
        return os.path.abspath(wanted), None
    except OSError as exc:
        fallback = tempfile.mkdtemp(prefix=f"rtkit-{stamp}-{name}-")
        return fallback, (f"rtkit: cannot write the run directory {wanted} ({exc.strerror}): "
                          f"using {fallback} instead; pass --out DIR with a writable folder")


def main(args) -> int:
    command: List[str] = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        _eprint("rtkit run: error: no command given: use `rtkit run [options] -- CMD [ARGS...]`")
        return 2
    try:
        cli_values = cfg.parse_assignments(args.set)
        if args.out:
            cli_values["out"] = args.out
        if args.name:
            cli_values["name"] = args.name
        if args.plan:
            if not os.path.isfile(args.plan):
                _eprint(f"rtkit run: error: --plan {args.plan}: no such file (use RUN_DIR/malloc-plan.txt of an earlier run)")
                return 2
            cli_values["malloc_plan"] = os.path.abspath(args.plan)
        resolved = cfg.resolve(cli=cli_values, profile=args.profile)
    except cfg.ConfigError as exc:
        msg = str(exc)
        _eprint(msg if msg.startswith("rtkit") else f"rtkit run: error: {msg}")
        return 2
    return execute(command, resolved, run_dir=args.run_dir, html=args.html, quiet=args.quiet)[0]


def execute(command: List[str], resolved: cfg.Resolved, run_dir: Optional[str] = None, html: bool = False,
            quiet: bool = False) -> tuple:
    """Run the command under rtkit; returns (exit code, run directory)."""
    from rtkit import launch
    from rtkit.report import model

    for line in resolved.errors:  # bad RTKIT_* values: one line each, the job still runs
        _eprint(line)
    notes: List[str] = [e.replace("rtkit: ", "", 1) for e in resolved.errors]
    name = resolved["name"] or default_name(command)
    run_dir, dir_note = make_run_dir(resolved["out"], _slug(name), run_dir)
    if dir_note:
        _eprint(dir_note)
        notes.append(dir_note.replace("rtkit: ", "", 1))
    base_env = dict(os.environ)
    for var in list(base_env):  # a parent run's leftovers must not leak into this one
        if var in ("RTKIT_RUN_DIR", "RTKIT_ACTIVE"):
            del base_env[var]
    child_env = launch.build_child_env(resolved, run_dir, base_env, notes)
    interval = resolved["sample_interval_ms"] / 1000.0
    result = launch.run_child(command, child_env, interval)
    if result.error:
        _eprint(f"rtkit: {result.error}")
        notes.append(result.error)
    report = assemble(command, resolved, run_dir, child_env, base_env, result, notes)
    report_path = os.path.join(run_dir, model.REPORT_FILE)
    try:
        model.write_json_atomic(report_path, report)
    except OSError as exc:
        _eprint(f"rtkit: cannot write {report_path}: {exc.strerror}")
        return result.exit_code, run_dir
    if html:
        try:
            from rtkit.report import html as html_report

            html_path = os.path.join(run_dir, "report.html")
            html_report.write(report, html_path)
            _eprint(f"rtkit: html report: {html_path}")
        except Exception as exc:  # the report is a convenience; never change the job's exit code
            _eprint(f"rtkit: could not write report.html: {exc}")
    lines = summary_lines(report) if not quiet and resolved["log"] != "quiet" else []
    for line in lines:
        _eprint(line if line.startswith("rtkit") else f"rtkit: {line}")
    if not any(report_path in line for line in lines):
        _eprint(f"rtkit: report: {report_path}")
    return result.exit_code, run_dir


def summary_lines(report: Dict[str, Any]) -> List[str]:
    try:
        from rtkit.report.terminal import summary_lines as rich_summary

        return list(rich_summary(report))
    except Exception:  # renderer absent or failing: a plain summary still tells the essentials
        run, steps = report["run"], report["steps"]
        med = steps["summary"].get("step_ms_median")
        return [f"rtkit: {run['status']} (exit {run['exit_code']}) in {run['duration_s']:.1f} s; "
                f"steps: {steps['count']}" + (f", median {med:.1f} ms" if med else "") +
                f"; peak RSS {report['process']['peak_rss_bytes'] / 2**20:.0f} MiB"]


def assemble(command, resolved, run_dir, child_env, base_env, result, notes) -> Dict[str, Any]:
    from rtkit import launch
    from rtkit.report import model

    steps, step_notes = model.steps_section(run_dir, result.start, resolved["warmup_steps"], None)
    notes = notes + step_notes
    train_pid = steps.get("pid")
    sections = {name: model.component_section(run_dir, name, train_pid) for name in model.COMPONENT_SECTIONS}
    if result.status == "killed":
        notes.append(f"the command was killed by {result.signal_name}; figures cover the time until then")
    return {
        "schema_version": model.SCHEMA_VERSION,
        "run": {
            "name": resolved["name"] or default_name(command),
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
