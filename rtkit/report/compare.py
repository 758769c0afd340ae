# compare.py -- two runs side by side with B/A ratios of the headline figures, for `rtkit compare`.
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Tuple

from rtkit.report import fmt
from rtkit.report import sections as sec
from rtkit.report.fmt import get

SAME_BAND = 0.02     # ratios within 2% of 1.0 are called "same", not better/worse


def _cpu_ms_per_step(r: Dict[str, Any]) -> Optional[float]:
    cpu, n = sec.cpu_seconds(r), get(r, "steps.count")
    if cpu is None or not fmt.is_num(n) or not n:
        return None
    return cpu * 1000.0 / n


def _alloc(fn: Callable[[Any], Any]) -> Callable[[Dict[str, Any]], Any]:
    def inner(r: Dict[str, Any]) -> Any:
        a = r.get("allocator")
        return fn(a) if isinstance(a, dict) else None
    return inner


def _sched(fn: Callable[[Any], Any]) -> Callable[[Dict[str, Any]], Any]:
    def inner(r: Dict[str, Any]) -> Any:
        s = r.get("scheduler")
        return fn(s) if isinstance(s, dict) else None
    return inner


# (key, label, value getter, format, lower is better: True/False/None for neutral)
METRICS: List[Tuple[str, str, Callable[[Dict[str, Any]], Any], Callable[[Any], str], Optional[bool]]] = [
    ("steps", "steps counted", lambda r: get(r, "steps.count"), fmt.num, None),
    ("step_ms_median", "step time median", lambda r: get(r, "steps.summary.step_ms_median"), fmt.ms, True),
    ("step_ms_p95", "step time p95", lambda r: get(r, "steps.summary.step_ms_p95"), fmt.ms, True),
    ("step_ms_p5", "step time p5", lambda r: get(r, "steps.summary.step_ms_p5"), fmt.ms, True),
    ("steps_per_s", "steps per second", lambda r: get(r, "steps.summary.steps_per_s"), fmt.num, False),
    ("peak_rss_bytes", "peak RSS", lambda r: get(r, "process.peak_rss_bytes"), fmt.nbytes, True),
    ("minor_faults_per_step", "minor faults/step", sec.faults_per_step, fmt.num, True),
    ("minor_faults", "minor faults (total)", lambda r: get(r, "process.minor_faults"), fmt.num, True),
    ("major_faults", "major faults (total)", lambda r: get(r, "process.major_faults"), fmt.num, True),
    ("cpu_s", "CPU time", sec.cpu_seconds, fmt.seconds, True),
    ("cpu_ms_per_step", "CPU time / steps", _cpu_ms_per_step, fmt.ms, True),
    ("max_threads", "max threads", lambda r: get(r, "process.max_threads"), fmt.num, None),
    ("duration_s", "wall time", lambda r: get(r, "run.duration_s"), fmt.seconds, True),
    ("allocator_hit_rate", "allocator hit rate", _alloc(sec.allocator_hit_rate), fmt.pct, False),
    ("allocator_reserved_bytes", "allocator reserved", _alloc(sec.plan_reserved), fmt.nbytes, True),
    ("allocator_faults_per_step_after_plan", "faults/step after plan", _alloc(lambda a: sec.allocator_faults(a)[1]),
     fmt.num, True),
    ("scheduler_speedup", "scheduler speedup", _sched(sec.sched_speedup), fmt.ratio, False),
]


def _who(r: Dict[str, Any], path: str) -> Dict[str, Any]:
    run = r.get("run") or {}
    return {"path": path, "run_dir": run.get("run_dir"), "name": run.get("name"), "status": run.get("status"),
            "exit_code": run.get("exit_code"), "command": run.get("command"), "profile": run.get("profile"),
            "allocator": "on" if isinstance(r.get("allocator"), dict) else "off",
            "pmem": "on" if isinstance(r.get("pmem"), dict) else "off",
            "scheduler": "on" if isinstance(r.get("scheduler"), dict) else "off"}


def compare(a: Dict[str, Any], b: Dict[str, Any], path_a: str = "", path_b: str = "") -> Dict[str, Any]:
    """The comparison as data: each metric with both values, the ratio B/A and which run is better."""
    a, b = sec.normalize(a), sec.normalize(b)
    rows = []
    for key, label, getter, _f, lower in METRICS:
        va, vb = getter(a), getter(b)
        if va is None and vb is None:
            continue
        va = va if fmt.is_num(va) else None
        vb = vb if fmt.is_num(vb) else None
        ratio = fmt.safe_ratio(vb, va)
        better = None
        if ratio is not None and lower is not None and abs(ratio - 1.0) > SAME_BAND:
            better = "b" if (ratio < 1.0) == lower else "a"
        rows.append({"key": key, "label": label, "a": va, "b": vb, "ratio": ratio, "better": better})
    changed = []
    sa = get(a, "run.settings") or {}
    sb = get(b, "run.settings") or {}
    for k in sorted(set(sa) | set(sb)):
        va, vb = get(sa, f"{k}.value"), get(sb, f"{k}.value")
        if va != vb:
            changed.append({"key": k, "a": va, "b": vb})
    return {"a": _who(a, path_a), "b": _who(b, path_b), "metrics": rows, "settings_differ": changed}


def render(a: Dict[str, Any], b: Dict[str, Any], path_a: str = "", path_b: str = "", width: int = 80) -> str:
    """Plain-text side-by-side table, readable on 80 columns."""
    data = compare(a, b, path_a, path_b)
    fmts = {k: f for k, _l, _g, f, _lo in METRICS}
    lines = []
    for tag in ("a", "b"):
        w = data[tag]
        where = w["run_dir"] or w["path"] or "?"
        text = f"{tag.upper()}: {os.path.basename(str(where).rstrip('/')) or where}  [{w['status'] or 'unknown'}"
        if w["exit_code"] not in (None, 0):
            text += f", exit {w['exit_code']}"
        text += f"]  allocator {w['allocator']}, scheduler {w['scheduler']}"
        if w["profile"]:
            text += f", profile {w['profile']}"
        lines.append(text[:width])
    lines.append("")
    cells = [["metric", "A", "B", "B/A", ""]]
    for m in data["metrics"]:
        f = fmts[m["key"]]
        verdict = {"a": "A better", "b": "B better", None: ""}[m["better"]]
        cells.append([m["label"], f(m["a"]), f(m["b"]), fmt.ratio(m["ratio"]), verdict])
    widths = [max(len(r[i]) for r in cells) for i in range(5)]
    for ri, r in enumerate(cells):
        line = "  ".join([r[0].ljust(widths[0]), r[1].rjust(widths[1]), r[2].rjust(widths[2]),
                          r[3].rjust(widths[3]), r[4]]).rstrip()
        lines.append(line)
        if ri == 0:
            lines.append("  ".join("-" * w for w in widths[:4]))
    if data["settings_differ"]:
        lines.append("")
        lines.append("settings that differ:")
        for s in data["settings_differ"]:
            lines.append(f"  {s['key']}: A={sec._setting_text(s['key'], s['a'])}  B={sec._setting_text(s['key'], s['b'])}"[:width])
    return "\n".join(lines) + "\n"
