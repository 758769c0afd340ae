# compare.py -- two runs side by side for `rtkit compare`: what differs first (settings, components), then B/A figures.
"""Figures and their names come from report/glossary.py (the same words as the summary, `rtkit report` and the
HTML). A ratio whose distance from 1.0 the runs' own per-step spread explains is marked "within noise" rather
than called better or worse. A report of a newer schema version compares: a figure one of them lacks is '-'."""
from __future__ import annotations

import shutil
import textwrap
from typing import Any, Dict, List, Optional

from rtkit.report import figures as F
from rtkit.report import fmt
from rtkit.report import glossary as G
from rtkit.report import load
from rtkit.report.fmt import get

SAME_BAND = G.SAME_BAND

# (group title, figure ids), in the order shown; a group whose figures neither run has is left out
GROUPS = [
    ("steps", ["steps", "measured_steps", "step_ms_median", "step_ms_p5", "step_ms_p95", "step_ms_mean", "steps_per_s",
               "faults_per_step_median", "epochs", "epoch_s_median", "epoch_step_ms"]),
    ("process", ["peak_rss_bytes", "minor_faults", "major_faults", "cpu_s", "cpu_ms_per_step", "max_threads",
                 "duration_s"]),
    ("bounds", ["baseline_rss_bytes", "rss_growth_bytes", "peak_live_bytes", "step_live_bytes", "rss_overhead_bytes",
                "rtkit_idle_bytes", "over_live_bytes", "over_live_arenas_bytes", "over_live_large_idle_bytes",
                "over_live_glibc_free_bytes", "over_live_pool_bytes", "over_live_runtime_bytes"]),
    ("allocator", ["allocator_state", "allocator_plan", "hit_rate", "hit_rate_after_plan", "faults_before_plan",
                   "faults_after_plan", "reserved_bytes", "plan_step_peak_bytes"]),
    ("tier", ["tier_bytes", "tier_peak_bytes", "dram_saved_bytes", "tier_fallbacks"]),
    ("rows", ["row_pages_per_row", "row_scatter_x", "row_scatter_bytes"]),
    ("scheduler", ["sched_chosen", "pipelined_steps", "tuning_gain_pct", "tuning_cost_pct", "occupancy_mean"]),
]


def terminal_width(width: Optional[int] = None) -> int:
    """--width, else the terminal's width (COLUMNS wins, as shutil reads it), never below 60."""
    if width:
        return max(60, int(width))
    return max(60, shutil.get_terminal_size((100, 24)).columns)


def _state(r: Dict[str, Any]) -> Dict[str, str]:
    alloc = G.value(r, "allocator_state")
    return {"allocator": "off" if not isinstance(r.get("allocator"), dict) else str(alloc or "on"),
            "tier": "on" if G.tier_on(r) else "off",
            "scheduler": "off" if not isinstance(r.get("scheduler"), dict) else
            "lookahead only" if r["scheduler"].get("lookahead_only") else "on"}


def _who(r: Dict[str, Any], path: str) -> Dict[str, Any]:
    run = r.get("run") or {}
    return {"path": path, "run_dir": run.get("run_dir"), "name": run.get("name"), "status": run.get("status"),
            "exit_code": run.get("exit_code"), "command": run.get("command"), "profile": run.get("profile"),
            "schema_version": r.get("schema_version"), **_state(r)}


def compare(a: Dict[str, Any], b: Dict[str, Any], path_a: str = "", path_b: str = "") -> Dict[str, Any]:
    """The comparison as data: the settings and components that differ, then each figure with both values,
    the ratio B/A, which run is better, and whether the ratio is inside the runs' own noise."""
    a, b = load.normalize(a), load.normalize(b)
    rows = []
    for group, ids in GROUPS:
        for fid in ids:
            f = G.FIGURES[fid]
            va, vb = f.read(a), f.read(b)
            if va is None and vb is None:
                continue
            if f.unit == "text":
                rows.append({"key": fid, "label": f.name, "group": group, "a": va, "b": vb, "ratio": None,
                             "better": None, "within_noise": False, "noise": None, "differs": va != vb})
                continue
            v = G.verdict(fid, a, b, va, vb)
            rows.append({"key": fid, "label": f.name, "group": group, "a": va, "b": vb, **v,
                         "differs": v["ratio"] is not None and not v["within_noise"] and abs(v["ratio"] - 1) > SAME_BAND})
    changed = F.settings_differ(get(a, "run.settings") or {}, get(b, "run.settings") or {})
    wa, wb = _who(a, path_a), _who(b, path_b)
    comp = [{"component": c, "a": wa[c], "b": wb[c]} for c in ("allocator", "tier", "scheduler") if wa[c] != wb[c]]
    if (wa["profile"] or None) != (wb["profile"] or None):
        comp.insert(0, {"component": "profile", "a": wa["profile"], "b": wb["profile"]})
    return {"a": wa, "b": wb, "components_differ": comp, "settings_differ": changed, "metrics": rows}


def _wrap(text: str, width: int, indent: str = "    ") -> List[str]:
    return textwrap.wrap(text, width, subsequent_indent=indent, break_long_words=True,
                         break_on_hyphens=False) or [""]


