"""The ``decode`` panel: achieved GB/s and latency against the cache length, per backend and
page size.

Decode reads the whole KV cache for a handful of queries, so it is memory-bound: its figure is
bandwidth (GB/s against the minimal traffic of :func:`attnbench.sweep.flops.decode_bytes`, with a
percent-of-peak-bandwidth axis when the device is in the peak table) beside latency, not
TFLOP/s. One line per backend (colour) and page size (line style; "triton p16": 16-token
pages, "p0": contiguous), one figure per facet (by default GPU kind x dtype x heads x new
tokens).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnbench.report.page.dashboard import Panel
from attnbench.report.read.data import Run, apply_filter
from attnbench.report.page.figures import (Context, FigureFile, PanelOutput, cap_note,
                                           facet_groups, facet_title, finish_figure, new_figure,
                                           setup_x, slug)
from attnbench.results.records import RAN_VERDICTS

LINE_STYLES = ("-", "--", ":", "-.")


def _decode_frame(panel: Panel, run: Run) -> pd.DataFrame:
    df = apply_filter(run.frame, panel.include, panel.exclude)
    if "decode" not in df or df.empty:
        return df.iloc[0:0]
    ran = df.verdict.isin(RAN_VERDICTS)
    return df[(df.decode == True) & ran & df.fwd_gbps.notna()]  # noqa: E712


def draw_decode(panel: Panel, run: Run, ctx: Context) -> PanelOutput:
    out = PanelOutput(panel)
    df = _decode_frame(panel, run)
    if df.empty:
        out.notes.append("No timed decode cases (decode: true) in this run.")
        return out
    groups = list(facet_groups(df, panel["facets"]))
    for key, sub in groups[: panel["max_figures"]]:
        out.figures.append(_figure(panel, key, sub, ctx))
    if len(groups) > panel["max_figures"]:
        out.notes.append(cap_note(panel, len(groups) - panel["max_figures"], "facets",
                                  len(groups)))
    if df.fwd_pct_peak_bandwidth.isna().all():
        out.notes.append("No percent-of-bandwidth axis: the device has no datasheet bandwidth "
                         "in the peak table (as on CPU, where GB/s measure the interpreter).")
    return out


def _figure(panel: Panel, key: tuple, sub: pd.DataFrame, ctx: Context) -> FigureFile:
    title = facet_title(panel["facets"], key)
    x = panel["x"]
    fig = new_figure(9.0, 3.5)
    ax_bw, ax_lat = fig.subplots(1, 2, squeeze=True)
    handles = {}
    for ax in (ax_bw, ax_lat):
        setup_x(ax, sub[x].tolist(), x, log2=True)
    # colour: the backend; line style: the page size (contiguous solid, then -- : -.)
    pages = sorted(sub.page_size.unique())
    styles = {p: LINE_STYLES[i % len(LINE_STYLES)] for i, p in enumerate(pages)}
    for (backend, page), s in sub.groupby(["backend", "page_size"], sort=True):
        name = f"{backend} p{int(page)}"
        agg = s.groupby(x).agg(gbps=("fwd_gbps", "median"), ms=("fwd_median_ms", "median"))
        color, style = ctx.color(str(backend)), styles[page]
        (line,) = ax_bw.plot(agg.index, agg.gbps, marker="o", ms=3.5, lw=1.6, ls=style,
                             color=color)
        ax_lat.plot(agg.index, agg.ms, marker="o", ms=3.5, lw=1.6, ls=style, color=color)
        handles[str(name)] = line
    ax_bw.set_title("achieved bandwidth")
    ax_bw.set_ylabel("GB/s")
    ax_bw.set_ylim(bottom=0)
    _bandwidth_axis(ax_bw, sub)
    ax_lat.set_title("latency (forward)")
    ax_lat.set_ylabel("ms (median)")
    ax_lat.set_yscale("log")
    caption = (f"{title}: decode, median GB/s (against the minimal traffic: cache read once, "
               "q, out, block table) and median latency per cache length; colour: backend, "
               "line style: page size (pN: N tokens per page; p0, solid when present: a "
               "contiguous cache)")
    return finish_figure(fig, ctx, f"{panel.slug}-{slug(title)}", caption, title=title,
                         legend=handles)


def _bandwidth_axis(ax, sub: pd.DataFrame) -> None:
    """A right axis in percent of the datasheet bandwidth, when every point has the same."""
    rows = sub[sub.fwd_pct_peak_bandwidth.notna() & (sub.fwd_pct_peak_bandwidth > 0)]
    if rows.empty or len(rows) < len(sub):
        return
    peaks = rows.fwd_gbps / (rows.fwd_pct_peak_bandwidth / 100.0)
    peak = float(peaks.median())
    if not np.allclose(peaks, peak, rtol=0.02):
        return  # several devices share this axis: no single percentage
    sec = ax.secondary_yaxis("right", functions=(lambda g: g / peak * 100.0,
                                                 lambda p: p * peak / 100.0))
    sec.set_ylabel("% of peak bandwidth")
    ax.spines["right"].set_visible(True)
