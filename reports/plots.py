"""Inline SVG plots: needle heatmaps, line charts and stacked bars.

Written by hand so that the report needs no plotting library and no network, and so that the
output is deterministic: coordinates are rounded to fixed precision, nothing depends on time or
random ids, and the same data gives the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html import escape

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#17becf", "#7f7f7f", "#bcbd22"]
# Heatmap colour stops for 0 .. 1 (red = lost, yellow = partial, green = recalled).
HEAT_STOPS = [(0.0, (215, 48, 39)), (0.5, (254, 224, 139)), (1.0, (26, 152, 80))]
FONT = 'font-family="sans-serif" font-size="11"'
CHAR_W = 6.6  # a generous width of one character of FONT, in px (layout without a browser)


def _n(value: float) -> str:
    """A coordinate with fixed precision (deterministic, compact)."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def _svg(width: float, height: float, body: list[str], title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" width="{_n(width)}" '
            f'height="{_n(height)}" viewBox="0 0 {_n(width)} {_n(height)}" role="img" '
            f'aria-label="{escape(title)}">\n<title>{escape(title)}</title>\n'
            + "\n".join(body) + "\n</svg>")


def _text(x: float, y: float, text: str, anchor: str = "middle", extra: str = "") -> str:
    return (f'<text x="{_n(x)}" y="{_n(y)}" text-anchor="{anchor}" {FONT}{extra}>'
            f"{escape(text)}</text>")


def heat_colour(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "#dddddd"
    value = min(1.0, max(0.0, value))
    for (x0, c0), (x1, c1) in zip(HEAT_STOPS, HEAT_STOPS[1:], strict=False):
        if value <= x1:
            t = (value - x0) / (x1 - x0)
            rgb = [round(a + (b - a) * t) for a, b in zip(c0, c1, strict=True)]
            return "#{:02x}{:02x}{:02x}".format(*rgb)
    return "#{:02x}{:02x}{:02x}".format(*HEAT_STOPS[-1][1])


def heatmap(title: str, row_labels: Sequence[str], col_labels: Sequence[str],
            values: Sequence[Sequence[float | None]], row_title: str, col_title: str) -> str:
    """A grid of cells coloured by value in [0, 1], each labelled with its value."""
    cell_w, cell_h = 44.0, 24.0
    left, top = 70.0, 48.0
    width = max(240.0, left + cell_w * len(col_labels) + 20)
    height = top + cell_h * len(row_labels) + 44
    # The title may be long (config and device): split at " on " onto two lines.
    first, _, second = title.partition(" on ")
    body = [_text(width / 2, 16, first, extra=' font-weight="bold"')]
    if second:
        body.append(_text(width / 2, 32, "on " + second))
    for i, label in enumerate(row_labels):
        y = top + i * cell_h
        body.append(_text(left - 6, y + cell_h / 2 + 4, label, anchor="end"))
        for j, _ in enumerate(col_labels):
            value = values[i][j]
            x = left + j * cell_w
            body.append(f'<rect class="cell" x="{_n(x)}" y="{_n(y)}" width="{_n(cell_w - 1)}" '
                        f'height="{_n(cell_h - 1)}" fill="{heat_colour(value)}"/>')
            label_text = "–" if value is None or math.isnan(value) else f"{value:.2f}"
            body.append(_text(x + cell_w / 2, y + cell_h / 2 + 4, label_text))
    bottom = top + cell_h * len(row_labels)
    for j, label in enumerate(col_labels):
        body.append(_text(left + j * cell_w + cell_w / 2, bottom + 14, label))
    body.append(_text(left + cell_w * len(col_labels) / 2, bottom + 32, col_title))
    mid = top + cell_h * len(row_labels) / 2
    body.append(_text(12, mid, row_title, extra=f' transform="rotate(-90 12 {_n(mid)})"'))
    return _svg(width, height, body, title)


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]]  # (x, y), sorted by x
    dashed: bool = False  # reference lines (exact attention) are dashed
    colour: str | None = None
    # (x, low, high): the spread over runs at a point with more than one (min-max), drawn as
    # a whisker through it; a point of one run has none
    spread: list[tuple[float, float, float]] = field(default_factory=list)


