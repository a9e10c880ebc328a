"""Small SVG charts for the run report: lines, error bars, stacked bars, shaded gaps.

Why not matplotlib: the run page is redrawn after every training step (a user watching a long
run sees its curves grow), and nine matplotlib PNGs cost about a second of CPU each time, on
the same cores the rollout and training workers use. These charts are plain SVG text, drawn in
milliseconds, scale without blur and keep the page self-contained (embedded as data URIs).
Only what the report needs is here: an integer step axis, one left axis (optionally percent,
optionally a fixed range), an optional right axis for one series, a legend, and shaded steps.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

WIDTH_PX, HEIGHT_PX = 600, 330  # two abreast in the 1240 px page
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 62, 34, 44  # plot margins (px), room for a right-hand axis
PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3")
GAP_COLOUR = "#f4c542"


@dataclass(frozen=True)
class Series:
    """One series over the chart's steps; ``None``/NaN values leave a gap.

    ``kind``: "line" (markers joined where consecutive values exist), "dashed", or "bar"
    (consecutive bar series stack). ``yerr``: symmetric error bar half-widths per point.
    ``right``: drawn against the right-hand axis (at most one series).
    """

    label: str
    values: Sequence[float | None]
    kind: str = "line"
    yerr: Sequence[float | None] | None = None
    right: bool = False


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def nice_ticks(low: float, high: float, target: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5 or 5 x 10^k apart) covering [low, high]."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return [0.0, 1.0]
    if high <= low:
        low, high = low - (abs(low) or 1.0) * 0.5, high + (abs(high) or 1.0) * 0.5
    raw = (high - low) / max(1, target)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(low / step + 1e-9) * step
    ticks = []
    value = first
    while value < high + step * 0.999:
        ticks.append(round(value, 12))
        value += step
    return ticks


def integer_ticks(low: int, high: int, most: int = 10) -> list[int]:
    """Integer step ticks from ``low`` to ``high``, at most ``most`` of them."""
    span = max(1, high - low)
    step = next(s for s in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 10**9) if span / s < most)
    first = math.ceil(low / step) * step
    return list(range(first, high + 1, step))


def _fmt(value: float, percent: bool) -> str:
    value += 0.0  # -0.0 reads "0", not "-0"
    if percent:
        return f"{value:g}%"
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
        return f"{value:.0e}"
    return f"{value:g}"


def _axis_range(lo: float, hi: float) -> tuple[float, float]:
    """The axis span for data from ``lo`` to ``hi``: a little room beyond the extremes (markers stay
    inside the frame), room above a flat series, and never below 0 for data that is never below 0
    (fractions, counts, rates: no "-0%" or negative ticks)."""
    never_negative = lo >= 0
    if hi <= lo:
        hi = lo + (abs(lo) * 0.5 or 1.0)
        lo = lo - (abs(lo) * 0.5)
    pad = (hi - lo) * 0.05
    lo, hi = (lo - pad if lo != 0 else lo), hi + pad
    return (max(lo, 0.0) if never_negative else lo), hi


class _Scale:
    def __init__(self, lo: float, hi: float, px_lo: float, px_hi: float) -> None:
        self.lo, self.hi, self.px_lo, self.px_hi = lo, hi, px_lo, px_hi

    def __call__(self, v: float) -> float:
        span = (self.hi - self.lo) or 1.0
        return self.px_lo + (v - self.lo) / span * (self.px_hi - self.px_lo)


def _value_range(series: Sequence[Series]) -> tuple[float, float]:
    values: list[float] = []
    bars = [s for s in series if s.kind == "bar"]
    if bars:  # stacked: the top of each stack counts
        n = max(len(s.values) for s in bars)
        values += [sum(float(s.values[i]) for s in bars if i < len(s.values) and _finite(s.values[i])) for i in range(n)]
        values.append(0.0)
    for s in series:
        if s.kind == "bar":
            continue
        for i, v in enumerate(s.values):
            if _finite(v):
                err = s.yerr[i] if s.yerr is not None and _finite(s.yerr[i]) else 0.0
                values += [float(v) - float(err), float(v) + float(err)]
    if not values:
        return 0.0, 1.0
    return min(values), max(values)


def chart(
    title: str,
    steps: Sequence[int],
    series: Sequence[Series],
    *,
    y_label: str,
    percent: bool = False,
    y_range: tuple[float, float] | None = None,
    right_label: str = "",
    shaded_steps: Sequence[int] = (),
    shaded_label: str = "",
) -> str:
    """The SVG document of one chart (``WIDTH_PX`` x ``HEIGHT_PX``)."""
    x0, x1, y0, y1 = _LEFT, WIDTH_PX - _RIGHT, HEIGHT_PX - _BOTTOM, _TOP
    lo_step, hi_step = (min(steps), max(steps)) if steps else (0, 1)
    xs = _Scale(lo_step - 0.6, hi_step + 0.6, x0, x1)
    left = [s for s in series if not s.right]
    if y_range is not None:
        lo, hi = y_range
    else:
        lo, hi = _axis_range(*_value_range(left))
    yticks = nice_ticks(lo, hi)
    ys = _Scale(min(yticks[0], lo), max(yticks[-1], hi), y0, y1)
    esc = html.escape
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH_PX}' height='{HEIGHT_PX}' "
        f"viewBox='0 0 {WIDTH_PX} {HEIGHT_PX}' font-family='sans-serif' font-size='11'>",
        f"<rect width='{WIDTH_PX}' height='{HEIGHT_PX}' fill='white'/>",
        f"<text x='{WIDTH_PX / 2}' y='18' text-anchor='middle' font-size='13'>{esc(title)}</text>",
    ]
    for s in shaded_steps:
        out.append(f"<rect x='{xs(s - 0.4):.1f}' y='{y1}' width='{xs(s + 0.4) - xs(s - 0.4):.1f}' "
                   f"height='{y0 - y1}' fill='{GAP_COLOUR}' fill-opacity='0.3'/>")
    for t in yticks:
        y = ys(t)
        out.append(f"<line x1='{x0}' x2='{x1}' y1='{y:.1f}' y2='{y:.1f}' stroke='#ddd'/>")
        out.append(f"<text x='{x0 - 5}' y='{y + 4:.1f}' text-anchor='end'>{esc(_fmt(t, percent))}</text>")
    for t in integer_ticks(lo_step, hi_step):
        x = xs(t)
        out.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{y0}' y2='{y0 + 4}' stroke='#444'/>")
        out.append(f"<text x='{x:.1f}' y='{y0 + 16}' text-anchor='middle'>{t}</text>")
    out.append(f"<rect x='{x0}' y='{y1}' width='{x1 - x0}' height='{y0 - y1}' fill='none' stroke='#444'/>")
    out.append(f"<text x='{(x0 + x1) / 2}' y='{HEIGHT_PX - 8}' text-anchor='middle'>training step</text>")
    out.append(f"<text transform='translate(14 {(y0 + y1) / 2}) rotate(-90)' text-anchor='middle'>{esc(y_label)}</text>")
    out += _draw_bars([s for s in left if s.kind == "bar"], steps, xs, ys)
    colour = iter(PALETTE)
    legend: list[tuple[str, str, str]] = []
    for s in left:
        c = next(colour)
        legend.append((s.label, c, s.kind))
        if s.kind != "bar":
            out += _draw_line(s, steps, xs, ys, c)
    for s in [s for s in series if s.right]:
        c = next(colour)
        legend.append((s.label, c, s.kind))
        r_lo, r_hi = _axis_range(*_value_range([s]))
        rticks = nice_ticks(r_lo, r_hi)
        rs = _Scale(min(rticks[0], r_lo), max(rticks[-1], r_hi), y0, y1)
        for t in rticks:
            out.append(f"<text x='{x1 + 5}' y='{rs(t) + 4:.1f}' fill='{c}'>{esc(_fmt(t, False))}</text>")
        out.append(f"<text transform='translate({WIDTH_PX - 10} {(y0 + y1) / 2}) rotate(90)' text-anchor='middle' "
                   f"fill='{c}'>{esc(right_label)}</text>")
        out += _draw_line(s, steps, xs, rs, c)
    if shaded_steps and shaded_label:
        legend.append((shaded_label, GAP_COLOUR, "gap"))
    out += _legend(legend, x0 + 8, y1 + 8)
    out.append("</svg>")
    return "".join(out)


def _draw_bars(bars: Sequence[Series], steps: Sequence[int], xs: _Scale, ys: _Scale) -> list[str]:
    out: list[str] = []
    base = [0.0] * len(steps)
    width = max(2.0, (xs(1) - xs(0)) * 0.7)
    for s, c in zip(bars, PALETTE):
        for i, step in enumerate(steps):
            v = s.values[i] if i < len(s.values) else None
            if not _finite(v) or v == 0:
                continue
            a, b = ys(base[i] + float(v)), ys(base[i])
            out.append(f"<rect x='{xs(step) - width / 2:.1f}' y='{min(a, b):.1f}' width='{width:.1f}' "
                       f"height='{abs(b - a):.1f}' fill='{c}'/>")
            base[i] += float(v)
    return out


def _draw_line(s: Series, steps: Sequence[int], xs: _Scale, ys: _Scale, colour: str) -> list[str]:
    out: list[str] = []
    dash = " stroke-dasharray='5 3'" if s.kind == "dashed" else ""
    run: list[str] = []
    for i, step in enumerate(steps):
        v = s.values[i] if i < len(s.values) else None
        if not _finite(v):
            if len(run) > 1:
                out.append(f"<polyline points='{' '.join(run)}' fill='none' stroke='{colour}' stroke-width='1.6'{dash}/>")
            run = []
            continue
        x, y = xs(step), ys(float(v))
        run.append(f"{x:.1f},{y:.1f}")
        out.append(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='2.6' fill='{colour}'/>")
        err = s.yerr[i] if s.yerr is not None and i < len(s.yerr) else None
        if _finite(err) and err > 0:
            ya, yb = ys(float(v) - float(err)), ys(float(v) + float(err))
            out.append(f"<path d='M{x:.1f} {ya:.1f}V{yb:.1f}M{x - 3:.1f} {ya:.1f}h6M{x - 3:.1f} {yb:.1f}h6' "
                       f"stroke='{colour}' fill='none'/>")
    if len(run) > 1:
        out.append(f"<polyline points='{' '.join(run)}' fill='none' stroke='{colour}' stroke-width='1.6'{dash}/>")
    return out


def _legend(items: list[tuple[str, str, str]], x: float, y: float) -> list[str]:
    if len(items) < 2 and not any(kind == "gap" for _, _, kind in items):
        return []
    out = [f"<rect x='{x - 4}' y='{y - 4}' width='{max(len(t) for t, _, _ in items) * 6.2 + 34:.0f}' "
           f"height='{len(items) * 15 + 6}' fill='white' fill-opacity='0.85' stroke='#ccc'/>"]
    for i, (label, colour, kind) in enumerate(items):
        cy = y + 6 + i * 15
        if kind in ("bar", "gap"):
            out.append(f"<rect x='{x}' y='{cy - 5}' width='18' height='10' fill='{colour}'/>")
        else:
            dash = " stroke-dasharray='5 3'" if kind == "dashed" else ""
            out.append(f"<line x1='{x}' x2='{x + 18}' y1='{cy}' y2='{cy}' stroke='{colour}' stroke-width='2'{dash}/>")
        out.append(f"<text x='{x + 24}' y='{cy + 4}'>{html.escape(label)}</text>")
    return out
