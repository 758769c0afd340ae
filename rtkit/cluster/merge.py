# merge.py -- one report for a cluster folder: a row per task run, restarts, stragglers, cluster throughput over time.
"""Reads each task directory's small ``task.json`` (falling back to ``report.json``'s cluster section for
directories without one) and the launcher's ``cluster.json`` when there is one. Never imports TensorFlow.

Stragglers: a training task (chief or worker, its latest run) whose median step time exceeds the median
of all training tasks' medians by more than ``margin`` (default 25%).
"""
from __future__ import annotations

import json
import os
import re
import statistics
from typing import Any, Dict, List, Optional

from rtkit.cluster.launcher import CLUSTER_FILE
from rtkit.cluster.taskdir import FOLLOWER_SIGNATURE, TASK_FILE

STRAGGLER_MARGIN = 0.25
ROLE_ORDER = {"chief": 0, "worker": 1, "ps": 2, "evaluator": 3}
TRAINING = ("chief", "worker")


def _trains(t: Dict[str, Any]) -> bool:
    """Whether a task's steps are the job's own training steps (not a PS's, nor a serving TF2 worker's, which
    mirror the coordinator's: counted once, there)."""
    return t["role"] in TRAINING and t.get("step_signature") != FOLLOWER_SIGNATURE
TIMELINE_BINS = 60


def _read_json(path: str) -> Optional[Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def is_cluster_dir(path: str) -> bool:
    """A folder of task run directories (not a run directory itself)."""
    if not os.path.isdir(path) or os.path.isfile(os.path.join(path, "report.json")):
        return False
    if os.path.isfile(os.path.join(path, CLUSTER_FILE)):
        return True
    try:
        with os.scandir(path) as it:
            return any(e.is_dir() and os.path.isfile(os.path.join(e.path, TASK_FILE)) for e in it)
    except OSError:
        return False


def _from_report(report: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """A task record from a full report (a run killed before task.json, or an older layout)."""
    c = report.get("cluster")
    if not isinstance(c, dict):
        return None
    run, steps, proc = report.get("run", {}), report.get("steps", {}), report.get("process", {})
    stats = steps.get("summary", {})
    return {**c, "status": run.get("status"), "exit_code": run.get("exit_code"), "signal": run.get("signal"),
            "duration_s": run.get("duration_s"), "steps": steps.get("count", 0), "step_signature": steps.get("signature"),
            "step_ms_median": stats.get("step_ms_median"), "steps_per_s": stats.get("steps_per_s"),
            "minor_faults_per_step": stats.get("minor_faults_per_step_median"),
            "peak_rss_bytes": proc.get("peak_rss_bytes"), "allocator_state": None,
            "start_unix": None, "steps_timeline": [], "rss_timeline": []}


_DIR_RE = re.compile(r"^(chief|worker|ps|evaluator)-(\d+)(?:\.restart(\d+))?$")


def _unreported(name: str) -> Optional[Dict[str, Any]]:
    m = _DIR_RE.match(name)
    if not m:
        return None
    return {"role": m.group(1), "index": int(m.group(2)), "attempt": int(m.group(3) or 0), "status": "no report",
            "exit_code": None, "signal": None, "steps": 0, "step_ms_median": None, "steps_per_s": None,
            "peak_rss_bytes": None, "minor_faults_per_step": None, "allocator_state": None, "start_unix": None,
            "steps_timeline": [], "rss_timeline": []}


def load_tasks(path: str) -> List[Dict[str, Any]]:
    tasks = []
    with os.scandir(path) as it:
        entries = [e for e in it if e.is_dir()]
    for e in entries:
        rec = _read_json(os.path.join(e.path, TASK_FILE))
        if not isinstance(rec, dict):
            report = _read_json(os.path.join(e.path, "report.json"))
            rec = _from_report(report) if isinstance(report, dict) else None
        if not isinstance(rec, dict):
            rec = _unreported(e.name)   # its `rtkit run` died before writing anything: still a row
        if not isinstance(rec, dict) or "role" not in rec:
            continue
        rec["dir"] = e.name
        tasks.append(rec)
    tasks.sort(key=lambda t: (ROLE_ORDER.get(t["role"], 9), t.get("index", 0), t.get("attempt", 0)))
    return tasks


def _timeline(tasks: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Cluster steps/s over time: every training task's step completions, binned on one clock. The
    timelines are thinned, so each gap's steps count at its end time (exact for the totals)."""
    series = []
    for t in tasks:
        pts = t.get("steps_timeline") or []
        if _trains(t) and t.get("start_unix") is not None and pts:
            series.append((t["start_unix"], pts))
    if not series:
        return {"t0_unix": None, "bin_s": None, "points": []}
    t0 = min(start + pts[0][0] for start, pts in series)
    t1 = max(start + pts[-1][0] for start, pts in series)
    bin_s = max((t1 - t0) / TIMELINE_BINS, 1.0)
    bins = [0] * (int((t1 - t0) / bin_s) + 1)
    total = 0
    for start, pts in series:
        prev = 0
        for ts, n in pts:
            if n > prev:
                bins[int((start + ts - t0) / bin_s)] += int(n) - prev
                prev = int(n)
        total += prev
    return {"t0_unix": round(t0, 3), "bin_s": round(bin_s, 3),
            "points": [[round((i + 0.5) * bin_s, 3), round(c / bin_s, 3)] for i, c in enumerate(bins)],
            "first_step_unix": t0, "last_step_unix": t1, "steps": total}


def _ps_memory(tasks: List[Dict[str, Any]], latest: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Each PS's memory by table: the chief's latest record of the PS tables (rtkit/hooks/ps_tables.py) set
    against the PS's own peak RSS (its latest run)."""
    docs = [t["ps_tables"] for t in tasks if t["role"] in TRAINING and isinstance(t.get("ps_tables"), dict)]
    if not docs:
        return {}
    doc = max(docs, key=lambda d: d.get("written_unix") or 0)
    out = {}
    for idx, objs in sorted(doc.get("ps", {}).items(), key=lambda kv: int(kv[0])):
        objs = [o for o in objs if isinstance(o, dict)]
        total = sum(o.get("bytes") or 0 for o in objs)
        rss = (latest.get(f"ps-{idx}") or {}).get("peak_rss_bytes")
        out[f"ps-{idx}"] = {
            "tables_bytes": total,
            "estimated_bytes": sum(o.get("bytes") or 0 for o in objs if o.get("estimate")),
            "unknown": sum(1 for o in objs if o.get("bytes") is None),
            "peak_rss_bytes": rss, "share_of_peak_rss": round(total / rss, 4) if rss else None,
            "tables": objs}
    return {"by_ps": out, "written_unix": doc.get("written_unix"), "source": doc.get("source"),
            "method": doc.get("method"), "note": doc.get("note")}


def merge(path: str, margin: float = STRAGGLER_MARGIN) -> Dict[str, Any]:
    """The merged cluster report of folder `path` (a dict; see docs/cluster.md)."""
    launch = _read_json(os.path.join(path, CLUSTER_FILE))
    launch = launch if isinstance(launch, dict) else {}
    eps = launch.get("examples_per_step")
    tasks = load_tasks(path)
    stopped = {e.get("task") for e in launch.get("events", []) if e.get("event") == "stop"}
    latest: Dict[str, Dict[str, Any]] = {}
    for t in tasks:
        name = f"{t['role']}-{t.get('index', 0)}"
        if name not in latest or t.get("attempt", 0) >= latest[name].get("attempt", 0):
            latest[name] = t
    rows = []
    for t in tasks:
        name = f"{t['role']}-{t.get('index', 0)}"
        status = t.get("status")
        if name in stopped and t is latest[name] and status in ("interrupted", "killed", "no report"):
            # the launcher ended it on purpose (a PS once the workers were done, the others after a failure);
            # "no report": the stop came while its `rtkit run` was still starting
            status = "stopped"
        sps = t.get("steps_per_s")
        rows.append({
            "task": name, "dir": t["dir"], "role": t["role"], "index": t.get("index", 0),
            "attempt": t.get("attempt", 0), "status": status, "exit_code": t.get("exit_code"),
            "signal": t.get("signal"), "steps": t.get("steps", 0), "step_ms_median": t.get("step_ms_median"),
            "steps_per_s": sps, "examples_per_s": round(sps * eps, 1) if sps and eps and _trains(t) else None,
            "peak_rss_bytes": t.get("peak_rss_bytes"), "minor_faults_per_step": t.get("minor_faults_per_step"),
            "rss_anon_peak_bytes": t.get("rss_anon_peak_bytes"), "tier_peak_bytes": t.get("tier_peak_bytes"),
            "allocator_state": t.get("allocator_state"), "trains": _trains(t),
            "restarts": latest[name].get("attempt", 0) if t is latest[name] else None,
            "duration_s": t.get("duration_s"),
        })
    medians = {n: t["step_ms_median"] for n, t in latest.items()
               if _trains(t) and t.get("step_ms_median")}
    cluster_median = statistics.median(medians.values()) if medians else None
    stragglers = []
    if cluster_median and len(medians) > 1:
        for n, m in sorted(medians.items()):
            if m > cluster_median * (1 + margin):
                stragglers.append({"task": n, "step_ms_median": m, "slower_by": round(m / cluster_median - 1, 3)})
    timeline = _timeline(tasks)
    total_steps = sum(r["steps"] or 0 for r in rows if r["trains"])
    span = (timeline.get("last_step_unix") or 0) - (timeline.get("first_step_unix") or 0)
    cluster_sps = round(total_steps / span, 3) if span > 0 else None
    failures = [r for r in rows if r["status"] not in ("ok", "stopped", None)]
    return {
        "kind": "cluster", "path": os.path.abspath(path), "tasks": rows,
        "roles": {role: sum(1 for n, t in latest.items() if t["role"] == role) for role in ROLE_ORDER
                  if any(t["role"] == role for t in latest.values())},
        "examples_per_step": eps, "training_steps": total_steps, "cluster_steps_per_s": cluster_sps,
        "cluster_examples_per_s": round(cluster_sps * eps, 1) if cluster_sps and eps else None,
        "step_ms_median_of_workers": cluster_median, "straggler_margin": margin, "stragglers": stragglers,
        "failures": [{"task": r["task"], "dir": r["dir"], "status": r["status"], "exit_code": r["exit_code"],
                      "signal": r["signal"]} for r in failures],
        "restarts": {n: t.get("attempt", 0) for n, t in latest.items() if t.get("attempt", 0)},
        "events": launch.get("events", []), "exit_code": launch.get("exit_code"),
        "ps_memory": _ps_memory(tasks, latest),
        "timeline": {k: timeline.get(k) for k in ("t0_unix", "bin_s", "points")},
        "rss_by_task": {r["dir"]: t.get("rss_timeline") or [] for r, t in zip(rows, tasks)},
        "steps_by_task": {r["dir"]: t.get("steps_timeline") or [] for r, t in zip(rows, tasks)
                          if r["trains"]},
    }