@dataclass
class Axes:
    x_label: str
    y_label: str
    log_x: bool = False
    y_min: float | None = None
    y_max: float | None = None
    x_ticks: list[float] = field(default_factory=list)
    x_tick_labels: list[str] = field(default_factory=list)  # one per x tick (default: values)


@dataclass
class Mark:
    """A vertical line across the plot at ``x`` (a detected step), labelled at its top."""

    x: float
    label: str


def _nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        high = low + 1.0
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = min((m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw),
               default=10 * magnitude)
    start = math.floor(low / step) * step
    ticks = [round(start, 10)]
    while ticks[-1] < high - step * 1e-9:  # the last tick is at or above the highest value
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def _tick_label(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e5 else f"{value:.0e}"


def line_chart(title: str, series: Sequence[Series], axes: Axes,
               marks: Sequence[Mark] = ()) -> str:
    """Lines with markers; an x axis on a log2 scale when ``axes.log_x`` (k, context length);
    ``marks`` draw dashed red vertical lines (steps of a timeline)."""
    # the legend's column is as wide as its longest name (it was cut off at a fixed width)
    right = max(130.0, 40.0 + CHAR_W * max((len(s.name) for s in series), default=0))
    left, top, bottom = 56.0, 28.0, 40.0
    width, height = left + PLOT_W + right, 260.0
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points] + [
        v for s in series for _, low, high in s.spread for v in (low, high)]
    body = [_text((left + width - right) / 2, 16, title, extra=' font-weight="bold"')]
    if not xs:
        body.append(_text(width / 2, height / 2, "no data"))
        return _svg(width, height, body, title)

    def fx(x: float) -> float:
        return math.log2(x) if axes.log_x and x > 0 else x

    x_lo, x_hi = min(fx(x) for x in xs), max(fx(x) for x in xs)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    y_ticks = _nice_ticks(axes.y_min if axes.y_min is not None else min(0.0, min(ys)),
                          axes.y_max if axes.y_max is not None else max(ys))
    y_lo, y_hi = y_ticks[0], y_ticks[-1]

    def px(x: float) -> float:
        return left + (fx(x) - x_lo) / (x_hi - x_lo) * plot_w

    def py(y: float) -> float:
        return top + plot_h - (y - y_lo) / (y_hi - y_lo) * plot_h

    body.append(f'<rect x="{_n(left)}" y="{_n(top)}" width="{_n(plot_w)}" height="{_n(plot_h)}" '
                'fill="none" stroke="#999"/>')
    for tick in y_ticks:
        y = py(tick)
        body.append(f'<line x1="{_n(left)}" y1="{_n(y)}" x2="{_n(left + plot_w)}" y2="{_n(y)}" '
                    'stroke="#eee"/>')
        body.append(_text(left - 4, y + 4, _tick_label(tick), anchor="end"))
    x_ticks = axes.x_ticks or sorted(set(xs))
    labels = axes.x_tick_labels or [_tick_label(tick) for tick in x_ticks]
    # every n-th tick labelled where all of them would overlap (a long history)
    widest = CHAR_W * max((len(label) for label in labels), default=1) + 4
    every = max(1, math.ceil(widest * len(labels) / plot_w)) if labels else 1
    for index, (tick, label) in enumerate(zip(x_ticks, labels, strict=True)):
        if index % every == 0:
            body.append(_text(px(tick), top + plot_h + 14, label))
    body += _mark_lines(marks, px, top, plot_h)
    body.append(_text(left + plot_w / 2, height - 6, axes.x_label))
    dense = crowded(len(set(xs)))
    mid = top + plot_h / 2
    body.append(_text(12, mid, axes.y_label, extra=f' transform="rotate(-90 12 {_n(mid)})"'))
    for index, s in enumerate(series):
        colour = s.colour or PALETTE[index % len(PALETTE)]
        dash = ' stroke-dasharray="5,3"' if s.dashed else ""
        at = [(_n(px(x)), _n(py(y))) for x, y in s.points]
        path = " ".join(f"{x},{y}" for x, y in at)
        body.append(f'<polyline class="series" points="{path}" fill="none" stroke="{colour}" '
                    f'stroke-width="1.8"{dash}/>')
        if dense:  # markers and whiskers would overlap: the line, and the spread as a band
            body += _band(s.spread, px, py, colour)
        else:
            for x, y in at:
                body.append(f'<circle cx="{x}" cy="{y}" r="2.5" fill="{colour}"/>')
            for x, low, high in s.spread:
                body.append(_whisker(px(x), py(low), py(high), colour))
        ly = top + 10 + index * 16
        body.append(f'<line x1="{_n(width - right + 8)}" y1="{_n(ly)}" '
                    f'x2="{_n(width - right + 28)}" y2="{_n(ly)}" stroke="{colour}" '
                    f'stroke-width="2"{dash}/>')
        body.append(_text(width - right + 32, ly + 4, s.name, anchor="start"))
    return _svg(width, height, body, title)


