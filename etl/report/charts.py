"""The geometry of the report's charts: bars and histograms as rectangles and labels in SVG user
units, computed here and drawn by the report's template as inline SVG.

Pure functions of counts: no drawing library, no JavaScript, and the same counts give the same
chart (the report is byte-identical run to run). Values are escaped by the template, never
here; the SVG is only the numbers this module returns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

PALETTE = ("#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb")
"""Paul Tol's bright scheme: told apart by readers with any common colour vision deficiency."""

ROW = 18
"""Height of one bar's row, in SVG user units (px at 100 % zoom)."""
LABEL_WIDTH = 180
BAR_WIDTH = 420
VALUE_WIDTH = 90
TOP = 24


@dataclass(frozen=True)
class Segment:
    x: float
    width: float
    colour: str
    title: str
    """The hover text: series, category and value."""


@dataclass(frozen=True)
class Bar:
    y: float
    label: str
    value: str
    segments: tuple[Segment, ...]
    end: float
    """Where the bar ends (its value is written after it)."""


@dataclass(frozen=True)
class BarChart:
    """Horizontal bars, one per category, each split into its series' segments (stacked)."""

    width: int
    height: int
    bars: tuple[Bar, ...]
    legend: tuple[tuple[str, str], ...]
    """(series name, colour), in series order."""
    label_width: int = LABEL_WIDTH
    row: int = ROW
    top: int = TOP


def stacked_bars(categories: Sequence[str], series: Mapping[str, Sequence[int]]) -> BarChart:
    """One horizontal bar per category, its length the category's total over `series`
    ({name: one count per category}), split into one segment per series."""
    names = list(series)
    values = np.array([list(series[name]) for name in names], dtype=np.int64).reshape(
        len(names), len(categories)
    )
    totals = values.sum(axis=0)
    scale = BAR_WIDTH / max(int(totals.max(initial=0)), 1)
    colours = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}
    bars = []
    for j, category in enumerate(categories):
        x, segments = float(LABEL_WIDTH), []
        for i, name in enumerate(names):
            n = int(values[i, j])
            if n:
                width = n * scale
                segments.append(Segment(x, width, colours[name], f"{category}, {name}: {n:,}"))
                x += width
        bars.append(Bar(TOP + j * ROW, category, f"{int(totals[j]):,}", tuple(segments), x))
    return BarChart(
        width=LABEL_WIDTH + BAR_WIDTH + VALUE_WIDTH,
        height=TOP + len(categories) * ROW + 4,
        bars=tuple(bars),
        legend=tuple((name, colours[name]) for name in names if len(names) > 1),
    )


@dataclass(frozen=True)
class Histogram:
    """Vertical bars over equal-width bins of a numeric column."""

    width: int
    height: int
    bars: tuple[tuple[float, float, float, float, str], ...]
    """(x, y, width, height, hover text) of each bin's bar."""
    low: str
    high: str
    baseline: float


HIST_WIDTH, HIST_HEIGHT, HIST_BINS = 360, 120, 20


def histogram(values: NDArray[np.generic], bins: int = HIST_BINS) -> Histogram | None:
    """The histogram of finite `values` (None when there are none): `bins` equal bins between
    the smallest and the largest, hover text giving each bin's range and count."""
    finite = values[np.isfinite(values)] if values.dtype.kind == "f" else values
    if finite.size == 0:
        return None
    low, high = float(finite.min()), float(finite.max())
    if high > low:  # NOTE: edges as low*(1-f) + high*f: finite even where high - low is not
        fractions = np.linspace(0.0, 1.0, bins + 1)
        counts, edges = np.histogram(finite, bins=low * (1 - fractions) + high * fractions)
    else:
        counts, edges = np.histogram(finite, bins=bins)
    plot = HIST_HEIGHT - 20
    scale = plot / max(int(counts.max()), 1)
    step = HIST_WIDTH / len(counts)
    bars = tuple(
        (
            i * step,
            plot - int(n) * scale,
            max(step - 1, 1),
            int(n) * scale,
            f"{_number(edges[i])} to {_number(edges[i + 1])}: {int(n):,}",
        )
        for i, n in enumerate(counts)
    )
    return Histogram(HIST_WIDTH, HIST_HEIGHT, bars, _number(low), _number(high), plot)


def _number(x: float) -> str:
    """A bin edge as a reader wants it: integers plain, other numbers to 4 significant digits."""
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:.4g}"
