# runner.py -- runs a command under each configuration, interleaved round by round, one `rtkit run` process per run.
"""Each run is a fresh process tree: `rtkit run --run-dir <out>/runs/<config>-r<k> --set ... -- CMD`,
started with the configuration's environment; its stdout/stderr go to <out>/logs/<config>-r<k>.log so
that the progress bar on stderr stays readable. Figures are read back from the run's report.json.
A run that fails, times out or leaves no report is recorded as such; the bench goes on."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, Sequence, TextIO

from rtkit import atomic, rundir, tree_guard
from rtkit.bench import output, stats
from rtkit.bench.peers import Peer

def rtkit_command() -> List[str]:
    """How to start `rtkit` from this interpreter: the console script beside it when installed,
    else the CLI module through this same Python (a checkout without an install)."""
    script = os.path.join(os.path.dirname(sys.executable), "rtkit")
    if os.access(script, os.X_OK):
        return [script]
    return [sys.executable, "-c", "import sys; from rtkit.cli import main; sys.exit(main())"]


def workload_command(workload: str, steps: Optional[int], batch: Optional[int], rows: Optional[int],
                     api: Optional[str], extra: Sequence[str] = (), input_mode: Optional[str] = None,
                     input_latency_ms: Optional[float] = None) -> List[str]:
    cmd = [sys.executable, "-m", "rtkit.workloads", workload]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    if batch is not None:
        cmd += ["--batch", str(batch)]
    if rows is not None:
        cmd += ["--rows", str(rows)]
    if api:
        cmd += ["--api", api]
    if input_mode:
        cmd += ["--input", input_mode]
    if input_latency_ms:
        cmd += ["--input-latency-ms", str(input_latency_ms)]
    return cmd + list(extra)


def _now_iso() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


def _fmt_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class Progress:
    """One status line on stderr: a bar, the run count, round i/K, the configuration, elapsed time
    and an estimate of what is left. On a terminal the line is redrawn in place; otherwise each
    run gets one plain line, so logs of CI jobs stay readable."""

    def __init__(self, total: int, rounds: int, stream: Optional[TextIO] = None, enabled: bool = True):
        self.total, self.rounds = total, rounds
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.monotonic()
        self.done = 0
        self._last = ""

    def _line(self, round_no: int, config: str) -> str:
        width = 24
        filled = int(width * self.done / self.total) if self.total else width
        bar = "#" * filled + "." * (width - filled)
        elapsed = time.monotonic() - self.start
        eta = ""
        if self.done:
            eta = f"  left ~{_fmt_duration(elapsed / self.done * (self.total - self.done))}"
        return (f"rtkit bench [{bar}] {self.done}/{self.total}  round {round_no}/{self.rounds}  {config}  "
                f"elapsed {_fmt_duration(elapsed)}{eta}")

    def show(self, round_no: int, config: str) -> None:
        if not self.enabled:
            return
        line = self._line(round_no, config)
        if self.tty:
            self.stream.write("\r\x1b[K" + line)
        elif line.split("elapsed")[0] != self._last:  # a plain stream gets each run once
            self.stream.write(line + "\n")
        self._last = line.split("elapsed")[0]
        self.stream.flush()

    def finished(self, message: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        self.stream.write(("\r\x1b[K" if self.tty else "") + "  " + message + "\n")
        self.stream.flush()


@dataclass
class BenchSpec:
    peers: List[Peer]                       # configurations that will run (available ones)
    skipped: List[Dict[str, str]]           # {"config", "note"} for configurations that cannot run
    libraries: Dict[str, Optional[str]]     # config -> resolved library path
    command: List[str]                      # the workload command run under every configuration
    rounds: int
    out: str
    baseline: Optional[str]
    timeout_s: Optional[float] = None
    title: str = ""
    argv: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    rtkit: List[str] = field(default_factory=rtkit_command)
    progress: bool = True


def _tail(path: str, lines: int = 3) -> str:
    try:
        with open(path, errors="replace") as fh:
            text = fh.read()[-8000:]
    except OSError:
        return ""
    got = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(got[-lines:])


def _kill_tree(proc: subprocess.Popen, sig: int, grace_s: float) -> None:
    """Signal the run's process group (rtkit run forwards to its child and still writes the
    report), then SIGKILL whatever is left after the grace period."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def run_one(spec: BenchSpec, peer: Peer, round_no: int, position: int, progress: Progress,
            base_env: Dict[str, str]) -> Dict[str, Any]:
    tag = rundir.bench_tag(peer.name, round_no)
    run_dir = rundir.bench_run_dir(spec.out, peer.name, round_no)
    log_path = os.path.join(spec.out, "logs", tag + ".log")
    argv = [*spec.rtkit, "run", "--run-dir", run_dir, "--name", tag, *peer.run_args(), "--", *spec.command,
            *peer.args]
    env = tree_guard.env_dying_with_me(peer.child_env(base_env, spec.libraries.get(peer.name)))
    record: Dict[str, Any] = {
        "config": peer.name, "round": round_no, "position": position, "run_dir": run_dir, "log": log_path,
        "argv": argv, "env": {k: env[k] for k in sorted(peer.env) if k in env},
        "start_time": _now_iso(), "status": "not_started", "exit_code": None, "error": None,
        "bench_wall_s": None, "steps_count": None, "metrics": {k: None for k in stats.METRIC_KEYS},
    }
    if "LD_PRELOAD" in env:
        record["env"]["LD_PRELOAD"] = env["LD_PRELOAD"]
    t0 = time.monotonic()
    interrupted = False
    timed_out = False
    # a new file only (docs/safety.md): never written through a link, never another run's log truncated
    try:
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        record.update(status="failed", error=f"cannot create the log {log_path}: {exc.strerror}")
        return record
    with os.fdopen(log_fd, "wb") as log:
        try:
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        except OSError as exc:
            record.update(status="failed", error=f"cannot start rtkit: {exc}")
            return record
        try:
            while True:
                progress.show(round_no, peer.name)
                try:
                    proc.wait(timeout=1.0)
                    break
                except subprocess.TimeoutExpired:
                    if spec.timeout_s and time.monotonic() - t0 > spec.timeout_s:
                        timed_out = True
                        _kill_tree(proc, signal.SIGTERM, 15.0)
                        break
        except KeyboardInterrupt:
            interrupted = True
            _kill_tree(proc, signal.SIGINT, 15.0)
    record["bench_wall_s"] = round(time.monotonic() - t0, 3)
    record["exit_code"] = proc.returncode
    report = None
    report_path = os.path.join(run_dir, "report.json")
    try:
        with open(report_path) as fh:
            report = json.load(fh)
    except (OSError, ValueError) as exc:
        record["error"] = f"no readable report.json ({exc.__class__.__name__})"
    if report is not None:
        record["metrics"] = stats.metrics_from_report(report)
        steps = report.get("steps") or {}
        record["steps_count"] = steps.get("count")
        run = report.get("run") or {}
        record["report_status"] = run.get("status")
        if run.get("error"):
            record["error"] = run.get("error")
        record["settings"] = {k: v.get("value") for k, v in (run.get("settings") or {}).items()
                              if isinstance(v, dict)}
        record["child_env"] = run.get("child_env")
        record["notes"] = report.get("notes") or []
        hook = (steps.get("hook") or {}).get("status")
        if hook and hook != "ok":
            record["hook_status"] = hook
    if interrupted:
        record["status"] = "interrupted"
    elif timed_out:
        record["status"] = "timeout"
        record["error"] = f"ran past --timeout {spec.timeout_s:g} s"
    elif proc.returncode != 0 or report is None:
        record["status"] = "failed"
        if not record["error"]:
            record["error"] = _tail(log_path, 2) or f"exit code {proc.returncode}"
    else:
        record["status"] = "ok"
    if interrupted:
        raise _Interrupted(record)
    return record