PLOT_W = 234.0  # px: a line chart's plot area, between its y axis and its legend
MARKER_GAP = 6.0  # px: a marker's width and a pixel; closer points are drawn as a line only


def crowded(positions: int) -> bool:
    """Whether a line chart with ``positions`` distinct x values draws its points closer than a
    marker's width (a long history): then it draws each line without markers and its spread as
    a band instead of whiskers."""
    return positions * MARKER_GAP > PLOT_W


def spread_caption(positions: int) -> str:
    """What a title says of the spread a line chart of ``positions`` x values draws."""
    return f" ({'shaded' if crowded(positions) else 'whiskers'}: min-max over runs)"


def _band(spread: Sequence[tuple[float, float, float]], px: Callable[[float], float],
          py: Callable[[float], float], colour: str) -> list[str]:
    """The min-max spread of a crowded line as one shaded band (class "spread-band"): up along
    the maxima, back along the minima (a whisker a point was 1,000 paths a line)."""
    if not spread:
        return []
    outline = [(px(x), py(high)) for x, _, high in spread] + \
        [(px(x), py(low)) for x, low, _ in reversed(spread)]
    points = " ".join(f"{_n(x)},{_n(y)}" for x, y in outline)
    return [f'<polygon class="spread-band" points="{points}" fill="{colour}" '
            'fill-opacity="0.2" stroke="none"/>']


def _whisker(x: float, y_low: float, y_high: float, colour: str) -> str:
    """A vertical min-max line with end caps (class "spread")."""
    return (f'<path class="spread" d="M{_n(x - 3)},{_n(y_low)}H{_n(x + 3)}M{_n(x)},{_n(y_low)}'
            f'V{_n(y_high)}M{_n(x - 3)},{_n(y_high)}H{_n(x + 3)}" stroke="{colour}" '
            'fill="none" stroke-width="1"/>')


def _mark_lines(marks: Sequence[Mark], px: Callable[[float], float], top: float,
                plot_h: float) -> list[str]:
    """The steps' dashed lines, each x once, its labels joined; a label that would run into the
    one before it goes a line lower (they were all drawn on one line, over each other)."""
    by_x: dict[float, list[str]] = {}
    for mark in marks:
        by_x.setdefault(mark.x, []).append(mark.label)
    body, ends = [], []  # ends: where each line of labels is free again
    for x_value in sorted(by_x):
        x = px(x_value)
        label = ", ".join(dict.fromkeys(label for label in by_x[x_value] if label))
        half = CHAR_W * len(label) / 2
        row = next((i for i, end in enumerate(ends) if end <= x - half), len(ends))
        ends[row:row + 1] = [x + half + 4]
        body.append(f'<line class="mark" x1="{_n(x)}" y1="{_n(top)}" x2="{_n(x)}" '
                    f'y2="{_n(top + plot_h)}" stroke="#d62728" stroke-dasharray="4,3"/>')
        body.append(_text(x, top + 10 + 13 * row, label,
                          extra=' class="mark-label" fill="#d62728"'))
    return body