def _verdict_text(m: Dict[str, Any], wide: bool) -> str:
    if m["better"]:
        return f"{m['better'].upper()} better"
    if m["within_noise"]:
        if m.get("noise_why") and m["ratio"] is not None and abs(m["ratio"] - 1.0) > SAME_BAND:
            return f"within noise ({m['noise_why']})" if wide else "within noise"
        if m.get("noise") and m["noise"] > SAME_BAND:
            return f"within noise (+-{m['noise'] * 100:.0f}%)" if wide else "within noise"
        return "same (within 2%)" if wide else "same"
    if m["ratio"] is None and m["a"] != m["b"] and m["a"] is not None and m["b"] is not None:
        return "differs"
    if m["a"] == m["b"] and m["a"] is not None:
        return "same"
    return ""


def render(a: Dict[str, Any], b: Dict[str, Any], path_a: str = "", path_b: str = "",
           width: Optional[int] = None) -> str:
    """Plain text: the runs, what differs between them (profile, components, settings), then the figures."""
    width = terminal_width(width)
    data = compare(a, b, path_a, path_b)
    lines: List[str] = []
    for tag in ("a", "b"):
        w = data[tag]
        where = w["run_dir"] or w["path"] or "?"
        text = f"{tag.upper()}: {where}  [{w['status'] or 'unknown'}"
        if w["exit_code"] not in (None, 0):
            text += f", exit {w['exit_code']}"
        text += (f"]  profile {w['profile'] or '(none)'}, allocator {w['allocator']}, tier {w['tier']}, "
                 f"scheduler {w['scheduler']}")
        lines.extend(_wrap(text, width))
    if data["a"]["schema_version"] != data["b"]["schema_version"]:
        lines.extend(_wrap(f"report schema versions differ (A {data['a']['schema_version']}, B "
                           f"{data['b']['schema_version']}): a figure one of them lacks shows as '-'", width))
    lines.append("")
    if data["components_differ"] or data["settings_differ"]:
        lines.append("what differs (A -> B):")
        for c in data["components_differ"]:
            lines.extend(_wrap(f"  {c['component']}: {c['a'] or '(none)'} -> {c['b'] or '(none)'}", width, "      "))
        for s in data["settings_differ"]:
            lines.extend(_wrap(f"  {s['key']}: {F.setting_text(s['key'], s['a'])} -> "
                               f"{F.setting_text(s['key'], s['b'])}", width, "      "))
    else:
        lines.append("what differs: no setting, profile or component (same configuration)")
    lines.append("")
    lines.extend(_wrap("figures (B/A below 1.0: smaller in B; 'within noise': inside the runs' own per-step "
                       f"spread, or too little to tell: under {G.MIN_SAMPLES} steps or epochs a run, or one number a "
                       f"run within {G.WHOLE_RUN_BAND + 1:g}x):", width, ""))
    cells = [["figure", "A", "B", "B/A", ""]]
    group = None
    heads = set()
    text_rows: Dict[int, Dict[str, Any]] = {}
    for m in data["metrics"]:
        if m["group"] != group:
            group = m["group"]
            heads.add(len(cells))
            cells.append([f"[{group}]", "", "", "", ""])
        f = G.FIGURES[m["key"]]
        if f.unit == "text":
            text_rows[len(cells)] = m
        cells.append([m["label"], f.text(m["a"]), f.text(m["b"]), fmt.ratio(m["ratio"]) if m["ratio"] is not None
                      else "-", _verdict_text(m, width >= 100)])
    numeric = [i for i in range(1, len(cells)) if i not in heads and i not in text_rows]
    widths = [max(len(cells[i][c]) for i in [0] + numeric) if numeric else 1 for c in range(5)]
    widths[0] = max(len(r[0]) for r in cells)
    # text figures (a plan's origin, a configuration) get the number columns' width; cut ones follow in full
    cap = max(9, widths[1], widths[2])
    # a label too long for the width goes on a line of its own, its values on the next
    rest = 2 * cap + widths[3] + max(len(r[4]) for r in cells) + 8
    widths[0] = min(widths[0], max(16, width - rest))
    cut_rows = []
    for ri, r in enumerate(cells):
        if ri in heads:
            lines.append(r[0])
            continue
        va, vb = r[1], r[2]
        if len(r[0]) > widths[0]:
            lines.append(r[0])
            r = ["", *r[1:]]
        if ri in text_rows and (len(va) > cap or len(vb) > cap):
            cut_rows.append(ri)
            va = va if len(va) <= cap else va[: cap - 3] + "..."
            vb = vb if len(vb) <= cap else vb[: cap - 3] + "..."
        lines.append("  ".join([r[0].ljust(widths[0]), va.rjust(cap), vb.rjust(cap), r[3].rjust(widths[3]),
                                r[4]]).rstrip())
        if ri == 0:
            lines.append("  ".join("-" * w for w in (widths[0], cap, cap, widths[3])))
    for ri in cut_rows:   # the full text of what was cut above
        m = text_rows[ri]
        lines.append("")
        if m["a"] == m["b"]:
            lines.extend(_wrap(f"{m['label']}: {m['a']} (both)", width))
            continue
        lines.extend(_wrap(f"{m['label']}: A {m['a'] or '-'}", width))
        lines.extend(_wrap(f"{' ' * len(m['label'])}  B {m['b'] or '-'}", width))
    lines.append("")
    lines.extend(_wrap("Same job in both runs? The ratios say nothing about different workloads; for speed claims "
                       "use `rtkit bench` (interleaved repeats, medians).", width, ""))
    return "\n".join(lines) + "\n"
