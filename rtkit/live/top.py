# top.py -- `rtkit top RUN_DIR`: a terminal view of a running job (or a cluster folder) that redraws until q.
"""Reads the run directory's live.json (report.json once the job has ended) with the report loader, so a
folder that is not rtkit's, or a snapshot that is not valid JSON, is one line and exit 2 before the screen is
touched. Every figure is named from report/glossary.py. The screen is plain ANSI: home, clear, the frame;
the keyboard is read in cbreak mode (q quits). Without a terminal one frame is printed and it exits."""
from __future__ import annotations

import os
import select
import shutil
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from rtkit.report import glossary as G
from rtkit.report import load as L

SINGLE = ("steps", "live_steps_per_s", "live_step_ms_median", "live_step_ms_p95", "rss_now_bytes",
          "live_faults_per_step", "major_faults_now", "allocator_state", "allocator_plan", "hit_rate_now",
          "tier_bytes_now", "pool_resident_now_bytes", "sched_chosen", "pipelined_steps", "tuning_gain_pct")
# a finished job's report has no live figures: its whole-run figures take their place
FINISHED = {"live_steps_per_s": "steps_per_s", "live_step_ms_median": "step_ms_median",
            "live_step_ms_p95": "step_ms_p95", "rss_now_bytes": "peak_rss_bytes",
            "live_faults_per_step": "faults_per_step_median", "major_faults_now": "major_faults",
            "pool_resident_now_bytes": "tier_peak_bytes", "hit_rate_now": "hit_rate", "tier_bytes_now": "tier_bytes"}
# one line per task of a cluster folder: (glossary id, column title)
TASK_COLUMNS = (("steps", "steps"), ("live_steps_per_s", "steps/s"), ("live_step_ms_median", "median ms"),
                ("live_step_ms_p95", "p95 ms"), ("rss_now_bytes", "RSS"), ("live_faults_per_step", "faults/step"),
                ("allocator_state", "allocator"))
RUN_FILES = ("report.json", L.LIVE_FILE)


def _is_run_dir(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, f)) for f in RUN_FILES)


def task_dirs(path: str) -> Optional[List[str]]:
    """The task run directories of a cluster folder (rtkit launch output), or None when `path` is not one."""
    if not os.path.isdir(path) or _is_run_dir(path):
        return None
    from rtkit.cluster.merge import is_cluster_dir

    try:
        subs = sorted(e.path for e in os.scandir(path) if e.is_dir(follow_symlinks=False))
    except OSError:
        return None
    tasks = [s for s in subs if _is_run_dir(s)]
    return tasks if tasks or is_cluster_dir(path) else None


def state_words(report: Dict[str, Any]) -> str:
    as_of = L.running_since(report)
    if as_of:
        return f"running, as of {as_of}"
    run = report.get("run") or {}
    return f"finished: {run.get('status')} (exit {run.get('exit_code')})"


def figure_ids(report: Dict[str, Any], ids) -> List[str]:
    return list(ids) if L.running_since(report) else [FINISHED.get(fid, fid) for fid in ids]


def single_frame(report: Dict[str, Any]) -> List[str]:
    run = report.get("run") or {}
    lines = [f"rtkit top  {run.get('name') or ''}  {state_words(report)}   (q quits)", ""]
    rows = [(G.name(fid), G.text(report, fid)) for fid in figure_ids(report, SINGLE)]
    width = max(len(n) for n, _ in rows)
    lines += [f"  {n:<{width}}  {v}" for n, v in rows]
    return lines


def cluster_frame(path: str, tasks: List[str]) -> List[str]:
    lines = [f"rtkit top  {os.path.basename(os.path.abspath(path))}  {len(tasks)} task run(s)   (q quits)", ""]
    table = [["task", "state"] + [title for _, title in TASK_COLUMNS]]
    for t in tasks:
        try:
            report, _ = L.load(t)
        except L.ReportError as exc:
            table.append([os.path.basename(t), str(exc)[:60]])
            continue
        state = "running" if L.running_since(report) else str((report.get("run") or {}).get("status"))
        ids = figure_ids(report, [fid for fid, _ in TASK_COLUMNS])
        table.append([os.path.basename(t), state] + [G.text(report, fid) for fid in ids])
    widths = [max(len(r[i]) for r in table if i < len(r)) for i in range(len(table[0]))]
    for r in table:
        lines.append("  " + "  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip())
    return lines


def frame(path: str) -> List[str]:
    """One screen of the view; ReportError (one line, exit 2) when `path` is not a run or a cluster folder."""
    tasks = task_dirs(path)
    if tasks is not None:
        return cluster_frame(path, tasks)
    report, _ = L.load(path)
    return single_frame(report)


def _keys_pressed(timeout: float) -> str:
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    return os.read(sys.stdin.fileno(), 64).decode(errors="replace") if ready else ""


def _draw(lines: List[str], size: Tuple[int, int]) -> None:
    cols, rows = size
    text = "\n".join(line[:cols] for line in lines[:rows])
    sys.stdout.write("\033[H\033[2J" + text + "\n")
    sys.stdout.flush()


def run(path: str, interval: float, once: bool = False) -> int:
    lines = frame(path)   # bad input is said before the screen is taken
    interactive = not once and sys.stdin.isatty() and sys.stdout.isatty()
    if not interactive:
        sys.stdout.write("\n".join(lines) + "\n")
        return 0
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        sys.stdout.write("\033[?25l")   # hide the cursor while the view owns the screen
        while True:
            _draw(lines, shutil.get_terminal_size((80, 24)))
            deadline = time.monotonic() + interval
            while (left := deadline - time.monotonic()) > 0:
                if "q" in _keys_pressed(left).lower():
                    return 0
            try:
                lines = frame(path)
            except L.ReportError as exc:   # a moment between files: keep the last frame, say why
                lines = lines[:1] + [f"  (not refreshed: {exc})"] + lines[2:]
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        sys.stdout.write("\033[?25h\n")
        sys.stdout.flush()
