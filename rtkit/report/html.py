# html.py -- one self-contained HTML report (inline CSS and SVG plots, no scripts, no network) for `rtkit report --html`.
from __future__ import annotations

import os
from html import escape
from typing import Any, Callable, Dict, List

from rtkit import atomic
from rtkit.errors import UserError
from rtkit.report import figures as F
from rtkit.report import fmt
from rtkit.report import glossary as G
from rtkit.report import load
from rtkit.report.contract import Scheduler
from rtkit.report import sections as sec
from rtkit.report import svg
from rtkit.report.fmt import get

CSS = """
body{font-family:-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif;margin:24px auto;max-width:980px;
color:#1d1d1f;background:#fafafa;padding:0 16px;line-height:1.4}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #ddd;padding-bottom:3px}
h3{font-size:14px;margin:14px 0 4px;color:#444}
.sub{color:#555;font-size:13px;margin-bottom:14px;word-break:break-all}
.status{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:bold;color:#fff}
.ok{background:#2e7d32}.failed,.killed{background:#c62828}.interrupted,.not_started,.unknown{background:#ef6c00}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:130px}
.card .v{font-size:19px;font-weight:bold}.card .k{font-size:12px;color:#666}
table{border-collapse:collapse;background:#fff;font-size:13px;margin:4px 0 8px}
td,th{border:1px solid #e0e0e0;padding:3px 9px;text-align:left;vertical-align:top}
th{background:#f0f0f0} td.n{text-align:right;font-variant-numeric:tabular-nums}
table.kv td:first-child{color:#555;white-space:nowrap}
.off{color:#777;font-style:italic}
.plot{background:#fff;border:1px solid #ddd;border-radius:6px;margin:10px 0;padding:4px;overflow-x:auto}
ul.notes{margin:4px 0;padding-left:22px;font-size:13px}
footer{margin-top:30px;color:#888;font-size:12px}
"""


def _kv_table(rows: List[tuple]) -> str:
    body = "".join(
        f'<tr><td style="padding-left:{9 + 7 * (len(k) - len(k.lstrip(" ")))}px">{escape(k.strip())}</td>'
        f"<td>{escape(str(v))}</td></tr>" for k, v in ((str(k), v) for k, v in rows))
    return f'<table class="kv">{body}</table>'


