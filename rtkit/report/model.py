# model.py -- the report model: assembles report.json from the parent's samples and the child's files.
"""Schema (version 3) is documented in docs/report.md. Reading a finished report is rtkit/report/load.py's job."""
from __future__ import annotations

import glob
import json
import os
import platform
import re
import statistics
from typing import Any, Dict, List, Optional, Tuple

from rtkit import step_records
from rtkit.report import alloc_steps
from rtkit.report.keras_epochs import keras_summary

SCHEMA_VERSION = 3
REPORT_FILE = "report.json"
COMPONENT_SECTIONS = ("allocator", "pmem", "scheduler", "rows")
BOOTSTRAP_MARKER = "bootstrap-loaded"  # made by the child's bootstrap (rtkit/bootstrap/sitecustomize.py) when it runs


def read_child_files(run_dir: str, prefix: str) -> List[Tuple[int, Dict[str, Any]]]:
    """All `<prefix>-<pid>.json` files of a run directory, parsed; unreadable ones are skipped."""
    out = []
    for path in glob.glob(os.path.join(run_dir, f"{prefix}-*.json")):
        m = re.search(r"-(\d+)\.json$", path)
        if not m:
            continue
        try:
            with open(path) as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            continue
        if prefix == "allocator":   # its per-step records are appended to files of their own
            data = alloc_steps.attach(run_dir, int(m.group(1)), data)
        elif prefix == "steps":
            data = step_records.attach(run_dir, int(m.group(1)), data)
        out.append((int(m.group(1)), data))
    return out


def percentile(values: List[float], q: float) -> Optional[float]:
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def step_summary(per_step: List[dict], warmup: int) -> Dict[str, Any]:
    measured = per_step[warmup:] if len(per_step) > warmup else []
    times = [s["step_ms"] for s in measured]
    faults = [s["minor_faults"] for s in measured if s.get("minor_faults") is not None]
    if not times:
        return {"measured_steps": 0, "step_ms_median": None, "step_ms_p5": None, "step_ms_p95": None,
                "step_ms_mean": None, "steps_per_s": None, "minor_faults_per_step_median": None}
    median = statistics.median(times)
    return {
        "measured_steps": len(times),
        "step_ms_median": round(median, 3),
        "step_ms_p5": round(percentile(times, 0.05), 3),
        "step_ms_p95": round(percentile(times, 0.95), 3),
        "step_ms_mean": round(statistics.fmean(times), 3),
        "steps_per_s": round(1000.0 / median, 3) if median > 0 else None,
        "minor_faults_per_step_median": statistics.median(faults) if faults else None,
    }


def steps_section(run_dir: str, start: float, warmup: int, child_pid: Optional[int],
                  hooks_on: bool = True) -> Tuple[Dict[str, Any], List[str]]:
    """Pick the process whose hooks saw the most steps (the training process) and summarise them."""
    notes: List[str] = []
    files = read_child_files(run_dir, "steps")
    empty = {"count": 0, "source": "none", "signature": None, "pid": None, "warmup_steps": warmup, "per_step": [],
             "summary": step_summary([], warmup), "other_signatures": [],
             "hook": {"status": "not_loaded", "detail": "no Python process under rtkit loaded the bootstrap",
                      "tensorflow_version": None}}
    if not files:
        if not hooks_on:
            empty["hook"] = {"status": "off", "tensorflow_version": None,
                             "detail": "hooks off (RTKIT_HOOKS=0): rtkit's bootstrap was not given to the command"}
        elif os.path.exists(os.path.join(run_dir, BOOTSTRAP_MARKER)):
            empty["hook"] = {"status": "no_tensorflow", "tensorflow_version": None,
                             "detail": "the bootstrap loaded; TensorFlow was never imported, so there was nothing to hook"}
        return empty, notes
    pid, data = max(files, key=lambda item: (len(item[1].get("per_step", [])), item[0] == child_pid))
    per_step = []
    for i, rec in enumerate(data.get("per_step", [])):
        per_step.append({"step": i + 1, "t_s": round(rec["t_unix"] - start, 4), "step_ms": rec["step_ms"],
                         "minor_faults": rec.get("minor_faults"), "rss_bytes": rec.get("rss_bytes")})
    hook = data.get("hook") or {}
    if hook.get("status") not in (None, "ok"):
        notes.append(f"step hooks: {hook.get('status')}: {hook.get('detail')}")
    if data.get("truncated_steps"):
        notes.append(f"step records capped: the first {data['truncated_steps']} steps are counted but not kept")
    count = int(data.get("count", len(per_step)))
    out = {
        "count": count, "source": data.get("source", "none"), "api": data.get("api"),
        "signature": data.get("signature"), "pid": pid,
        "warmup_steps": warmup, "per_step": per_step, "summary": step_summary(per_step, warmup),
        "hook": {"status": hook.get("status", "ok"), "detail": hook.get("detail"),
                 "tensorflow_version": hook.get("tensorflow_version")},
        "other_signatures": data.get("other_signatures", []),
        "no_step_reason": data.get("no_step_reason"),
        "first_told_step": data.get("first_told_step"),
    }
    keras = data.get("keras_summary")   # written by the process over all its epochs; older files have the list
    keras = dict(keras) if isinstance(keras, dict) and keras.get("epochs") else keras_summary(data.get("keras_epochs") or [])
    if keras:
        if isinstance(data.get("keras_fit_calls"), int):   # several fits (several models) share one step median
            keras["fit_calls"] = data["keras_fit_calls"]
        out["keras"] = keras
    return out, notes + list(data.get("notes", []))