def stacked_bars(title: str, groups: Sequence[str], bars: Sequence[str],
                 parts: Sequence[str], values: dict[tuple[str, str, str], float],
                 y_label: str,
                 spread: dict[tuple[str, str], tuple[float, float]] | None = None) -> str:
    """Grouped bars (one group per x label, one bar per series) stacked from ``parts``.

    ``values[(group, bar, part)]`` is the height of one segment; missing segments are 0.
    ``spread[(group, bar)]``: the (min, max) of the bar's total over runs, drawn as a whisker
    (bars of one run have none).
    """
    spread = spread or {}
    bar_w, gap = 16.0, 14.0
    left, top, bottom = 56.0, 28.0, 52.0
    group_w = bar_w * max(1, len(bars)) + gap
    plot_w = group_w * max(1, len(groups))
    key = f"solid: {parts[0]}; light: {parts[-1]}" if parts else ""
    legend_w = max(150.0, 26.0 + CHAR_W * max((len(t) for t in [*bars, key]), default=0))
    width, height = max(380.0, left + plot_w + legend_w), 280.0
    plot_h = height - top - bottom
    totals = [sum(values.get((g, b, p), 0.0) for p in parts) for g in groups for b in bars]
    totals += [high for _, high in spread.values()]
    ticks = _nice_ticks(0.0, max(totals, default=1.0) or 1.0)
    y_hi = ticks[-1]

    def py(y: float) -> float:
        return top + plot_h - y / y_hi * plot_h

    body = [_text(width / 2, 16, title, extra=' font-weight="bold"')]
    for tick in ticks:
        body.append(f'<line x1="{_n(left)}" y1="{_n(py(tick))}" x2="{_n(left + plot_w)}" '
                    f'y2="{_n(py(tick))}" stroke="#eee"/>')
        body.append(_text(left - 4, py(tick) + 4, _tick_label(tick), anchor="end"))
    shades = ["1", "0.45"]  # the first part solid, the second light
    for gi, group in enumerate(groups):
        x0 = left + gi * group_w + gap / 2
        for bi, bar in enumerate(bars):
            base = 0.0
            colour = PALETTE[bi % len(PALETTE)]
            for pi, part in enumerate(parts):
                value = values.get((group, bar, part), 0.0)
                if value <= 0:
                    continue
                body.append(
                    f'<rect class="bar" x="{_n(x0 + bi * bar_w)}" y="{_n(py(base + value))}" '
                    f'width="{_n(bar_w - 2)}" height="{_n(py(base) - py(base + value))}" '
                    f'fill="{colour}" fill-opacity="{shades[pi % 2]}">'
                    f"<title>{escape(f'{group} {bar} {part}: {value:.3g}')}</title></rect>")
                base += value
            if (group, bar) in spread:
                low, high = spread[(group, bar)]
                body.append(_whisker(x0 + bi * bar_w + bar_w / 2 - 1, py(low), py(high),
                                     "#333333"))
        body.append(_text(x0 + len(bars) * bar_w / 2, top + plot_h + 14, group))
    body.append(_text(left + plot_w / 2, height - 20, "context length (tokens)"))
    mid = top + plot_h / 2
    body.append(_text(12, mid, y_label, extra=f' transform="rotate(-90 12 {_n(mid)})"'))
    lx = left + plot_w + 10
    for bi, bar in enumerate(bars):
        y = top + 10 + bi * 16
        body.append(f'<rect x="{_n(lx)}" y="{_n(y - 8)}" width="12" height="10" '
                    f'fill="{PALETTE[bi % len(PALETTE)]}"/>')
        body.append(_text(lx + 16, y + 1, bar, anchor="start"))
    y = top + 14 + len(bars) * 16
    body.append(_text(lx, y, key, anchor="start"))
    return _svg(width, height, body, title)