class _Interrupted(Exception):
    def __init__(self, record: Dict[str, Any]):
        super().__init__("interrupted")
        self.record = record


def _result_line(rec: Dict[str, Any]) -> str:
    m = rec["metrics"]
    head = f"r{rec['round']} {rec['config']}: "
    if rec["status"] != "ok":
        return head + f"{rec['status'].upper()} (exit {rec['exit_code']}): {rec.get('error') or ''}  log {rec['log']}"
    parts = []
    if m.get("step_ms_median") is not None:
        parts.append(f"{m['step_ms_median']:.1f} ms/step")
    if m.get("peak_rss_bytes") is not None:
        parts.append(f"peak {m['peak_rss_bytes'] / (1 << 20):.0f} MiB")
    if m.get("minor_faults_per_step") is not None:
        parts.append(f"{m['minor_faults_per_step']:.0f} faults/step")
    if rec.get("steps_count") is not None:
        parts.append(f"{rec['steps_count']} steps")
    parts.append(f"{rec['bench_wall_s']:.1f} s")
    return head + "ok, " + ", ".join(parts)


def assemble(spec: BenchSpec, runs: List[Dict[str, Any]], order: List[List[str]], start_iso: str,
             t0: float, machine: Dict[str, Any], complete: bool) -> Dict[str, Any]:
    names = [p.name for p in spec.peers]
    summary = stats.summarize(runs, names, spec.baseline)
    notes = list(spec.notes) + [s["note"] for s in spec.skipped]
    if spec.baseline and summary["counts"].get(spec.baseline, {}).get("ok", 0) == 0 and runs:
        notes.append(f"baseline {spec.baseline} has no successful run: ratios are empty")
    if not complete:
        notes.append("the bench was interrupted: figures cover the runs that finished")
    return {
        "schema_version": 1,
        "title": spec.title,
        "command_line": spec.argv,
        "workload_command": spec.command,
        "rounds": spec.rounds,
        "baseline": spec.baseline,
        "complete": complete,
        "start_time": start_iso,
        "end_time": _now_iso(),
        "duration_s": round(time.monotonic() - t0, 3),
        "timeout_s": spec.timeout_s,
        "configs": [p.describe() for p in spec.peers],
        "configs_run": names,
        "libraries": spec.libraries,
        "skipped": spec.skipped,
        "order": order,
        "metrics": [{"key": k, "label": lbl, "unit": u, "lower_is_better": low} for k, lbl, u, low in stats.METRICS],
        "medians": summary["medians"],
        "spread": summary["spread"],
        "counts": summary["counts"],
        "ratios": summary["ratios"],
        "runs": runs,
        "machine": machine,
        "notes": notes,
    }


