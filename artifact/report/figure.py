"""A matplotlib figure without pyplot's global state (Agg canvas, PNG): the report's and the analyses' figures."""

from __future__ import annotations


def new_figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig
