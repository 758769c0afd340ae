# terminal.py -- plain-text report tables for `rtkit report` and the end-of-run summary of `rtkit run`.
from __future__ import annotations

import os
import sys
import textwrap
from typing import Any, Dict, List, Optional

from rtkit.report import fmt
from rtkit.report.contract import Scheduler
from rtkit.report import sections as sec
from rtkit.report.fmt import get

WIDTH = 80
LABEL_MAX = 26


def use_colour(stream: Any = None) -> bool:
    stream = stream or sys.stdout
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _bold(text: str, colour: bool) -> str:
    return f"\033[1m{text}\033[0m" if colour else text


def kv_lines(rows: List[tuple], width: int = WIDTH) -> List[str]:
    """Label/value rows, labels padded to one column; long values wrap under the value column."""
    if not rows:
        return []
    lw = min(LABEL_MAX, max(len(r[0]) for r in rows))
    out = []
    for name, value in rows:
        avail = max(20, width - lw - 4)
        pieces = textwrap.wrap(str(value), avail, break_long_words=True, break_on_hyphens=False) or [""]
        if len(name) > lw:   # a long label gets its own line
            out.append(f"  {name}")
            name = ""
        out.append(f"  {name:<{lw}}  {pieces[0]}".rstrip())
        out.extend(f"  {'':<{lw}}  {p}" for p in pieces[1:])
    return out


def table_lines(t: sec.Table, width: int = WIDTH) -> List[str]:
    """A grid table fitted to `width`: the widest columns are cut with '...' when needed."""
    ncol = len(t.headers)
    cells = [list(t.headers)] + [[str(c) for c in r] + [""] * (ncol - len(r)) for r in t.rows]
    widths = [max(len(row[i]) for row in cells) for i in range(ncol)]
    sep = 2
    budget = width - 2 - sep * (ncol - 1)
    while sum(widths) > budget and max(widths) > 6:
        i = widths.index(max(widths))
        widths[i] -= 1
    numeric = t.numeric or [False] * ncol

    def cut(text: str, w: int) -> str:
        return text if len(text) <= w else text[: max(1, w - 3)] + "..."

    out = []
    if t.title:
        out.append(f"  {t.title}:")
    for ri, row in enumerate(cells):
        parts = []
        for i, c in enumerate(row):
            c = cut(c, widths[i])
            right = ri > 0 and i < len(numeric) and numeric[i] and not c.startswith("...")
            parts.append(c.rjust(widths[i]) if right else c.ljust(widths[i]))
        out.append(("  " + (" " * sep).join(parts)).rstrip())
        if ri == 0:
            out.append("  " + (" " * sep).join("-" * w for w in widths))
    return out


def section_lines(s: sec.Section, colour: bool = False, width: int = WIDTH) -> List[str]:
    if s.off:
        return [_bold(f"{s.title}:", colour) + f" {s.off}"]
    out = [_bold(s.title, colour), _bold("-" * len(s.title), colour)]
    out.extend(kv_lines(s.rows, width))
    for t in s.tables:
        out.append("")
        out.extend(table_lines(t, width))
    if s.notes:
        if s.rows or s.tables:
            out.append("")
        for n in s.notes:
            wrapped = textwrap.wrap(n, width - 4) or [""]
            out.append("  - " + wrapped[0])
            out.extend("    " + w for w in wrapped[1:])
    return out


def render(report: Dict[str, Any], colour: bool = False, width: int = WIDTH) -> str:
    """The whole report as plain text (ANSI bold section titles only when `colour`)."""
    lines: List[str] = []
    for s in sec.build_sections(report):
        if lines:
            lines.append("")
        lines.extend(section_lines(s, colour, width))
    return "\n".join(lines) + "\n"


def summary_lines(report: Dict[str, Any], report_path: Optional[str] = None) -> List[str]:
    """The short summary `rtkit run` prints on stderr at the end (4 to 8 lines, each 'rtkit: ...').
    The last line is `rtkit: report: <path>` (report_path, else run.run_dir/report.json)."""
    report = sec.normalize(report)
    run = report.get("run") or {}
    status = run.get("status") or "unknown"
    code = run.get("exit_code")
    head = f"rtkit: {status}"
    if code is not None:
        head += f" (exit {code}{', ' + run['signal'] if run.get('signal') else ''})"
    if run.get("duration_s") is not None:
        head += f" after {fmt.seconds(run.get('duration_s'))}"
    if run.get("error"):
        head += f": {run['error']}"
    lines = [head]
    count = get(report, "steps.count")
    summ = get(report, "steps.summary") or {}
    source = get(report, "steps.source") or "none"
    if count:
        text = f"rtkit: steps: {fmt.num(count)} ({source})"
        if summ.get("step_ms_median") is not None:
            text += (f", median {fmt.ms(summ.get('step_ms_median'))}, p95 {fmt.ms(summ.get('step_ms_p95'))}, "
                     f"{fmt.num(summ.get('steps_per_s'))} steps/s")
        lines.append(text)
    else:
        hook = get(report, "steps.hook") or {}
        why = hook.get("status") if isinstance(hook, dict) else None
        lines.append("rtkit: steps: none counted" + (f" (hooks: {why})" if why and why != "ok" else ""))
    mem = f"rtkit: peak RSS {fmt.nbytes(get(report, 'process.peak_rss_bytes'))}"
    fps = sec.faults_per_step(report)
    if fps is not None:
        mem += f", {fmt.num(fps)} minor faults/step"
    else:
        mem += f", {fmt.num(get(report, 'process.minor_faults'))} minor faults"
    cpu = sec.cpu_seconds(report)
    if cpu is not None:
        mem += f", CPU {fmt.seconds(cpu)}"
    lines.append(mem)
    alloc = report.get("allocator")
    if isinstance(alloc, dict):
        text = f"rtkit: allocator: {sec.allocator_state(alloc) or 'on'}"
        rate = sec.allocator_hit_rate(alloc)
        if rate is not None:
            text += f", hit rate {fmt.pct(rate)}"
        reserved = sec.plan_reserved(alloc)
        if fmt.is_num(reserved):
            text += f", {fmt.nbytes(reserved)} reserved"
        _, after = sec.allocator_faults(alloc)
        if fmt.is_num(after):
            text += f", {fmt.num(after)} faults/step after plan"
        lines.append(text)
    from rtkit.report.tier import summary_line as tier_line

    tier = tier_line(report)
    if tier:
        lines.append(tier)
    sched = report.get("scheduler")
    if isinstance(sched, dict):
        state = "on, pipelined" if get(sched, Scheduler.PIPELINE_ENABLED) else "on"
        text = f"rtkit: scheduler: {state}"
        chosen = sec.sched_chosen(sched)
        if isinstance(chosen, dict):
            text += ", " + ", ".join(f"{k}={v}" for k, v in chosen.items() if not isinstance(v, (dict, list)))
        sp = sec.sched_speedup(sched)
        if fmt.is_num(sp):
            text += f", speedup {fmt.ratio(sp)}"
        lines.append(text)
    notes = report.get("notes") or []
    if notes:
        lines.append(f"rtkit: {len(notes)} note(s), first: {sec._shorten(str(notes[0]), 100)}")
    path = report_path or (os.path.join(run["run_dir"], "report.json") if run.get("run_dir") else None)
    if path:
        lines.append(f"rtkit: report: {path}")
    return lines
