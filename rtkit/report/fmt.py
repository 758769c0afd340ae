# fmt.py -- human units for report figures (bytes, ms, counts, rates) chosen from the unit in each JSON key.
"""report.json puts the unit in every key (`step_ms`, `peak_rss_bytes`, `minor_faults`), so one
formatter can render any figure, including those of sections this module has never seen
(allocator, pmem, scheduler), from the key name alone."""
from __future__ import annotations

import math
from typing import Any, Optional

MISSING = "-"


def is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not (
        isinstance(v, float) and (math.isnan(v) or math.isinf(v)))


def num(v: Any, digits: int = 3, trim: bool = True) -> str:
    """A number with `digits` significant digits for floats, thousands separators for ints."""
    if not is_num(v):
        return MISSING if v is None else str(v)
    if isinstance(v, int) or float(v).is_integer() and abs(v) >= 1000:
        return f"{int(v):,}"
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1000:
        return f"{v:,.0f}"
    decimals = max(0, digits - 1 - int(math.floor(math.log10(a))))
    text = f"{v:.{min(decimals, 6)}f}"
    if trim and "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def nbytes(v: Any) -> str:
    if not is_num(v):
        return MISSING if v is None else str(v)
    a = abs(v)
    for unit, mult in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if a >= mult:
            return f"{v / mult:.{2 if a / mult < 10 else 1}f} {unit}"
    return f"{int(v)} B"


def ms(v: Any) -> str:
    if not is_num(v):
        return MISSING if v is None else str(v)
    if abs(v) >= 10000:
        return f"{v / 1000:.1f} s"
    return f"{num(v, trim=abs(v) < 1)} ms"


def seconds(v: Any) -> str:
    if not is_num(v):
        return MISSING if v is None else str(v)
    if abs(v) >= 3600:
        return f"{int(v // 3600)}h{int(v % 3600 // 60):02d}m"
    if abs(v) >= 120:
        return f"{int(v // 60)}m{int(v % 60):02d}s"
    return f"{num(v, trim=abs(v) < 1)} s"


def pct(v: Any) -> str:
    """A fraction 0..1 as a percentage (values above 1 are taken as already in percent)."""
    if not is_num(v):
        return MISSING if v is None else str(v)
    return f"{v * 100 if abs(v) <= 1 else v:.1f}%"


def ratio(v: Any) -> str:
    if not is_num(v):
        return MISSING
    return f"{v:.2f}x" if abs(v) < 100 else f"{v:,.0f}x"


def by_key(key: str, v: Any) -> str:
    """Format `v` by the unit its key names; falls back to plain numbers and text."""
    if v is None:
        return MISSING
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (list, tuple)):
        if all(not isinstance(x, (dict, list)) for x in v):
            return ", ".join(str(x) for x in v) if v else "(none)"
        return f"{len(v)} entries"
    if isinstance(v, dict):
        return f"{len(v)} keys"
    if not is_num(v):
        return str(v)
    if _is_size_setting(key):   # a settings echo (`tier_resident_max`) is in bytes whatever its suffix says
        return nbytes(v)
    k = unit_key(key)
    if k.endswith("bytes") or k.startswith("bytes_") or k.endswith("_size") or k == "size":
        return nbytes(v)
    if k.endswith("_ms") or k == "ms":
        return ms(v)
    if k.endswith("_us"):
        return f"{num(v)} us"
    if k.endswith("_ns"):
        return f"{num(v)} ns"
    if k.endswith("_per_s") or k.endswith("per_second"):
        return num(v)
    if k.endswith("_s") or k.endswith("seconds"):
        return seconds(v)
    if k.endswith("rate") or k.endswith("fraction") or k.endswith("occupancy") or k.endswith("utilization"):
        return pct(v)
    if k.endswith("percent") or k.endswith("_pct"):
        return f"{num(v)}%"
    if k.endswith("speedup") or k.endswith("ratio") or k.endswith("_x"):
        return ratio(v)
    return num(v)


_STATS = ("_median", "_mean", "_avg", "_p5", "_p50", "_p90", "_p95", "_p99", "_min", "_max", "_total", "_sum",
          "_before_plan", "_after_plan", "_per_step", "_before", "_after", "_peak", "_last", "_first")


def _is_size_setting(key: str) -> bool:
    from rtkit import config   # the settings table: a leaf, imported when a figure is first formatted

    setting = config.BY_KEY.get(key)
    return setting is not None and setting.kind == "size"


def unit_key(key: str) -> str:
    """`step_ms_median` -> `step_ms`: the unit sits before a statistic suffix."""
    k = key.lower()
    changed = True
    while changed:
        changed = False
        for suffix in _STATS:
            if k.endswith(suffix) and len(k) > len(suffix):
                k = k[: -len(suffix)]
                changed = True
    return k


def label(key: str) -> str:
    """`minor_faults_per_step` -> `minor faults per step` (units stay visible)."""
    return key.replace("_", " ")


def get(d: Any, path: str, default: Any = None) -> Any:
    """Dotted lookup that tolerates missing levels and non-dicts: get(r, 'steps.summary.step_ms_median')."""
    cur = d
    for part in path.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return default
    return cur


def safe_ratio(b: Any, a: Any) -> Optional[float]:
    if not (is_num(a) and is_num(b)) or a == 0:
        return None
    return float(b) / float(a)


def shorten(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."
