# alloc_steps.py -- the allocator's per-step records, appended to allocator-<pid>.steps.<0|1>.jsonl (stats_steps.c).
"""The allocator rewrites allocator-<pid>.json whole every period; its per-step records are written once each, to two
files that take turns by chunks of `per_step_kept` steps. Reading both gives the latest `per_step_kept` records (a torn
last line, from a process killed while it appended, is skipped)."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List

KEPT = 2000   # RTK_RING_STEPS: what the allocator's own ring keeps, and the files at least


def read(run_dir: str, pid: int, kept: int = KEPT) -> List[Dict[str, Any]]:
    """The latest `kept` step records of process `pid`, oldest first, as dicts under the fields' names."""
    records: Dict[int, Dict[str, Any]] = {}
    for k in (0, 1):
        try:
            with open(os.path.join(run_dir, f"allocator-{pid}.steps.{k}.jsonl")) as fh:
                lines = fh.read().splitlines()
        except OSError:
            continue
        fields: List[str] = []
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                fields = [str(f) for f in row.get("fields") or []]
            elif isinstance(row, list) and fields and len(row) == len(fields):
                rec = dict(zip(fields, row))
                if isinstance(rec.get("step"), int):
                    records[rec["step"]] = rec
    return [records[s] for s in sorted(records)[-kept:]]


def attach(run_dir: str, pid: int, data: Any) -> Any:
    """An allocator file's dict with its `per_step` list filled in from the step files (a file that carries its own
    list, as rtkit before 2026-12-06 wrote it, is left as it is)."""
    if isinstance(data, dict) and "per_step" not in data and "per_step_files" in data:
        kept = data.get("per_step_kept") if isinstance(data.get("per_step_kept"), int) else KEPT
        data["per_step"] = read(run_dir, pid, kept)
    return data


def load_file(path: str) -> Any:
    """allocator-<pid>.json at `path`, parsed, with its per-step records (raises OSError or ValueError as json does)."""
    import re

    with open(path) as fh:
        data = json.load(fh)
    m = re.search(r"allocator-(\d+)\.json$", path)
    return attach(os.path.dirname(path), int(m.group(1)), data) if m else data
