# bounds.py -- what bounds the peak RSS: the runtime before training, the heap the steps hold, and the rest.
"""report.json's `bounds` section, built from figures the report already has, so that a user sees how far the
peak RSS is from what the program itself needs:

    peak RSS = runtime before the first step + heap the steps added + overhead

- runtime before the first step (measured): the last RSS sample the parent took before the first counted step
  began (TensorFlow, Python, the graph and variables);
- heap the steps added (estimate): the allocator's highest heap live bytes at a step end (glibc's books plus
  rtkit's own blocks) minus the heap live at the end of the first step; only with rtkit's allocator, whose
  figures these are; an estimate because live bytes are read at step ends, not inside a step;
- overhead (derived): the rest: allocator memory held idle or retained, fragmentation, the steps' transient
  peak between step ends; `rtkit idle at exit` is the measured part of it that is rtkit's own.

With the allocator's figures the peak RSS over the heap's live bytes is also split by who holds it, at the
step mark where the heap's footprint was largest (the allocator keeps that mark's figures):

    RSS over live = arenas idle + large heap idle + glibc heap free + runtime and the rest

(in tier mode the live bytes count the pool's live bytes in DRAM at its highest RSS sample too: tables and slots in
the pool file's page cache are the program's data, which the heap's books do not hold)

- arenas idle: free blocks of the planned classes and every block's rounding up to whole pages;
- large heap idle: resident free pages of rtkit's large-object heap (the headroom faulted in after a plan too);
- glibc heap free: free chunks in glibc's heaps (its books; an upper bound on their resident part);
- runtime and the rest (derived): libraries, stacks, Python, TensorFlow's own mappings, and what a step holds
  between step ends.

Without the allocator's figures only the growth over the runtime (peak - baseline) is given."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from rtkit.report import fmt
from rtkit.report import glossary as G
from rtkit.report import tier_view
from rtkit.report.contract import Allocator as A, Bounds as B, Process as P
from rtkit.report.fmt import get


def _baseline(report: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The last RSS sample taken before the first step began (None without steps or such a sample)."""
    per = get(report, "steps.per_step")
    first = per[0] if isinstance(per, list) and per and isinstance(per[0], dict) else None
    if first is None or not fmt.is_num(first.get("t_s")):
        return None
    samples = get(report, "process." + P.SAMPLES) or []
    before = [s for s in samples if isinstance(s, dict) and fmt.is_num(s.get("t_s")) and fmt.is_num(s.get("rss_bytes"))
              and s["t_s"] <= first["t_s"] and s["rss_bytes"] > 0]
    return before[-1] if before else None


def _first_step_live(alloc: Any) -> Optional[int]:
    """Heap live bytes at the end of the allocator's first recorded step (step 0: the first training step)."""
    per = [x for x in (get(alloc, A.PER_STEP) or []) if isinstance(x, dict) and fmt.is_num(x.get(A.STEP))]
    first = min(per, key=lambda x: x[A.STEP], default=None)
    if first is None or first[A.STEP] != 0 or not fmt.is_num(first.get(A.STEP_LIVE_BYTES)):
        return None   # the step ring wrapped: the first step's figure is gone
    return int(first[A.STEP_LIVE_BYTES])


def _rtkit_idle(alloc: Any) -> Optional[int]:
    idle, free = get(alloc, A.LARGE_IDLE_BYTES), get(alloc, A.ARENA_FREE_BYTES)
    if not fmt.is_num(idle) and not fmt.is_num(free):
        return None
    return int((idle if fmt.is_num(idle) else 0) + (free if fmt.is_num(free) else 0))


# The tier's highest RSS sample stands for the peak when it is at least this share of it.
POOL_SAMPLE_NEAR_PEAK = 0.9