def write_outputs(spec: BenchSpec, bench: Dict[str, Any]) -> None:
    atomic.write_json(os.path.join(spec.out, "bench.json"), bench)
    atomic.write_text(os.path.join(spec.out, "bench.md"), output.render_markdown(bench))


def run_bench(spec: BenchSpec, stream: Optional[TextIO] = None) -> Dict[str, Any]:
    """Run every configuration for every round (rotated), write bench.json/bench.md after each run
    (so a crash or Ctrl-C leaves the figures so far), and return the bench dictionary. The key
    'interrupted' is True when the user stopped it."""
    os.makedirs(os.path.join(spec.out, "runs"), exist_ok=True)
    os.makedirs(os.path.join(spec.out, "logs"), exist_ok=True)
    names = [p.name for p in spec.peers]
    by_name = {p.name: p for p in spec.peers}
    order = stats.rotation(names, spec.rounds)
    progress = Progress(len(names) * spec.rounds, spec.rounds, stream=stream, enabled=spec.progress)
    machine = output.machine_info()
    base_env = dict(os.environ)
    start_iso, t0 = _now_iso(), time.monotonic()
    runs: List[Dict[str, Any]] = []
    complete = True
    try:
        for k, round_order in enumerate(order, start=1):
            for pos, name in enumerate(round_order):
                rec = run_one(spec, by_name[name], k, pos, progress, base_env)
                runs.append(rec)
                progress.finished(_result_line(rec))
                write_outputs(spec, assemble(spec, runs, order, start_iso, t0, machine, complete=False))
    except _Interrupted as stop:
        runs.append(stop.record)
        complete = False
    bench = assemble(spec, runs, order, start_iso, t0, machine, complete=complete)
    write_outputs(spec, bench)
    bench["interrupted"] = not complete
    return bench
