# render.py -- the merged cluster report as terminal tables, one HTML page (a plot per role), and a two-folder compare.
from __future__ import annotations

import os
from html import escape
from typing import Any, Dict, List, Optional

from rtkit.report import fmt, svg
from rtkit.report.sections import Table
from rtkit.report.terminal import table_lines

HEADERS = ["task", "run", "status", "steps", "step med", "examples/s", "peak RSS", "flt/step",
           "allocator", "restarts"]
NUMERIC = [False, False, False, True, True, True, True, True, False, True]


def _status(r: Dict[str, Any]) -> str:
    s = str(r.get("status") or "-")
    if r.get("signal") and s != "stopped":
        s += f" ({r['signal']})"
    elif r.get("exit_code") not in (0, None) and s != "stopped":
        s += f" (exit {r['exit_code']})"
    return s


def task_table(m: Dict[str, Any]) -> Table:
    rows = []
    for r in m["tasks"]:
        rows.append([f"{r['role']}:{r['index']}", "first" if not r["attempt"] else f"restart {r['attempt']}",
                     _status(r), str(r["steps"]), fmt.ms(r["step_ms_median"]), fmt.num(r["examples_per_s"], 1),
                     fmt.nbytes(r["peak_rss_bytes"]), fmt.num(r["minor_faults_per_step"]),
                     str(r["allocator_state"] or "-"), "" if r["restarts"] is None else str(r["restarts"])])
    return Table("tasks (one row per run of a task)", HEADERS, rows, NUMERIC)


def headline(m: Dict[str, Any]) -> List[tuple]:
    roles = ", ".join(f"{n} {role}" for role, n in m["roles"].items())
    rows = [("tasks", roles or "-"),
            ("training steps", str(m["training_steps"])),
            ("cluster steps/s", fmt.num(m["cluster_steps_per_s"])),
            ("cluster examples/s", fmt.num(m["cluster_examples_per_s"], 1) if m["cluster_examples_per_s"]
             else "- (launch with --examples-per-step N)"),
            ("median step (workers)", fmt.ms(m["step_ms_median_of_workers"]))]
    ps = [r for r in m["tasks"] if r["role"] == "ps" and r["restarts"] is not None]
    if ps:
        rows.append(("peak RSS per PS", ", ".join(f"ps:{r['index']} {fmt.nbytes(r['peak_rss_bytes'])}" for r in ps)))
        if any(r.get("tier_peak_bytes") for r in ps):
            rows.append(("PS tier (DRAM peak, pool)", ", ".join(
                f"ps:{r['index']} {fmt.nbytes(r.get('rss_anon_peak_bytes'))}, {fmt.nbytes(r.get('tier_peak_bytes'))}"
                for r in ps)))
    if m.get("exit_code") is not None:
        rows.append(("launcher exit code", str(m["exit_code"])))
    return rows


def finding_lines(m: Dict[str, Any]) -> List[str]:
    pct = round(m["straggler_margin"] * 100)
    lines = []
    if m["stragglers"]:
        for s in m["stragglers"]:
            lines.append(f"straggler: {s['task']} median step {fmt.ms(s['step_ms_median'])}, "
                         f"{s['slower_by'] * 100:.0f}% slower than the workers' median "
                         f"{fmt.ms(m['step_ms_median_of_workers'])} (margin {pct}%)")
    else:
        lines.append(f"stragglers: none (no worker's median step is more than {pct}% above the workers' median)")
    followers = [f"{r['role']}:{r['index']}" for r in m["tasks"] if r["role"] != "ps" and not r.get("trains", True)]
    if followers:
        lines.append(f"serving: {', '.join(followers)} ran the coordinator's steps (TF2 parameter-server training); "
                     f"their steps follow the coordinator's count and are not added to the training steps")
    for f in m["failures"]:
        how = f"killed by {f['signal']}" if f.get("signal") else f"exit code {f['exit_code']}"
        lines.append(f"failure: {f['task']} ({f['dir']}) {f['status']}, {how}")
    for name, n in sorted(m["restarts"].items()):
        lines.append(f"restart: {name} was started {n} more time(s)")
    return lines


PS_TABLE_ROWS = 10      # per PS in the terminal; the HTML and --json list every object
PS_HEADERS = ["table", "kind", "dtype", "shape / entries", "bytes", "share"]
PS_NUMERIC = [False, False, False, True, True, True]


def _shape_or_entries(o: Dict[str, Any]) -> str:
    if o.get("kind") == "hash table":
        n = o.get("entries")
        return "-" if n is None else f"{n:,} entries"
    shape = o.get("shape")
    return "-" if shape is None else ("scalar" if not shape else "x".join("?" if d is None else str(d) for d in shape))


