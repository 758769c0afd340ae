# svg.py -- small inline SVG charts (line and stacked bars) drawn in Python, so the HTML report needs no JS or network.
from __future__ import annotations

import math
from html import escape
from typing import Callable, List, Optional, Sequence, Tuple

Point = Tuple[float, float]
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")


def nice_ticks(lo: float, hi: float, count: int = 5) -> List[float]:
    """Round tick values covering [lo, hi] (1, 2, 2.5, 5 x 10^n steps)."""
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    v = start
    while True:
        ticks.append(round(v, 12))
        if v >= hi - step * 1e-9 and len(ticks) >= 2:
            break
        v += step
    return ticks


def _plain(v: float) -> str:
    if abs(v) >= 1e6:
        return f"{v / 1e6:.4g}M"
    if abs(v) >= 1e4:
        return f"{v / 1e3:.4g}k"
    return f"{v:.4g}"


def downsample(points: Sequence[Point], limit: int = 1500) -> List[Point]:
    """Keep charts small: at most `limit` points, preserving each bucket's min and max."""
    pts = list(points)
    if len(pts) <= limit:
        return pts
    bucket = math.ceil(len(pts) / (limit / 2))
    out: List[Point] = []
    for i in range(0, len(pts), bucket):
        chunk = pts[i:i + bucket]
        lo = min(chunk, key=lambda p: p[1])
        hi = max(chunk, key=lambda p: p[1])
        out.extend(sorted({lo, hi}, key=lambda p: p[0]))
    return out


class _Frame:
    """Plot area geometry and data-to-pixel mapping."""

    def __init__(self, width: int, height: int, xlo: float, xhi: float, ylo: float, yhi: float):
        self.w, self.h = width, height
        self.left, self.right, self.top, self.bottom = 64, 16, 30, 42
        self.xlo, self.xhi = xlo, (xhi if xhi > xlo else xlo + 1)
        self.ylo, self.yhi = ylo, (yhi if yhi > ylo else ylo + 1)

    def x(self, v: float) -> float:
        return self.left + (v - self.xlo) / (self.xhi - self.xlo) * (self.w - self.left - self.right)

    def y(self, v: float) -> float:
        return self.h - self.bottom - (v - self.ylo) / (self.yhi - self.ylo) * (self.h - self.top - self.bottom)


def _axes(f: _Frame, xticks: List[float], yticks: List[float], xlabel: str, ylabel: str,
          yfmt: Callable[[float], str], title: str) -> List[str]:
    out = [f'<rect x="0" y="0" width="{f.w}" height="{f.h}" fill="#fff"/>',
           f'<text x="{f.left}" y="18" font-size="13" font-weight="bold">{escape(title)}</text>']
    for t in yticks:
        y = f.y(t)
        out.append(f'<line x1="{f.left}" x2="{f.w - f.right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{f.left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{escape(yfmt(t))}</text>')
    for t in xticks:
        x = f.x(t)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{f.h - f.bottom}" y2="{f.h - f.bottom + 4}" stroke="#555"/>')
        out.append(f'<text x="{x:.1f}" y="{f.h - f.bottom + 16}" font-size="11" text-anchor="middle">{escape(_plain(t))}</text>')
    out.append(f'<line x1="{f.left}" x2="{f.w - f.right}" y1="{f.h - f.bottom}" y2="{f.h - f.bottom}" stroke="#555"/>')
    out.append(f'<line x1="{f.left}" x2="{f.left}" y1="{f.top}" y2="{f.h - f.bottom}" stroke="#555"/>')
    out.append(f'<text x="{(f.left + f.w - f.right) / 2:.0f}" y="{f.h - 6}" font-size="11" text-anchor="middle">'
               f'{escape(xlabel)}</text>')
    out.append(f'<text transform="translate(12,{(f.top + f.h - f.bottom) / 2:.0f}) rotate(-90)" font-size="11" '
               f'text-anchor="middle">{escape(ylabel)}</text>')
    return out


