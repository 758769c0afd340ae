# census.py -- the wdl workload's recorded allocation census and the per-step replay pattern derived from it.
"""The allocator writes a census into every run directory (allocator-<pid>.json): whole-run counts and bytes per
power-of-two size bucket, a per-step ring (allocations, bytes, live bytes) and the plan's classes (the sizes that
recur every step at or above malloc_min_size, with how many blocks of each are live together).

`record()` makes two real runs of the bundled wdl workload under `rtkit run` that differ only in their number of
steps and keeps those parts of their census files (rtkit/bench/wdl_census.json is one such record). `pattern()`
turns a record into the rows the C replay program (allocators/bench/scaling_replay.c) allocates every step:

- sizes below min_size: the difference of the two runs' bucket counts and bytes over the difference of their steps,
  so the start-up allocations (imports, graph building) that both runs share cancel; the size is the bucket's mean;
- sizes at or above min_size: the plan's classes, as many blocks as the planner saw live together, freed within
  the step (the step's large tensors);
- lifetimes: the live bytes the steady steps add (the long run's per-step ring, before the plan is installed) are
  long-lived blocks (hash-table nodes for new ids) taken from the 16..63-byte buckets; every other block is freed
  within its step."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from rtkit.report import alloc_steps

BUNDLED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wdl_census.json")
RECORD_STEPS = (6, 30)  # the longer run passes profile_start + profile_max (22): it always has a plan
RECORD_WORKLOAD = ["wdl", "--batch", "2048", "--rows", "40000", "--no-progress"]
# the buckets whose blocks are the workload's long-lived ones: hash nodes of new ids are 16 to 32 bytes
LONG_LIVED_BUCKETS = (16, 32)
STEP, LONG = 0, 1   # a row's lifetime: freed within its step, or long-lived


class CensusError(ValueError):
    """A census record that cannot be used; the message is the one line shown to the user."""


def _excerpt(stats: Dict[str, Any]) -> Dict[str, Any]:
    plan = stats.get("plan") or {}
    return {"steps": stats.get("steps"), "state": stats.get("state"),
            "min_size_bytes": (stats.get("config") or {}).get("malloc_min_size"),
            "size_classes": stats.get("size_classes") or [], "per_step": stats.get("per_step") or [],
            "plan_classes": [{"size_bytes": c["size_bytes"], "blocks": c["blocks"]} for c in plan.get("classes") or []],
            "plan_made_at_step": plan.get("made_at_step")}


def record(work_dir: str, rtkit_cmd: Sequence[str], python: str = sys.executable) -> Dict[str, Any]:
    """Two real wdl runs under `rtkit run` (RECORD_STEPS steps each); returns the census record."""
    runs = []
    for steps in RECORD_STEPS:
        run_dir = os.path.join(work_dir, f"census-{steps}")
        cmd = [*rtkit_cmd, "run", "--run-dir", run_dir, "--", python, "-m", "rtkit.workloads",
               *RECORD_WORKLOAD, "--steps", str(steps)]
        with open(os.path.join(work_dir, f"census-{steps}.log"), "wb") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
        files = glob.glob(os.path.join(run_dir, "allocator-*.json"))
        if rc != 0 or not files:
            raise CensusError(f"the census run of {steps} steps failed (exit {rc}): see {run_dir}")
        # the workload's own process is the one that ran the steps
        stats = max((alloc_steps.load_file(f) for f in files), key=lambda s: s.get("steps") or 0)
        runs.append(_excerpt(stats))
    return {"schema_version": 1, "workload": ["python", "-m", "rtkit.workloads", *RECORD_WORKLOAD],
            "steps": list(RECORD_STEPS), "runs": runs}


def load(path: Optional[str] = None) -> Dict[str, Any]:
    path = path or BUNDLED
    try:
        with open(path) as fh:
            rec = json.load(fh)
    except (OSError, ValueError) as exc:
        raise CensusError(f"--census {path}: cannot read it ({exc.__class__.__name__}: {exc})") from None
    runs = rec.get("runs") if isinstance(rec, dict) else None
    if not isinstance(runs, list) or len(runs) != 2 or not all(isinstance(r, dict) for r in runs):
        raise CensusError(f"--census {path}: expected a record of two runs (python -m rtkit.bench.scaling "
                          "--record-census PATH writes one)")
    return rec


def _long_lived_bytes_per_step(run: Dict[str, Any]) -> float:
    """Mean live bytes the steady steps add: the per-step ring from step 2 (after the first steps' warm-up
    allocations) up to the step the plan was installed at (its arenas are live bytes too)."""
    per = sorted((e for e in run["per_step"] if isinstance(e.get("live_bytes"), (int, float))),
                 key=lambda e: e["step"])
    end = run.get("plan_made_at_step")
    steady = [e for e in per if e["step"] >= 2 and (end is None or e["step"] < end)]
    if len(steady) < 2:
        return 0.0
    return max(0.0, (steady[-1]["live_bytes"] - steady[0]["live_bytes"]) / (len(steady) - 1))


def pattern(rec: Dict[str, Any]) -> List[Tuple[int, float, int]]:
    """[(size_bytes, blocks_per_step, lifetime)] of one thread's step, from a census record."""
    short, long_ = sorted(rec["runs"], key=lambda r: r.get("steps") or 0)
    dsteps = (long_.get("steps") or 0) - (short.get("steps") or 0)
    if dsteps <= 0:
        raise CensusError("census record: its two runs must differ in their number of steps")
    if not long_["plan_classes"]:
        raise CensusError("census record: the longer run has no plan (it must run past the allocator's profiling)")
    min_size = long_.get("min_size_bytes") or 32768
    before = {c["bucket_bytes"]: c for c in short["size_classes"]}
    small: Dict[int, Tuple[int, float]] = {}   # bucket -> (mean size, blocks a step)
    for c in long_["size_classes"]:
        b = c["bucket_bytes"]
        if b >= min_size:
            continue
        o = before.get(b, {"count": 0, "bytes": 0})
        dcount, dbytes = c["count"] - o["count"], c["bytes"] - o["bytes"]
        if dcount <= 0 or dbytes <= 0:
            continue  # a bucket only start-up uses (sampling noise can make it negative)
        size = min(max(int(round(dbytes / dcount)), b), 2 * b - 1)
        small[b] = (size, dcount / dsteps)
    rows: List[Tuple[int, float, int]] = []
    long_bytes = _long_lived_bytes_per_step(long_)
    pool = sum(small[b][0] * small[b][1] for b in LONG_LIVED_BUCKETS if b in small)
    share = min(1.0, long_bytes / pool) if pool else 0.0
    for b in sorted(small):
        size, count = small[b]
        kept = count * share if b in LONG_LIVED_BUCKETS else 0.0
        if kept > 0:
            rows.append((size, kept, LONG))
        if count - kept > 0:
            rows.append((size, count - kept, STEP))
    for c in long_["plan_classes"]:
        rows.append((int(c["size_bytes"]), float(c["blocks"]), STEP))
    return rows


def scaled(rows: Sequence[Tuple[int, float, int]], scale: float) -> List[Tuple[int, int, int]]:
    """Rows with whole block counts at `scale` of the census; a row never drops below one block, so every size
    and lifetime of the census stays in the pattern at any scale."""
    return [(size, max(1, int(round(count * scale))), kind) for size, count, kind in rows]


def write_pattern(path: str, rows: Sequence[Tuple[int, int, int]], source: str) -> None:
    with open(path, "w") as fh:
        fh.write(f"# scaling_replay pattern from {source}: SIZE COUNT KIND (0 freed in its step, 1 long-lived)\n")
        for size, count, kind in rows:
            fh.write(f"{size} {count} {kind}\n")


def summary(rows: Sequence[Tuple[int, float, int]]) -> Dict[str, float]:
    """Blocks and bytes a step, and of them the long-lived ones (for the table's heading)."""
    return {"blocks": sum(c for _, c, _ in rows), "bytes": sum(s * c for s, c, _ in rows),
            "long_lived_blocks": sum(c for _, c, k in rows if k == LONG)}
