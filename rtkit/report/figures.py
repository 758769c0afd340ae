# figures.py -- figures derived from a report.json dict, shared by the sections, the HTML plots and compare.
"""Each reads its inputs under the key paths report/contract.py declares; a figure a report lacks is None (or an
empty series), never an exception."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from rtkit.report import fmt
from rtkit.report import glossary as G
from rtkit.report.contract import Allocator as A, Scheduler as S
from rtkit.report.fmt import get
from rtkit.report.load import normalize


def cpu_utilization(report: Dict[str, Any]) -> Optional[float]:
    """CPU seconds per wall second (1.0 = one core busy for the whole run)."""
    c, d = G.cpu_seconds(report), get(report, "run.duration_s")
    return fmt.safe_ratio(c, d)


def allocator_counts(alloc: Any) -> Tuple[Optional[float], Optional[float]]:
    """(arena hits, fallbacks) as totals."""
    hits, falls = get(alloc, A.ARENA_HITS), get(alloc, A.FALLBACKS)
    return (hits if fmt.is_num(hits) else None, falls if fmt.is_num(falls) else None)


def allocator_profile_span(alloc: Any) -> Optional[Tuple[float, float]]:
    """(first, last) step the allocator profiled, when it says."""
    a, b = get(alloc, A.PROFILE_START), get(alloc, A.PROFILE_END)
    return (a, b) if fmt.is_num(a) and fmt.is_num(b) and b >= a else None


def allocator_per_step(alloc: Any) -> List[Tuple[Any, float, float]]:
    """[(step, hits, fallbacks)] from the allocator's per-step census, when it has one."""
    seq = get(alloc, A.PER_STEP)
    out = []
    if isinstance(seq, list):
        for i, r in enumerate(seq):
            if not isinstance(r, dict):
                continue
            h, f = r.get(A.STEP_ARENA_HITS), r.get(A.STEP_FALLBACKS)
            if fmt.is_num(h) or fmt.is_num(f):
                out.append((_step_no(r, i - 1), h if fmt.is_num(h) else 0, f if fmt.is_num(f) else 0))
    return out


def plan_classes(alloc: Any) -> Any:
    return get(alloc, A.PLAN_CLASSES)


def sched_trials(sched: Any) -> Any:
    return get(sched, S.TRIALS)


def sched_occupancy_series(sched: Any) -> List[Tuple[float, float]]:
    seq = get(sched, S.OCCUPANCY_SAMPLES)
    if not isinstance(seq, list):
        return []
    return [(i + 1, v) for i, v in enumerate(seq) if fmt.is_num(v)]


def _step_no(rec: Dict[str, Any], i: int) -> float:
    v = rec.get("step")
    return v if fmt.is_num(v) else i + 1


def series(report: Dict[str, Any]) -> Dict[str, Sequence[Tuple[float, float]]]:
    report = normalize(report)
    out: Dict[str, Sequence[Tuple[float, float]]] = {}
    samples = get(report, "process.samples") or []
    rss = [(x["t_s"], x["rss_bytes"]) for x in samples
           if isinstance(x, dict) and fmt.is_num(x.get("t_s")) and fmt.is_num(x.get("rss_bytes"))]
    while rss and rss[-1][1] == 0:     # a sample taken after the process exited is not a measurement
        rss.pop()
    out["rss"] = rss
    per = get(report, "steps.per_step") or []
    out["step_ms"] = [(_step_no(x, i), x["step_ms"]) for i, x in enumerate(per)
                      if isinstance(x, dict) and fmt.is_num(x.get("step_ms"))]
    out["faults"] = [(_step_no(x, i), x["minor_faults"]) for i, x in enumerate(per)
                     if isinstance(x, dict) and fmt.is_num(x.get("minor_faults"))]
    return out


def settings_differ(sa: Dict[str, Any], sb: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Settings whose value differs between two settings echoes (run.settings), by key: the one rule behind
    `rtkit compare`'s "what differs" and a run's "not default" (a setting a profile or flag set to its default
    value is no difference)."""
    out = []
    sa, sb = sa if isinstance(sa, dict) else {}, sb if isinstance(sb, dict) else {}
    for k in sorted(set(sa) | set(sb)):
        va, vb = get(sa, f"{k}.value"), get(sb, f"{k}.value")
        if va != vb:
            out.append({"key": k, "a": va, "b": vb, "source_a": get(sa, f"{k}.source"), "source_b": get(sb, f"{k}.source")})
    return out


def default_settings(settings: Dict[str, Any]) -> Dict[str, Any]:
    """The settings echo of a run with every setting at its default (the settings table's), for the keys of
    `settings`; a key the table no longer has keeps its recorded value when that came from the default."""
    from rtkit import config  # imports nothing of rtkit
    out = {}
    for k, v in (settings.items() if isinstance(settings, dict) else ()):
        st = config.BY_KEY.get(k)
        if st is not None:
            out[k] = {"value": st.default, "source": "default"}
        elif isinstance(v, dict) and v.get("source") == "default":
            out[k] = {"value": v.get("value"), "source": "default"}
    return out


def setting_text(key: str, value: Any) -> str:
    try:  # sizes read better as 64K/1M; config.py imports nothing of rtkit, so this stays light
        from rtkit import config
        st = config.BY_KEY.get(key)
        if st is not None and st.kind == "size" and isinstance(value, int):
            return config.format_size(value)
        if st is not None and st.kind == "bool":
            return "on" if value else "off"
    except Exception:  # pragma: no cover - the report must render even without config
        pass
    return "''" if value == "" else str(value)