def _legend(f: _Frame, names: Sequence[str], colours: Sequence[str]) -> List[str]:
    out = []
    x = f.w - f.right
    for name, colour in reversed(list(zip(names, colours))):
        x -= 8 * len(name) + 26
        out.append(f'<rect x="{x}" y="9" width="12" height="10" fill="{colour}"/>')
        out.append(f'<text x="{x + 16}" y="18" font-size="11">{escape(name)}</text>')
    return out


def _svg(width: int, height: int, body: List[str], aria: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'role="img" aria-label="{escape(aria)}" font-family="sans-serif">' + "".join(body) + "</svg>")


def line_chart(series: Sequence[Tuple[str, Sequence[Point]]], title: str, xlabel: str, ylabel: str,
               yfmt: Callable[[float], str] = _plain, width: int = 900, height: int = 260,
               yscale: float = 1.0, shade_x: Optional[Tuple[float, float, str]] = None,
               hline: Optional[Tuple[float, str]] = None, markers: bool = False, clip: bool = False) -> str:
    """Lines for one or more series of (x, y). y values are divided by `yscale` before plotting;
    `shade_x` = (x0, x1, label) shades a range (e.g. warm-up); `hline` = (y, label) draws a reference;
    `clip` cuts the axis above a few outliers (see clip_cap) and says so on the chart."""
    series = [(n, downsample([(float(x), float(y) / yscale) for x, y in pts])) for n, pts in series if pts]
    if not series:
        return ""
    xs = [p[0] for _, pts in series for p in pts]
    ys = [p[1] for _, pts in series for p in pts]
    ylo = min(0.0, min(ys))
    cap = clip_cap(ys) if clip else None
    if cap is not None:   # outliers (the first step builds the graph) would flatten the rest
        clipped = sum(1 for y in ys if y > cap)
        series = [(n, [(x, min(y, cap)) for x, y in pts]) for n, pts in series]
        note = f"{clipped} point(s) above {yfmt(cap)} cut at the top (max {yfmt(max(ys))})"
        ys = [min(y, cap) for y in ys]
    yticks = nice_ticks(ylo, max(ys))
    xticks = nice_ticks(min(xs), max(xs), 8)
    xticks = [t for t in xticks if min(xs) <= t <= max(xs)] or [min(xs), max(xs)]
    f = _Frame(width, height, min(xs), max(xs), yticks[0], yticks[-1])
    body = _axes(f, xticks, yticks, xlabel, ylabel, yfmt, title)
    if shade_x:
        body.extend(_shade(f, shade_x))
    colours = PALETTE[: len(series)]
    for (name, pts), colour in zip(series, colours):
        path = " ".join(f"{f.x(x):.1f},{f.y(y):.1f}" for x, y in pts)
        body.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{path}"/>')
        if markers and len(pts) <= 200:
            body.extend(f'<circle cx="{f.x(x):.1f}" cy="{f.y(y):.1f}" r="2" fill="{colour}"/>' for x, y in pts)
    if hline and f.ylo <= hline[0] / yscale <= f.yhi:
        y = f.y(hline[0] / yscale)
        body.append(f'<line x1="{f.left}" x2="{f.w - f.right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#444" '
                    f'stroke-dasharray="5,4"/>')
        body.append(f'<text x="{f.w - f.right - 4}" y="{y - 4:.1f}" font-size="10" text-anchor="end">{escape(hline[1])}</text>')
    if cap is not None:
        body.append(f'<text x="{f.w - f.right}" y="{f.top - 2}" font-size="10" fill="#666" text-anchor="end">'
                    f'{escape(note)}</text>')
    if len(series) > 1:
        body.extend(_legend(f, [n for n, _ in series], colours))
    return _svg(width, height, body, title)


def _shade(f: "_Frame", shade_x: Tuple[float, float, str]) -> List[str]:
    """A labelled band over x in [shade_x[0], shade_x[1]] (e.g. the warm-up steps), clipped to the frame."""
    x0, x1 = f.x(max(shade_x[0], f.xlo)), f.x(min(shade_x[1], f.xhi))
    if x1 <= x0:
        return []
    return [f'<rect x="{x0:.1f}" y="{f.top}" width="{x1 - x0:.1f}" height="{f.h - f.top - f.bottom}" '
            f'fill="#f2e6c9" opacity="0.7"/>',
            f'<text x="{x0 + 3:.1f}" y="{f.top + 12}" font-size="10" fill="#8a6d3b">{escape(shade_x[2])}</text>']