def _pool_live_dram(peak: int, pmem: Any) -> Optional[int]:
    """Tier mode: the pool's live bytes in DRAM (its pages in DRAM, at most its live bytes) at its highest RSS sample,
    when that sample is near the peak. They are the program's data (tables, slots) in the pool file's page cache,
    which the heap's live bytes do not count; None without a pool or such a sample."""
    at = tier_view.rss_peak_sample(pmem) if isinstance(pmem, dict) and pmem.get("state") == "on" else None
    if at is None or at["rss_bytes"] < POOL_SAMPLE_NEAR_PEAK * peak:
        return None
    return int(min(at["pool_dram_bytes"], at["tier_bytes"]))


def _over_live(peak: int, alloc: Any, pmem: Any) -> Dict[str, Any]:
    """RSS over live per component, from the allocator's largest footprint (every value None without it)."""
    fp = get(alloc, A.FOOTPRINT) if isinstance(alloc, dict) else None
    keys = (B.FOOTPRINT_STEP, B.FOOTPRINT_LIVE_BYTES, B.OVER_LIVE_BYTES, B.OVER_ARENAS_BYTES, B.OVER_LARGE_IDLE_BYTES,
            B.OVER_GLIBC_BYTES, B.OVER_RUNTIME_BYTES, B.POOL_LIVE_DRAM_BYTES)
    out: Dict[str, Any] = dict.fromkeys(keys)
    parts = [fp.get(k) for k in (A.FP_LIVE, A.FP_ARENA_IDLE, A.FP_LARGE_IDLE, A.FP_GLIBC_FREE)] if isinstance(fp, dict) else []
    if not isinstance(fp, dict) or not fmt.is_num(fp.get(A.FP_STEP)) or not all(fmt.is_num(v) for v in parts):
        return out
    live, arenas, large, glibc = (int(v) for v in parts)
    pool = _pool_live_dram(peak, pmem)
    over = peak - live - (pool or 0)
    out.update({B.FOOTPRINT_STEP: int(fp[A.FP_STEP]), B.FOOTPRINT_LIVE_BYTES: live, B.OVER_LIVE_BYTES: over,
                B.POOL_LIVE_DRAM_BYTES: pool,
                B.OVER_ARENAS_BYTES: arenas, B.OVER_LARGE_IDLE_BYTES: large, B.OVER_GLIBC_BYTES: glibc,
                B.OVER_RUNTIME_BYTES: over - arenas - large - glibc})
    return out


