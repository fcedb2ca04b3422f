"""The dashboard's panels: one module per panel kind, and :func:`draw_panel` to pick one.

Each ``draw(panel, run, ctx)`` takes a run's frame and returns a
:class:`~attnbench.report.page.figures.PanelOutput`: the PNG + SVG figures it wrote and notes for
the page (what was not drawn and why). A panel with nothing to show says so in a note instead
of drawing an empty axis. What the figures share (saving, axes, legends, colours) lives in
:mod:`attnbench.report.page.figures`; the kinds and their options are declared in
:mod:`attnbench.report.page.dashboard`. The throughput panel draws two kinds of figure: line plots
(``throughput``) and bar charts (``throughput_bars``), which share ``throughput_common``.
The ``compile`` kind is drawn by ``compile_time``.
"""

from __future__ import annotations

from typing import Callable

import matplotlib

from attnbench.report.page.dashboard import PANEL_KINDS, Panel
from attnbench.report.read.data import Run
from attnbench.report.page.figures import Context, PanelOutput
from attnbench.report.page.panels import (accuracy_heatmap, architecture, compile_time, decode,
                                     error_trend, error_vs_seqlen, fp8, parallel, throughput,
                                     verdict_matrix)
from attnbench.report.page.style import RC

__all__ = ["DRAW", "draw_panel"]

DRAW: dict[str, Callable[[Panel, Run, Context], PanelOutput]] = {
    "throughput": throughput.draw_throughput,
    "accuracy_heatmap": accuracy_heatmap.draw_accuracy_heatmap,
    "verdict_matrix": verdict_matrix.draw_verdict_matrix,
    "error_vs_seqlen": error_vs_seqlen.draw_error_vs_seqlen,
    "error_trend": error_trend.draw_error_trend,
    "parallel": parallel.draw_parallel,
    "architecture": architecture.draw_architecture,
    "decode": decode.draw_decode,
    "fp8": fp8.draw_fp8,
    "compile": compile_time.draw_compile,
}
assert set(DRAW) == set(PANEL_KINDS), "every panel kind of the dashboard needs a drawing"


def draw_panel(panel: Panel, run: Run, ctx: Context) -> PanelOutput:
    """Draw one panel of a dashboard under the report's matplotlib style."""
    draw = DRAW.get(panel.kind)
    if draw is None:
        raise ValueError(f"panel kind {panel.kind!r}: no drawing for it; the kinds are "
                         f"{', '.join(DRAW)}")
    with matplotlib.rc_context(RC):
        return draw(panel, run, ctx)