def _kind(o: Dict[str, Any]) -> str:
    k = str(o.get("kind") or "-")
    if k == "slot" and o.get("of"):
        k = f"slot of {o['of']}"
    return k + (" (estimate)" if o.get("estimate") else "")


def ps_memory_lines(m: Dict[str, Any]) -> List[str]:
    """One line per PS (peak RSS, what its tables add up to, the share of the RSS they explain)."""
    pm = m.get("ps_memory") or {}
    lines = []
    for name, p in (pm.get("by_ps") or {}).items():
        share = f" = {p['share_of_peak_rss'] * 100:.1f}% of its peak RSS {fmt.nbytes(p['peak_rss_bytes'])}" \
            if p.get("share_of_peak_rss") is not None else " (no peak RSS: the PS left no report)"
        est = f", of which {fmt.nbytes(p['estimated_bytes'])} estimated (hash tables)" if p.get("estimated_bytes") else ""
        unknown = f"; {p['unknown']} object(s) of unknown size" if p.get("unknown") else ""
        lines.append(f"{name.replace('-', ':')}: {len(p['tables'])} objects, {fmt.nbytes(p['tables_bytes'])} in tables"
                     f"{share}{est}{unknown}")
    if pm.get("note"):
        lines.append(f"note: {pm['note']}")
    return lines


def ps_tables(m: Dict[str, Any], limit: Optional[int] = PS_TABLE_ROWS) -> List[Table]:
    out = []
    for name, p in ((m.get("ps_memory") or {}).get("by_ps") or {}).items():
        objs = p["tables"]
        shown = objs if limit is None else objs[:limit]
        total = p["tables_bytes"] or 0
        rows = [[str(o.get("name")), _kind(o), str(o.get("dtype") or "-"), _shape_or_entries(o),
                 fmt.nbytes(o.get("bytes")), fmt.pct(o["bytes"] / total) if total and o.get("bytes") is not None else "-"]
                for o in shown]
        rest = objs[len(shown):]
        if rest:
            b = sum(o.get("bytes") or 0 for o in rest)
            rows.append([f"({len(rest)} more)", "", "", "", fmt.nbytes(b), fmt.pct(b / total) if total else "-"])
        rows.append(["total", "", "", "", fmt.nbytes(total), ""])
        out.append(Table(f"{name.replace('-', ':')} memory by table", PS_HEADERS, rows, PS_NUMERIC))
    return out


PS_MEMORY_TITLE = ("PS memory by table (from the chief's graph at its session's close; variables and optimizer "
                   "slots: shape x dtype, exact; hash tables: entries x (key + value) bytes, an estimate that "
                   "leaves out the map's own overhead)")


def render_text(m: Dict[str, Any], width: int = 130) -> str:
    out = [f"rtkit cluster report: {m['path']}", ""]
    label_w = max(len(k) for k, _ in headline(m))
    out += [f"  {k:<{label_w}}  {v}" for k, v in headline(m)]
    out += [""] + table_lines(task_table(m), width=width) + [""]
    if (m.get("ps_memory") or {}).get("by_ps"):
        out += [PS_MEMORY_TITLE] + [f"  {line}" for line in ps_memory_lines(m)] + [""]
        for t in ps_tables(m):
            out += table_lines(t, width=width) + [""]
    out += [f"  {line}" for line in finding_lines(m)]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------- html

def _plots(m: Dict[str, Any]) -> List[str]:
    figs = []
    pts = m["timeline"]["points"]
    if pts:
        eps = m.get("examples_per_step")
        scale = (lambda y: y * eps) if eps else (lambda y: y)
        figs.append(svg.line_chart([("cluster", [(x, scale(y)) for x, y in pts])], "cluster throughput over time",
                                   "time (s)", "examples/s" if eps else "steps/s"))
    by_role: Dict[str, List[Dict[str, Any]]] = {}
    for r in m["tasks"]:
        by_role.setdefault(r["role"], []).append(r)
    for role, rows in by_role.items():
        if role in ("chief", "worker"):
            series = [(r["dir"], m["steps_by_task"].get(r["dir"]) or []) for r in rows]
            if any(s for _, s in series):
                figs.append(svg.line_chart(series, f"{role}: steps done over time", "time since the task started (s)",
                                           "steps"))
        series = [(r["dir"], m["rss_by_task"].get(r["dir"]) or []) for r in rows]
        if any(s for _, s in series):
            figs.append(svg.line_chart(series, f"{role}: RSS over time", "time since the task started (s)", "MiB",
                                       yscale=2 ** 20))
    return figs