def clip_cap(values: Sequence[float]) -> Optional[float]:
    """An axis top that leaves out a few outliers: when the largest value is over 5x the 90th
    percentile, about 2.5x that percentile (a round tick); else None (no clipping)."""
    ordered = sorted(values)
    if not ordered:
        return None
    ref = ordered[int(0.9 * (len(ordered) - 1))]
    if ref > 0 and ordered[-1] > 5 * ref:
        return nice_ticks(0.0, 2.5 * ref)[-1]
    return None


def bar_chart(series: Sequence[Tuple[str, Sequence[Point]]], title: str, xlabel: str, ylabel: str,
              yfmt: Callable[[float], str] = _plain, width: int = 900, height: int = 260,
              shade_x: Optional[Tuple[float, float, str]] = None) -> str:
    """Stacked bars per x (step), one colour per series; many steps become thin bars."""
    series = [(n, list(pts)) for n, pts in series if pts]
    if not series:
        return ""
    xs = sorted({float(x) for _, pts in series for x, _ in pts})
    totals = {x: 0.0 for x in xs}
    for _, pts in series:
        for x, y in pts:
            totals[float(x)] += max(0.0, float(y))
    # a few outliers (first step, warm-up) would flatten the steady state: clip them, label them
    cap = clip_cap(list(totals.values()))
    top = cap if cap is not None else (max(totals.values()) or 1.0)
    yticks = nice_ticks(0.0, top)
    xlo, xhi = xs[0] - 0.5, xs[-1] + 0.5
    f = _Frame(width, height, xlo, xhi, 0.0, yticks[-1])
    xticks = [t for t in nice_ticks(xs[0], xs[-1], 8) if xs[0] <= t <= xs[-1] and float(t).is_integer()] or [xs[0]]
    body = _axes(f, xticks, yticks, xlabel, ylabel, yfmt, title)
    if shade_x:
        body.extend(_shade(f, shade_x))
    bw = max(0.6, (f.x(xhi) - f.x(xlo)) / len(xs) * 0.8)
    base = {x: 0.0 for x in xs}
    colours = PALETTE[: len(series)]
    if len(xs) > 2000:    # very long runs: bucket to keep the file small
        return line_chart(series, title, xlabel, ylabel, yfmt, width, height, shade_x=shade_x)
    for (name, pts), colour in zip(series, colours):
        rects = []
        for x, y in pts:
            x, y = float(x), max(0.0, float(y))
            if y <= 0 or (cap is not None and base[x] >= cap):
                continue
            y0, y1 = f.y(base[x]), f.y(min(cap, base[x] + y) if cap is not None else base[x] + y)
            base[x] += y
            rects.append(f'<rect x="{f.x(x) - bw / 2:.1f}" y="{y1:.1f}" width="{bw:.1f}" height="{max(0.5, y0 - y1):.1f}"/>')
        body.append(f'<g fill="{colour}">' + "".join(rects) + "</g>")
    if cap is not None:
        clipped = [x for x in xs if totals[x] > cap]
        if bw >= 9:   # the value of each clipped bar, written down the bar
            for x in clipped[:50]:
                body.append(f'<text transform="translate({f.x(x) + 3:.1f},{f.top + 4}) rotate(90)" font-size="9" '
                            f'fill="#fff" font-weight="bold">{escape(_plain(totals[x]))}</text>')
        body.append(f'<text x="{f.w - f.right}" y="{f.top - 2}" font-size="10" fill="#666" text-anchor="end">'
                    f'{len(clipped)} bar(s) above {escape(yfmt(cap))} cut at the top'
                    f'{", value written in the bar" if bw >= 9 else ""}</text>')
    if len(series) > 1:
        body.extend(_legend(f, [n for n, _ in series], colours))
    return _svg(width, height, body, title)