def component_section(run_dir: str, prefix: str, preferred_pid: Optional[int]) -> Optional[Dict[str, Any]]:
    files = read_child_files(run_dir, prefix)
    if not files:
        return None
    for pid, data in files:
        if pid == preferred_pid:
            return data
    # otherwise the process that did the most work (most steps, then largest file)
    return max(files, key=lambda item: (item[1].get("steps", 0) if isinstance(item[1], dict) else 0,
                                        len(json.dumps(item[1]))))[1]


def run_files_written(run_dir: str) -> Optional[int]:
    """Bytes the child's processes wrote to rtkit's own run files (steps-, allocator-, pmem-<pid>.json and the files
    written before them: each carries the bytes its process had written before it, and the last of each is on disk),
    so that the child's disk writes can be told apart from the pool's. None when no file says so (an older rtkit)."""
    total, told = 0, False
    for prefix, last_too in (("steps", ("steps",)), ("allocator", ("allocator", "pmem"))):
        for pid, data in read_child_files(run_dir, prefix):
            before = data.get("run_files_written_bytes") if isinstance(data, dict) else None
            if not isinstance(before, int):
                continue
            told = True
            total += before
            for name in last_too:   # the files written after the count was taken: the last of each, on disk now
                try:   # in whole pages, as the counts
                    total += -(-os.path.getsize(os.path.join(run_dir, f"{name}-{pid}.json")) // 4096) * 4096
                except OSError:
                    pass
    return total if told else None


def process_section(samples: List[dict], rusage: Optional[dict], interval_ms: int) -> Dict[str, Any]:
    peak_sampled = max((s["rss_bytes"] for s in samples), default=0)
    last = samples[-1] if samples else {}
    section = {
        "sample_interval_ms": interval_ms,
        "samples": samples,
        "peak_rss_bytes": peak_sampled,
        "minor_faults": last.get("minor_faults", 0),
        "major_faults": last.get("major_faults", 0),
        "cpu_user_s": last.get("cpu_user_s", 0.0),
        "cpu_system_s": last.get("cpu_system_s", 0.0),
        "max_threads": max((s["threads"] for s in samples), default=0),
    }
    if rusage:
        # wait4's figures include every waited-for descendant and the last moments the sampler missed
        section["peak_rss_bytes"] = max(peak_sampled, rusage["max_rss_bytes"])
        section["minor_faults"] = max(section["minor_faults"], rusage["minor_faults"])
        section["major_faults"] = max(section["major_faults"], rusage["major_faults"])
        section["cpu_user_s"] = max(section["cpu_user_s"], rusage["cpu_user_s"])
        section["cpu_system_s"] = max(section["cpu_system_s"], rusage["cpu_system_s"])
        if rusage.get("io"):
            # the child's own disk traffic: written = dirtied minus what was dropped before reaching the disk
            io = rusage["io"]
            section["disk_read_bytes"] = io["read_bytes"]
            section["disk_written_bytes"] = max(0, io["write_bytes"] - io["cancelled_write_bytes"])
            section["disk_cancelled_bytes"] = io["cancelled_write_bytes"]
    return section


def versions(tf_version: Optional[str]) -> Dict[str, Any]:
    from rtkit import __version__

    return {"rtkit": __version__, "python": platform.python_version(), "tensorflow": tf_version,
            "platform": platform.platform()}


def host_info() -> Dict[str, Any]:
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        mem = None
    return {"cpus": os.cpu_count(), "memory_bytes": mem}
