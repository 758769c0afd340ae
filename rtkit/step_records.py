# step_records.py -- the training step's per-step records, appended once each to steps-<pid>.records.jsonl.
"""The steps file (steps-<pid>.json) is rewritten whole at every flush; its per-step records, rewritten with it, made
it grow with the run (95 bytes a step, every 5 s: a 100,000-step job rewrote ~9.5 MB each time). The records now go
to a file of their own, each appended once; the steps file names it and says how many it has. The file starts with a
header naming the signature the records are of: when the training step's signature changes (a better one found),
the file is made afresh with that signature's records. A torn last line (a process killed while it appended) is
skipped by the reader. Runs in the child: imports nothing of rtkit but atomic."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence

from rtkit import atomic

FIELDS = ("t_unix", "step_ms", "minor_faults", "rss_bytes")


def file_name(pid: int) -> str:
    return f"steps-{pid}.records.jsonl"


def _line(r: Sequence[Any]) -> str:
    return json.dumps([round(r[0], 6), round(r[1], 4), r[2], r[3]]) + "\n"


class Appender:
    """Writes a signature's records (tuples t_unix, step_ms, faults, rss; a list that only grows) to the file: the
    ones not written yet, or all of them to a fresh file when the signature changed or the file is not the one this
    process made (a file put in its place is never appended to)."""

    def __init__(self) -> None:
        self.signature: Optional[str] = None
        self.written = 0
        self.ident: Optional[tuple] = None

    def write(self, run_dir: str, signature: str, records: List[Sequence[Any]]) -> int:
        path = os.path.join(run_dir, file_name(os.getpid()))
        end = len(records)   # others may append meanwhile: those go at the next write
        if signature == self.signature and self.written <= end and self._append(path, records, end):
            return self.written
        with atomic.replacing(path) as fh:
            fh.write(json.dumps({"signature": signature, "fields": list(FIELDS)}) + "\n")
            fh.writelines(_line(r) for r in records[:end])
        st = os.lstat(path)
        self.signature, self.written, self.ident = signature, end, (st.st_dev, st.st_ino)
        return end

    def _append(self, path: str, records: List[Sequence[Any]], end: int) -> bool:
        if end == self.written:
            return True
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != self.ident:
                return False
            text = "".join(_line(r) for r in records[self.written:end])
            fh.write(text)
        atomic.count_appended(st.st_size, st.st_size + len(text))
        self.written = end
        return True


def read(run_dir: str, pid: int, signature: Optional[str]) -> List[Dict[str, Any]]:
    """The records of process `pid` in the file, as dicts under FIELDS' names; none when they are of another
    signature than `signature` (the steps file's)."""
    try:
        with open(os.path.join(run_dir, file_name(pid))) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    out: List[Dict[str, Any]] = []
    fields: List[str] = []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except ValueError:
            if i == 0:
                return []
            continue
        if i == 0:
            if not isinstance(row, dict) or row.get("signature") != signature:
                return []
            fields = [str(f) for f in row.get("fields") or FIELDS]
        elif isinstance(row, list) and len(row) == len(fields):
            out.append(dict(zip(fields, row)))
    return out


def attach(run_dir: str, pid: int, data: Any) -> Any:
    """A steps file's dict with its `per_step` list filled in from the records file (a file that carries its own
    list, as rtkit before 2026-12-06 wrote it, is left as it is)."""
    if isinstance(data, dict) and "per_step" not in data and "per_step_file" in data:
        data["per_step"] = read(run_dir, pid, data.get("signature"))
    return data