def render_html(m: Dict[str, Any]) -> str:
    from rtkit.report.html import CSS

    t = task_table(m)
    head = "".join(f"<th>{escape(h)}</th>" for h in t.headers)
    body = "".join("<tr>" + "".join(f'<td{" class=n" if NUMERIC[i] else ""}>{escape(c)}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in t.rows)
    kv = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in headline(m))
    findings = "".join(f"<li>{escape(line)}</li>" for line in finding_lines(m))
    plots = "".join(f'<div class="plot">{p}</div>' for p in _plots(m))
    ps_mem = ""
    if (m.get("ps_memory") or {}).get("by_ps"):
        ps_mem = (f"<h2>PS memory by table</h2><p>{escape(PS_MEMORY_TITLE)}</p><ul class=\"notes\">"
                  + "".join(f"<li>{escape(line)}</li>" for line in ps_memory_lines(m)) + "</ul>")
        for pt in ps_tables(m, limit=None):
            ps_mem += (f"<h3>{escape(pt.title)}</h3><table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in pt.headers)
                       + "</tr>" + "".join("<tr>" + "".join(f'<td{" class=n" if PS_NUMERIC[i] else ""}>{escape(c)}</td>'
                                                            for i, c in enumerate(r)) + "</tr>" for r in pt.rows)
                       + "</table>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>rtkit cluster report</title><style>{CSS}</style></head><body>"
            f"<h1>rtkit cluster report</h1><div class=\"sub\">{escape(m['path'])}</div>"
            f"<h2>cluster</h2><table class=\"kv\">{kv}</table><ul class=\"notes\">{findings}</ul>"
            f"<h2>tasks</h2><table><tr>{head}</tr>{body}</table>{ps_mem}<h2>plots</h2>{plots}</body></html>\n")


def write_html(m: Dict[str, Any], path: str) -> str:
    from rtkit import atomic

    atomic.write_text(path, render_html(m))
    return path


def default_html_path(folder: str) -> str:
    return os.path.join(folder, "cluster-report.html")


# ---------------------------------------------------------------------------------------------- compare

def _role_figures(m: Dict[str, Any]) -> Dict[str, Optional[float]]:
    latest = [r for r in m["tasks"] if r["restarts"] is not None]
    train = [r for r in latest if r["role"] in ("chief", "worker")]
    ps = [r for r in latest if r["role"] == "ps"]

    def mx(rows, key):
        vals = [r[key] for r in rows if r.get(key) is not None]
        return max(vals) if vals else None
    return {"cluster_steps_per_s": m["cluster_steps_per_s"], "cluster_examples_per_s": m["cluster_examples_per_s"],
            "step_ms_median_of_workers": m["step_ms_median_of_workers"],
            "worker_peak_rss_bytes_max": mx(train, "peak_rss_bytes"), "ps_peak_rss_bytes_max": mx(ps, "peak_rss_bytes"),
            "ps_peak_rss_bytes_total": sum(r["peak_rss_bytes"] or 0 for r in ps) or None,
            "ps_rss_anon_peak_bytes_max": mx(ps, "rss_anon_peak_bytes"), "ps_tier_peak_bytes_max": mx(ps, "tier_peak_bytes"),
            "ps_tables_bytes_total": sum(p["tables_bytes"] or 0 for p in
                                         ((m.get("ps_memory") or {}).get("by_ps") or {}).values()) or None,
            "training_steps": m["training_steps"], "failures": len(m["failures"]),
            "restarts": sum(m["restarts"].values())}


def compare(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Any]:
    fa, fb = _role_figures(a), _role_figures(b)
    return {"kind": "cluster-compare", "a": a["path"], "b": b["path"],
            "rows": [{"figure": k, "a": fa[k], "b": fb[k], "ratio_b_over_a": fmt.safe_ratio(fb[k], fa[k])}
                     for k in fa]}


def render_compare(c: Dict[str, Any]) -> str:
    rows = [[r["figure"], fmt.by_key(r["figure"], r["a"]), fmt.by_key(r["figure"], r["b"]), fmt.ratio(r["ratio_b_over_a"])]
            for r in c["rows"]]
    t = Table("cluster A vs B", ["figure", "A", "B", "B/A"], rows, [False, True, True, True])
    return "\n".join([f"A: {c['a']}", f"B: {c['b']}", ""] + table_lines(t)) + "\n"
