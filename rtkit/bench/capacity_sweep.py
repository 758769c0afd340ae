# capacity_sweep.py -- `python -m rtkit.bench.capacity --sweep`: step time against the share of used rows in DRAM.
"""The capacity curve: for each row layout (first-seen, frequency-ordered, hashed) and each share of the
used rows that fits in DRAM, one tier-mode run whose resident budget (`tier_resident_max`, no DRAM head
unless `--dram-head-gb` says so) is that share of the bytes of the rows the run's ids use (tables and Adagrad
slots, `capacity.touched_bytes`), against an all-in-DRAM run of the same layout, the two interleaved (the
order alternates from point to point, so drift on a shared machine falls on both sides). Each run is a
`rtkit run` of the bundled wdl with tables of `--b` x `--dram-gb` (lazily filled); the figures come from
its report: median step time over the measured steps and over their last quarter, major faults per step,
bytes the budget wrote out of DRAM and the process's disk writes. Written to --out: capacity-sweep.json and
capacity-sweep.svg (a plot drawn here: no plotting library is a dependency), and the table printed."""
from __future__ import annotations

import argparse
import os
import statistics
from typing import Any, Dict, List, Optional, Tuple

from rtkit import atomic

GIB = 1 << 30
MIB = 1 << 20
LAYOUTS = ("first-seen", "frequency", "hashed")
MIN_BUDGET = 1 * MIB      # below this a budget is a record or two: no curve left to draw
COLOURS = {"first-seen": "#1f77b4", "frequency": "#2ca02c", "hashed": "#d62728"}


def parse_sweep(args) -> Optional[str]:
    """Sets args.shares and args.layouts from --sweep / --sweep-rows; the one line that refuses them, or None."""
    try:
        shares = [float(x) for x in args.sweep.split(",") if x.strip()]
    except ValueError:
        shares = []
    if not shares or any(not 0 < s <= 100 for s in shares) or len(set(shares)) != len(shares):
        return (f"capacity: --sweep {args.sweep!r}: expected distinct shares of the used rows that fit in DRAM, "
                "each in (0, 100], comma-separated, e.g. --sweep 2,1,0.5,0.25")
    layouts = [x.strip() for x in args.sweep_rows.split(",") if x.strip()]
    bad = [x for x in layouts if x not in LAYOUTS]
    if not layouts or bad or len(set(layouts)) != len(layouts):
        return (f"capacity: --sweep-rows {args.sweep_rows!r}: expected distinct row layouts from "
                f"{', '.join(LAYOUTS)}, comma-separated")
    if args.ids != "zipf":
        return "capacity: --sweep needs --ids zipf (the used rows and the frequency order come from its law)"
    if args.resident_gb or args.compact_steps or args.b_in_dram:
        return ("capacity: --sweep sets each run's resident budget itself and runs every layout in DRAM too; "
                "drop --resident-gb, --compact-steps and --b-in-dram")
    args.shares, args.layouts = shares, layouts
    return None


def budgets(args, touched: float) -> Optional[str]:
    """The one line that refuses a budget too small to mean anything, or None."""
    low = min(args.shares) * touched
    if low < MIN_BUDGET:
        return (f"capacity: --sweep {min(args.shares):g} of the {touched / MIB:.0f} MiB of rows used is "
                f"{low / MIB:.1f} MiB of DRAM, under {MIN_BUDGET // MIB} MiB; use larger shares, --steps or --batch")
    return None


