# stats.py -- the bench's arithmetic: the interleaving order, the metrics read from a report, medians and ratios.
"""Kept free of I/O so that tests can check the math on plain numbers."""
from __future__ import annotations

import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence

from rtkit.report.contract import Allocator, Bounds
from rtkit.report.fmt import get

# Metrics taken from each run's report.json, in table order. lower_is_better says which way a
# ratio below 1.0 points (steps_per_s is the only one where higher is better).
METRICS = (
    # key,                        label,            unit,     lower_is_better
    ("step_ms_median",             "step ms",        "ms",     True),
    ("steps_per_s",                "steps/s",        "1/s",    False),
    ("peak_rss_bytes",             "peak RSS",       "bytes",  True),
    ("minor_faults_per_step",      "faults/step",    "faults", True),
    ("minor_faults",               "minor faults",   "faults", True),
    ("duration_s",                 "wall s",         "s",      True),
    ("allocator_hit_rate",         "alloc hit rate", "",       False),
    # what bounds the peak RSS (report/bounds.py): growth over the runtime before the first step (every peer),
    # and of it what the steps' heap does not explain (rtkit's allocator only: it measures live bytes; estimate)
    ("rss_growth_bytes",           "RSS growth",     "bytes",  True),
    ("rss_over_live_bytes",        "RSS over live",  "bytes",  True),
)
METRIC_KEYS = tuple(m[0] for m in METRICS)


def rotation(configs: Sequence[str], rounds: int) -> List[List[str]]:
    """Round k runs the list rotated left by k: A B C, B C A, C A B, A B C... so each configuration
    takes each position equally often and slow drifts of the machine spread over all of them."""
    n = len(configs)
    if n == 0:
        return [[] for _ in range(rounds)]
    return [[configs[(k + i) % n] for i in range(n)] for k in range(rounds)]


def median(values: Sequence[Optional[float]]) -> Optional[float]:
    got = [float(v) for v in values if v is not None]
    return statistics.median(got) if got else None


def ratio(value: Optional[float], base: Optional[float]) -> Optional[float]:
    if value is None or base is None or base == 0:
        return None
    return value / base


def _num(x: Any) -> Optional[float]:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def allocator_hit_rate(section: Any) -> Optional[float]:
    """The allocator's hit rate (arena hits / large requests; null when none was large), under the
    report contract's key."""
    return _num(section.get(Allocator.HIT_RATE)) if isinstance(section, Mapping) else None


def steady_faults_per_step(steps: Mapping[str, Any]) -> Optional[float]:
    """Median of the per-step minor faults after the warm-up steps (the steady state); falls back
    to the report's own summary when per-step figures are absent."""
    per_step = steps.get("per_step") or []
    warm = steps.get("warmup_steps") or 0
    tail = [_num(s.get("minor_faults")) for s in per_step[warm:] if isinstance(s, Mapping)]
    value = median(tail)
    if value is None:
        value = _num((steps.get("summary") or {}).get("minor_faults_per_step_median"))
    return value


def metrics_from_report(report: Mapping[str, Any]) -> Dict[str, Optional[float]]:
    """The figures the bench compares, from one report.json (report/model.py's SCHEMA_VERSION). Missing -> None."""
    run = report.get("run") or {}
    process = report.get("process") or {}
    steps = report.get("steps") or {}
    summary = steps.get("summary") or {}
    b = report.get("bounds")   # the runner builds it into every report.json (None without an RSS baseline)
    return {
        "step_ms_median": _num(summary.get("step_ms_median")),
        "steps_per_s": _num(summary.get("steps_per_s")),
        "peak_rss_bytes": _num(process.get("peak_rss_bytes")),
        "minor_faults_per_step": steady_faults_per_step(steps),
        "minor_faults": _num(process.get("minor_faults")),
        "duration_s": _num(run.get("duration_s")),
        "allocator_hit_rate": allocator_hit_rate(report.get("allocator")),
        "rss_growth_bytes": _num(get(b, Bounds.GROWTH_BYTES)),
        "rss_over_live_bytes": _num(get(b, Bounds.OVERHEAD_BYTES)),
    }


def summarize(runs: Sequence[Mapping[str, Any]], configs: Sequence[str], baseline: Optional[str]) -> Dict[str, Any]:
    """Per configuration: medians (and min/max/n) over its successful runs, and ratios of the
    medians against the baseline's medians."""
    medians: Dict[str, Dict[str, Optional[float]]] = {}
    spread: Dict[str, Dict[str, Dict[str, Optional[float]]]] = {}
    counts: Dict[str, Dict[str, int]] = {}
    for name in configs:
        mine = [r for r in runs if r.get("config") == name]
        ok = [r for r in mine if r.get("status") == "ok"]
        counts[name] = {"runs": len(mine), "ok": len(ok), "failed": len(mine) - len(ok)}
        medians[name] = {}
        spread[name] = {}
        for key in METRIC_KEYS:
            vals = [r["metrics"].get(key) for r in ok if r.get("metrics")]
            vals = [v for v in vals if v is not None]
            medians[name][key] = median(vals)
            spread[name][key] = {"min": min(vals) if vals else None, "max": max(vals) if vals else None,
                                 "n": len(vals)}
    ratios: Dict[str, Dict[str, Optional[float]]] = {}
    base = medians.get(baseline or "", {})
    for name in configs:
        ratios[name] = {key: ratio(medians[name].get(key), base.get(key)) for key in METRIC_KEYS}
    return {"medians": medians, "spread": spread, "counts": counts, "ratios": ratios}
