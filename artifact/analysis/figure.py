"""A matplotlib figure without pyplot's global state (Agg canvas, PNG): the report's and the analyses' figures.

The margins are set, in inches, by each figure for the labels it draws (`text_room` sizes those that depend on
the data, such as configuration names): matplotlib's constrained layout would find them by laying every text out
once more before drawing, which doubled the cost of each figure (check draws up to seven).
"""

from __future__ import annotations

import math

CHAR_WIDTH = 0.62  # DejaVu Sans (matplotlib's default): average glyph width per point of font size, generously


def text_room(labels, fontsize: float, rotation: float = 0.0) -> float:
    """Inches that the longest of `labels`, at `fontsize` points and rotated by `rotation` degrees, takes up across
    the axis it labels (the height of rotated x tick labels; the width of y tick labels with rotation 90)."""
    width = max((len(str(s)) for s in labels), default=0) * CHAR_WIDTH * fontsize / 72
    height = 1.2 * fontsize / 72
    a = math.radians(rotation)
    return width * abs(math.sin(a)) + height * abs(math.cos(a))


def overhang(label, fontsize: float, rotation: float, room: float = 0.3) -> float:
    """Inches that a rotated, right-aligned first x tick label reaches left of its axes, whose first tick lies at
    least `room` inches in from the axes' left edge (0 where it does not reach out)."""
    width = len(str(label)) * CHAR_WIDTH * fontsize / 72
    return max(0.0, width * math.cos(math.radians(rotation)) - room) if rotation else 0.0


def legend_rows(n: int, ncol: int = 2, fontsize: float = 7) -> float:
    """Inches that a legend of n entries in ncol columns takes up."""
    return math.ceil(n / ncol) * 1.55 * fontsize / 72 + 0.08


def new_figure(
    width: float,
    height: float,
    *,
    left: float = 0.75,
    bottom: float = 0.55,
    right: float = 0.15,
    top: float = 0.35,
    wspace: float = 0.3,
):
    """A figure of width x height inches whose axes leave the given margins (inches) free for labels, titles and
    legends; `wspace`: the gap between subplots, as a fraction of their width."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    fig.subplots_adjust(
        left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height, wspace=wspace
    )
    return fig