def build(report: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The bounds section, or None when the report has no peak RSS or no sample before the first step."""
    peak = get(report, "process." + P.PEAK_RSS_BYTES)
    base = _baseline(report)
    if not fmt.is_num(peak) or not peak or base is None:
        return None
    out: Dict[str, Any] = {B.PEAK_RSS_BYTES: int(peak), B.BASELINE_RSS_BYTES: int(base["rss_bytes"]),
                           B.BASELINE_AT_S: base["t_s"], B.GROWTH_BYTES: int(peak) - int(base["rss_bytes"]),
                           B.PEAK_LIVE_BYTES: None, B.FIRST_STEP_LIVE_BYTES: None, B.STEP_LIVE_BYTES: None,
                           B.OVERHEAD_BYTES: None, B.RTKIT_IDLE_BYTES: None, B.ESTIMATES: []}
    alloc = report.get("allocator")
    peak_live = get(alloc, A.PEAK_LIVE_BYTES) if isinstance(alloc, dict) else None
    first_live = _first_step_live(alloc) if isinstance(alloc, dict) else None
    if fmt.is_num(peak_live) and first_live is not None:
        live = max(0, int(peak_live) - first_live)
        out.update({B.PEAK_LIVE_BYTES: int(peak_live), B.FIRST_STEP_LIVE_BYTES: first_live, B.STEP_LIVE_BYTES: live,
                    B.OVERHEAD_BYTES: out[B.GROWTH_BYTES] - live, B.RTKIT_IDLE_BYTES: _rtkit_idle(alloc)})
        out[B.ESTIMATES] = [B.STEP_LIVE_BYTES, B.OVERHEAD_BYTES]
    over = _over_live(int(peak), alloc, report.get("pmem"))
    out.update(over)
    if over[B.OVER_RUNTIME_BYTES] is not None:
        out[B.ESTIMATES] = out[B.ESTIMATES] + [B.OVER_RUNTIME_BYTES]
    return out


def _t(fid: str, v: Any) -> str:
    return f"{G.name(fid)} {G.FIGURES[fid].text(v)}"


def equation(b: Dict[str, Any]) -> Optional[str]:
    """'peak RSS X = RSS before the first step Y + heap the steps added Z + RSS overhead W', with only the
    terms the report has, named as in the glossary."""
    peak, base = b.get(B.PEAK_RSS_BYTES), b.get(B.BASELINE_RSS_BYTES)
    if not fmt.is_num(peak) or not fmt.is_num(base):
        return None
    head = f"{_t('peak_rss_bytes', peak)} = {_t('baseline_rss_bytes', base)}"
    live, over = b.get(B.STEP_LIVE_BYTES), b.get(B.OVERHEAD_BYTES)
    if fmt.is_num(live) and fmt.is_num(over):
        return f"{head} + {_t('step_live_bytes', live)} + {_t('rss_overhead_bytes', over)}"
    return (f"{head} + {_t('rss_growth_bytes', b.get(B.GROWTH_BYTES))} (not split into heap and overhead: "
            "rtkit's allocator measures live bytes)")


def over_live_equation(b: Dict[str, Any]) -> Optional[str]:
    """'RSS over live X = arenas idle A + large heap idle L + glibc heap free G + runtime and the rest R', or None."""
    if not fmt.is_num(b.get(B.OVER_LIVE_BYTES)):
        return None
    terms = " + ".join(_t(fid, b.get(key)) for fid, key in OVER_LIVE_PARTS)
    return f"{_t('over_live_bytes', b[B.OVER_LIVE_BYTES])} = {terms}"


# the components of RSS over live, as (glossary id, bounds key), in the order the equation adds them
OVER_LIVE_PARTS = (("over_live_arenas_bytes", B.OVER_ARENAS_BYTES), ("over_live_large_idle_bytes", B.OVER_LARGE_IDLE_BYTES),
                   ("over_live_glibc_free_bytes", B.OVER_GLIBC_BYTES), ("over_live_runtime_bytes", B.OVER_RUNTIME_BYTES))
FIGURE_IDS = ("baseline_rss_bytes", "rss_growth_bytes", "peak_live_bytes", "step_live_bytes", "rss_overhead_bytes",
              "rtkit_idle_bytes", "over_live_bytes") + tuple(fid for fid, _ in OVER_LIVE_PARTS)


def rows(report: Dict[str, Any]) -> List[tuple]:
    """(name, text) rows of the report's bounds block: the equation, then each figure under its glossary name."""
    b = report.get("bounds")
    if not isinstance(b, dict):
        return []
    eq = equation(b)
    out = [("peak RSS is", eq)] if eq else []
    over = over_live_equation(b)
    if over:
        out.append(("RSS over live is", over))
    extra = {"baseline_rss_bytes": f" (sampled at {fmt.seconds(b.get(B.BASELINE_AT_S))}, before the first step began)",
             "peak_live_bytes": f" (at the end of the first step {fmt.nbytes(b.get(B.FIRST_STEP_LIVE_BYTES))})",
             "over_live_bytes": (f" (peak RSS minus the heap live {fmt.nbytes(b.get(B.FOOTPRINT_LIVE_BYTES))} at the end "
                                 f"of step {b.get(B.FOOTPRINT_STEP)}, the heap's largest footprint"
                                 + (f", and the tier pool's live bytes in DRAM {fmt.nbytes(b[B.POOL_LIVE_DRAM_BYTES])} "
                                    "at its highest RSS sample" if fmt.is_num(b.get(B.POOL_LIVE_DRAM_BYTES)) else "")
                                 + ")")}
    for fid in FIGURE_IDS:
        v = G.value(report, fid)
        if v is not None:
            out.append((G.name(fid), G.FIGURES[fid].text(v) + extra.get(fid, "")))
    return out