def _from_report(run_dir: str) -> Dict[str, Any]:
    """What the sweep adds to capacity.figures: the last quarter's median step, the bytes the resident budget
    wrote out of DRAM, and the pages the rows used lie on (the report's rows section)."""
    import json

    with open(os.path.join(run_dir, "report.json")) as fh:
        rep = json.load(fh)
    per = rep["steps"].get("per_step") or []
    per = per[rep["steps"].get("warmup_steps") or 0:]
    tail = [x["step_ms"] for x in per[len(per) * 3 // 4:] if x.get("step_ms") is not None]
    rows = rep.get("rows") or {}
    pages, packed = rows.get("row_pages"), rows.get("packed_pages")
    return {"step_ms_last_quarter": statistics.median(tail) if tail else None,
            "pool_written_bytes": (rep.get("pmem") or {}).get("budget_dropped_bytes"),
            "row_pages_bytes": pages * rows.get("page_bytes", 4096) if pages else None,
            "pages_per_packed_page": pages / packed if pages and packed else None}


def _brief(r: Dict[str, Any]) -> Dict[str, Any]:
    keep = ("run_dir", "step_ms_median", "step_ms_last_quarter", "examples_per_s", "major_faults_per_step",
            "disk_read_bytes", "disk_written_bytes", "pool_written_bytes", "peak_anon_rss_bytes",
            "pool_resident_max_bytes", "row_pages_bytes", "pages_per_packed_page", "wall_s", "loss_last20_mean",
            "settings")
    return {k: r.get(k) for k in keep}


def run(args, run_one, touched: float, pool_path: str, pool_size: int) -> Dict[str, Any]:
    """All points; run_one(label, run_dir, table_gb, args, sets, profile, max_anon) is capacity._run."""
    table_gb = args.scale_b * args.dram / GIB
    points: List[Dict[str, Any]] = []
    sweep = {"table_bytes": int(table_gb * GIB), "touched_bytes_expected": touched, "shares": args.shares,
             "layouts": args.layouts, "steps": args.steps, "batch": args.batch, "dram_head_bytes": args.dram_head,
             "points": points}
    n = len(args.layouts) * len(args.shares)
    k = 0
    for layout in args.layouts:
        largs = argparse.Namespace(**vars(args))
        largs.row_assign = layout
        for i, share in enumerate(args.shares):
            k += 1
            budget = int(share * touched)
            tier = [f"tier_pool_path={pool_path}", f"tier_pool_size={pool_size}", f"tier_resident_max={budget}",
                    f"tier_dram_head={args.dram_head}", "tier_pager=0"] + args.sets
            name = f"{layout}-{share:g}"
            order = [("dram", [], None), ("tier", tier, "capacity")]
            if i % 2:
                order.reverse()
            pair: Dict[str, Dict[str, Any]] = {}
            for kind, sets, profile in order:
                label = f"[{k}/{n}] {layout} {share:g}x {'in DRAM' if kind == 'dram' else f'{budget / MIB:.0f}M DRAM'}"
                run_dir = os.path.join(os.path.abspath(args.out), f"{name}-{kind}")
                r = run_one(label, run_dir, table_gb, largs, sets, profile,
                            int(args.max_anon_gb * GIB + args.dram_head) if kind == "tier" else None)
                r["settings"] = sets
                r.update(_from_report(run_dir))
                pair[kind] = _brief(r)
            d, t = pair["dram"], pair["tier"]
            points.append({"rows": layout, "share": share, "budget_bytes": budget, "dram": d, "tier": t,
                           "ratio": _ratio(t["step_ms_median"], d["step_ms_median"]),
                           "ratio_last_quarter": _ratio(t["step_ms_last_quarter"], d["step_ms_last_quarter"])})
            write(args, sweep)   # after each point: a stopped sweep keeps the points it measured
    return sweep


def _ratio(a, b) -> Optional[float]:
    return a / b if a and b else None


def _fmt(x, spec, suffix=""):
    return "-" if x is None else format(x, spec) + suffix


def _mib(x):
    return None if x is None else x / MIB


def table(sweep: Dict[str, Any]) -> str:
    lines = [f"{'rows':<11}{'share':>6}{'DRAM':>8}{'step ms':>9}{'in DRAM':>9}{'ratio':>8}{'last 1/4':>9}"
             f"{'majflt/step':>12}{'budget wrote':>13}{'disk write':>11}{'row pages':>10}"]
    for p in sweep["points"]:
        t, d = p["tier"], p["dram"]
        lines.append(f"{p['rows']:<11}{p['share']:>5g}x{p['budget_bytes'] / MIB:>7.0f}M"
                     f"{_fmt(t['step_ms_median'], '.1f'):>9}{_fmt(d['step_ms_median'], '.1f'):>9}"
                     f"{_fmt(p['ratio'], '.2f', 'x'):>8}{_fmt(p['ratio_last_quarter'], '.2f', 'x'):>9}"
                     f"{_fmt(t['major_faults_per_step'], '.0f'):>12}"
                     f"{_fmt(_mib(t['pool_written_bytes']), '.0f', 'M'):>13}"
                     f"{_fmt(_mib(t['disk_written_bytes']), '.0f', 'M'):>11}"
                     f"{_fmt(t['pages_per_packed_page'], '.1f', 'x'):>10}")
    return "\n".join(lines)


def svg(sweep: Dict[str, Any]) -> str:
    """The curve: x the share of used rows in DRAM (log scale, most DRAM on the left), y the step time as a
    multiple of all-in-DRAM (log scale); per layout a solid line (whole run) and a dashed one (last quarter)."""
    import math

    w, h, left, right, top, bottom = 640, 400, 70, 150, 40, 50
    pts = [p for p in sweep["points"] if p["ratio"]]
    shares = sorted({p["share"] for p in sweep["points"]}, reverse=True)
    ys = [p[k] for p in pts for k in ("ratio", "ratio_last_quarter") if p[k]] or [1.0]
    ylo, yhi = math.log10(min(min(ys), 1.0) / 1.2), math.log10(max(max(ys), 1.0) * 1.2)
    xlo, xhi = math.log2(min(shares)), math.log2(max(shares))
    span_x = (xhi - xlo) or 1.0

    def X(s):
        return left + (xhi - math.log2(s)) / span_x * (w - left - right) if xhi > xlo else (left + w - right) / 2

    def Y(r):
        return top + (yhi - math.log10(r)) / (yhi - ylo) * (h - top - bottom)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{left}" y="20" font-size="14">Step time vs all-in-DRAM, by share of used rows in DRAM '
           f'({sweep["steps"]} steps of {sweep["batch"]})</text>',
           f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="black"/>',
           f'<text x="{(left + w - right) / 2}" y="{h - 12}" text-anchor="middle">share of used rows that fit in '
           'DRAM (resident budget / bytes of rows used)</text>',
           f'<text x="16" y="{(top + h - bottom) / 2}" transform="rotate(-90 16 {(top + h - bottom) / 2})" '
           'text-anchor="middle">step time / all-in-DRAM (log)</text>']
    for s in shares:
        out.append(f'<text x="{X(s):.1f}" y="{h - bottom + 16}" text-anchor="middle">{s:g}x</text>')
    for e in range(math.floor(ylo), math.ceil(yhi) + 1):
        for m in (1, 2, 5):
            r = m * 10 ** e
            if ylo <= math.log10(r) <= yhi:
                out.append(f'<line x1="{left}" y1="{Y(r):.1f}" x2="{w - right}" y2="{Y(r):.1f}" stroke="#ddd"/>'
                           f'<text x="{left - 6}" y="{Y(r) + 4:.1f}" text-anchor="end">{r:g}x</text>')
    for n, layout in enumerate(sweep["layouts"]):
        colour = COLOURS.get(layout, "black")
        mine = sorted((p for p in pts if p["rows"] == layout), key=lambda p: -p["share"])
        for key, dash in (("ratio", ""), ("ratio_last_quarter", ' stroke-dasharray="5,4"')):
            xy = [(X(p["share"]), Y(p[key])) for p in mine if p[key]]
            if len(xy) > 1:
                out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="'
                           + " ".join(f"{x:.1f},{y:.1f}" for x, y in xy) + '"/>')
            out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>' for x, y in xy]
        ly = top + 10 + 20 * n
        out.append(f'<line x1="{w - right + 12}" y1="{ly}" x2="{w - right + 36}" y2="{ly}" stroke="{colour}" '
                   f'stroke-width="2"/><text x="{w - right + 42}" y="{ly + 4}">{layout}</text>')
    ly = top + 10 + 20 * len(sweep["layouts"])
    out.append(f'<line x1="{w - right + 12}" y1="{ly}" x2="{w - right + 36}" y2="{ly}" stroke="black" '
               f'stroke-dasharray="5,4"/><text x="{w - right + 42}" y="{ly + 4}">last quarter</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write(args, sweep: Dict[str, Any]) -> Tuple[str, str]:
    js = os.path.join(args.out, "capacity-sweep.json")
    pic = os.path.join(args.out, "capacity-sweep.svg")
    atomic.write_json(js, sweep)
    with open(pic + ".tmp", "w") as fh:
        fh.write(svg(sweep))
    os.replace(pic + ".tmp", pic)
    return js, pic