def _grid(t: sec.Table) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in t.headers)
    rows = []
    numeric = t.numeric or [False] * len(t.headers)
    for r in t.rows:
        cells = []
        for i, c in enumerate(r):
            cls = ' class="n"' if i < len(numeric) and numeric[i] else ""
            cells.append(f"<td{cls}>{escape(str(c))}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    title = f"<h3>{escape(t.title)}</h3>" if t.title else ""
    return f"{title}<table><tr>{head}</tr>{''.join(rows)}</table>"


def _section(s: sec.Section, plots: List[str]) -> str:
    if s.off:
        return f'<h2 id="{s.key}">{escape(s.title)}</h2><p class="off">{escape(s.off)}</p>'
    parts = [f'<h2 id="{s.key}">{escape(s.title)}</h2>']
    if s.rows:
        parts.append(_kv_table(s.rows))
    parts.extend(f'<div class="plot">{p}</div>' for p in plots if p)
    parts.extend(_grid(t) for t in s.tables)
    if s.notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{escape(n)}</li>" for n in s.notes) + "</ul>")
    return "".join(parts)


def _byte_scale(values: List[float]) -> tuple:
    top = max(values) if values else 0
    for unit, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if top >= 2 * mult:
            return unit, float(mult)
    return "bytes", 1.0


def plots(report: Dict[str, Any]) -> Dict[str, List[str]]:
    """SVG plots keyed by the section they belong to."""
    report = load.normalize(report)
    out: Dict[str, List[str]] = {"process": [], "steps": [], "allocator": [], "tier": [], "scheduler": []}
    ser = F.series(report)
    warm = get(report, "steps.warmup_steps")
    warm = warm if fmt.is_num(warm) else 0
    per = get(report, "steps.per_step") or []
    first_step = ser["step_ms"][0][0] if ser["step_ms"] else 0
    shade = (first_step - 0.5, first_step + warm - 0.5, "warm-up") if warm and ser["step_ms"] else None
    if ser["rss"]:
        unit, mult = _byte_scale([y for _, y in ser["rss"]])
        per_t = [x.get("t_s") for x in per if isinstance(x, dict) and fmt.is_num(x.get("t_s"))]
        span = (min(per_t), max(per_t), "training steps") if len(per_t) >= 2 else None
        out["process"].append(svg.line_chart([("RSS", ser["rss"])], "RSS over time", "time (s)", f"RSS ({unit})",
                                             yscale=mult, shade_x=span))
    if ser["step_ms"]:
        median = get(report, "steps.summary.step_ms_median")
        out["steps"].append(svg.line_chart(
            [("step time", ser["step_ms"])], "Step time per step", "step", "step time (ms)", shade_x=shade,
            hline=(median, f"median {fmt.ms(median)}") if fmt.is_num(median) else None,
            markers=len(per) <= 120, clip=True))
    if ser["faults"]:
        out["steps"].append(svg.bar_chart([("minor faults", ser["faults"])], "Minor page faults per step", "step",
                                          "minor faults", shade_x=shade))
    alloc = report.get("allocator")
    if isinstance(alloc, dict):
        per_alloc = F.allocator_per_step(alloc)
        if per_alloc:
            span = F.allocator_profile_span(alloc)
            out["allocator"].append(svg.bar_chart(
                [("arena hits", [(s, h) for s, h, _ in per_alloc]), ("fallbacks", [(s, f) for s, _, f in per_alloc])],
                "Allocator: arena hits and fallbacks per step", "step (allocator's count)", "allocations",
                shade_x=(span[0] - 0.5, span[1] + 0.5, "profiling") if span else None))
    from rtkit.report.tier_view import series as tier_series

    resident, fault_rate = tier_series(report)
    if len(resident) >= 2:
        unit, mult = _byte_scale([y for _, y in resident])
        out["tier"].append(svg.line_chart([("resident", resident)], "Tier pool: bytes resident in DRAM over time",
                                          "time since the pool opened (s)", f"resident ({unit})", yscale=mult,
                                          markers=len(resident) <= 120))
    if len(fault_rate) >= 2:
        out["tier"].append(svg.line_chart([("major faults/s", fault_rate)], "Tier pool: major page faults over time",
                                          "time since the pool opened (s)", "major faults per second",
                                          markers=len(fault_rate) <= 120))
    sched = report.get("scheduler")
    if isinstance(sched, dict):
        occ = F.sched_occupancy_series(sched)
        if len(occ) >= 2:
            out["scheduler"].append(svg.line_chart([("queued", occ)], "Pipeline occupancy (input batches ready)",
                                                   "sample", "batches"))
        trials = F.sched_trials(sched)
        if isinstance(trials, list):
            pts = []
            for i, t in enumerate(trials):
                v = t.get(Scheduler.TRIAL_STEP_MS) if isinstance(t, dict) else None
                if fmt.is_num(v):
                    pts.append((i + 1, v))
            if len(pts) >= 2:
                out["scheduler"].append(svg.bar_chart([("median step time", pts)], "Tuning trials: median step time",
                                                      "trial", "step time (ms)"))
    return out


CARDS = ("steps", "step_ms_median", "step_ms_p95", "steps_per_s", "epoch_step_ms", "peak_rss_bytes",
         "faults_per_step_median", "faults_after_plan", "hit_rate_after_plan", "dram_saved_bytes", "pipelined_steps")


def _cards(report: Dict[str, Any]) -> str:
    """Headline cards: the glossary's figures that the report has, under their one name."""
    cards = [(G.name(fid), G.text(report, fid)) for fid in CARDS if G.value(report, fid) is not None]
    return '<div class="cards">' + "".join(
        f'<div class="card"><div class="v">{escape(v)}</div><div class="k">{escape(k)}</div></div>' for k, v in cards
    ) + "</div>"


def render(report: Dict[str, Any]) -> str:
    """The report as one HTML document (a string)."""
    report = load.normalize(report)
    run = report.get("run") or {}
    status = str(run.get("status") or "unknown")
    name = run.get("name") or os.path.basename(str(run.get("run_dir") or "")) or "run"
    figs = plots(report)
    body = [
        f"<h1>rtkit report: {escape(str(name))} <span class=\"status {escape(status)}\">{escape(status)}</span></h1>",
        f'<div class="sub">{escape(sec.command_text(run.get("command"), 400))}</div>',
        _cards(report),
    ]
    for s in sec.build_sections(report, "html"):
        body.append(_section(s, figs.get(s.key, [])))
    version = get(report, "run.versions.rtkit") or ""
    body.append(f"<footer>rtkit {escape(str(version))} &middot; report schema "
                f"{escape(str(report.get('schema_version')))} &middot; {escape(str(run.get('run_dir') or ''))}</footer>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>rtkit report: {escape(str(name))}</title><style>{CSS}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")


def write(report: Dict[str, Any], path: str) -> str:
    """Write the HTML atomically (temporary file, then rename); returns the path."""
    atomic.write_text(path, render(report))
    return path


def write_for_user(write: Callable[[Any, str], Any], data: Any, path: str) -> str:
    """`write(data, path)` for a command: a path that cannot be written is the user's one-line error, not a
    traceback (`rtkit report --html PATH` on runs and on cluster folders)."""
    try:
        write(data, path)
    except OSError as exc:
        raise UserError(f"rtkit: cannot write '{path}': {exc.strerror or exc}") from None
    return path


def default_path(run_dir: str) -> str:
    return os.path.join(run_dir, "report.html")


__all__ = ["render", "write", "write_for_user", "default_path", "plots"]
