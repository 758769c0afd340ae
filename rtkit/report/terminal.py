# terminal.py -- plain-text report tables for `rtkit report` (the end-of-run summary of `rtkit run` is summary.py's).
from __future__ import annotations

import os
import shutil
import sys
import textwrap
from typing import Any, Dict, List, Optional

from rtkit.report import sections as sec

WIDTH = 80
LABEL_MAX = 36


def use_colour(stream: Any = None) -> bool:
    stream = stream or sys.stdout
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def width_for(stream: Any = None, width: Optional[int] = None) -> int:
    """Columns to fit the text in: `width` (--width), else COLUMNS, else the terminal's width when `stream` is
    a terminal, else WIDTH (a pipe or a file gets the same text on every machine); never below 60."""
    if width:
        return max(60, int(width))
    cols = os.environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return max(60, int(cols))
    try:
        tty = (stream or sys.stdout).isatty()
    except (AttributeError, ValueError):
        tty = False
    return max(60, shutil.get_terminal_size((WIDTH, 24)).columns) if tty else WIDTH


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

