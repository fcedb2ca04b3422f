"""The ``throughput`` panel: TFLOP/s against the sequence length, per backend and facet.

A facet measured at several lengths is a line plot (median, optional q1..q3 band, a percent of
peak axis when the device has a peak); facets measured at a single length are folded into
grouped horizontal bar charts that name the fastest series and say whether it clearly wins.
A point or bar holding a timing whose spread never settled (``noisy``) is drawn hollow or
hatched; a note gives each series' achieved GB/s and peak memory (per case: the records table).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from attnbench.report.page.dashboard import Panel
from attnbench.report.read.data import Run, apply_filter
from attnbench.report.page.figures import (DIRECTION_LABELS, OTHER_LENGTH, OTHER_LENGTH_LEGEND,
                                           Context, FigureFile, PanelOutput, cap_note,
                                           facet_groups, facet_title, finish_figure, length_lines,
                                           mark_other_lengths, new_figure, setup_x, slug)
from attnbench.report.page.panels.throughput_bars import draw_bars
from attnbench.report.page.panels.throughput_common import (bar_rows, facet_key, peak_axis,
                                                       throughput_stats)
from attnbench.report.page.style import fmt_bytes
from attnbench.results.records import RAN_VERDICTS


def _read_stats(dirs: list[str]) -> list[str]:
    """The timing columns the line plots, bar charts and notes read (and nothing else of the
    frame's ~100 columns: issue 29)."""
    return [f"{d}_{s}" for d in dirs for s in ("tflops", "median_ms", "q1_ms", "q3_ms", "n",
                                               "noisy", "pct_peak", "gbps", "peak_memory_bytes")]


def _throughput_frame(panel: Panel, run: Run) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the panel's rows, those of them timed that ran to the end)."""
    dirs = panel["directions"]
    every = apply_filter(run.frame, panel.include, panel.exclude, columns=[
        "id", "verdict", panel["x"], panel["series"], *panel["facets"], *_read_stats(dirs),
        *([OTHER_LENGTH[panel["x"]]] if panel["x"] in OTHER_LENGTH else [])])
    # one mask, one copy of the rows (two copies of 10^6 rows cost ~0.2 GB more)
    timed = every[[f"{d}_tflops" for d in dirs]].notna().any(axis=1)
    return every, every[every.verdict.isin(RAN_VERDICTS) & timed]


def _timed_directions(panel: Panel, df: pd.DataFrame, out: PanelOutput) -> tuple[Panel, list]:
    """The panel with only the directions some case timed: a forward-only run (decode, fp8,
    ``backward: false``) drew an empty backward subplot beside its forward (issue 27)."""
    dirs = list(panel["directions"])
    kept = [d for d in dirs if f"{d}_tflops" in df and df[f"{d}_tflops"].notna().any()]
    if not kept or kept == dirs:
        return panel, dirs
    dropped = [DIRECTION_LABELS.get(d, d) for d in dirs if d not in kept]
    out.notes.append(f"No case here timed the {' or '.join(dropped)} (forward-only cases): "
                     "not drawn.")
    return dataclasses.replace(panel, options={**panel.options, "directions": kept}), kept


def draw_throughput(panel: Panel, run: Run, ctx: Context) -> PanelOutput:
    """Throughput per facet (by default GPU kind x dtype x feature combination).

    A facet measured at two or more values of ``x`` is a line plot, at most ``max_figures`` of
    them. Facets with a single ``x`` (a smoke run, an ``include:`` case) would be one-point
    line plots: they are folded into one grouped horizontal bar chart per value of the other
    facets (GPU kind x dtype), one row per feature combination and one bar per series.
    """
    out = PanelOutput(panel)
    x, facets, dirs = panel["x"], panel["facets"], panel["directions"]
    every, df = _throughput_frame(panel, run)
    if df.empty:
        out.notes.append(
            "No case of this run matches this panel's filter." if panel.include and every.empty
            else "No timed cases: timing was off, or no case ran to the end.")
        return out
    panel, dirs = _timed_directions(panel, df, out)
    unit_scale, unit = (1.0, "TFLOP/s")
    top = np.nanmax(df[[f"{d}_tflops" for d in dirs]].to_numpy(dtype=float))
    if top < 1.0:  # CPU runs: GFLOP/s reads better than 0.00x TFLOP/s
        unit_scale, unit = (1e3, "GFLOP/s")
    groups = list(facet_groups(df, facets))
    curves = [(k, s) for k, s in groups if s[x].nunique() >= 2]
    single = [(k, s) for k, s in groups if s[x].nunique() < 2]
    cap = panel["max_figures"]

    drawn = set(_spread(curves, cap))
    line_figs = [_throughput_lines(panel, key, sub, ctx, unit_scale, unit)
                 for i, (key, sub) in enumerate(curves) if i in drawn]
    bar_figs: list[FigureFile] = []
    if single:
        bar_figs = draw_bars(panel, single, curves, every, ctx, unit_scale, unit)
        by = [f for f in facets if f not in bar_rows(facets)]
        out.notes.append(
            f"{len(single)} of {len(groups)} combinations of {', '.join(facets) or 'cases'} "
            f"were measured at a single {x}: they are folded into {len(bar_figs)} bar "
            f"chart(s) (one per {' x '.join(by) or 'panel'}) instead of one-point line plots.")
    # the view that covers more facets comes first (a smoke run: bars; a GPU sweep: lines)
    out.figures += bar_figs + line_figs if len(single) > len(curves) else line_figs + bar_figs
    if len(curves) > cap:
        hidden = [k for i, (k, _) in enumerate(curves) if i not in drawn]
        rest = [facet_title(facets, k) for k in hidden]
        shown = ", ".join(rest[:6]) + (f" and {len(rest) - 6} more" if len(rest) > 6 else "")
        out.notes.append(cap_note(
            panel, len(rest), "line plots", len(curves), named=shown,
            example=_filter_example(panel, hidden[0], facets)))
    if not any(df[f"{d}_pct_peak"].notna().any() for d in dirs):
        out.notes.append("No percent-of-peak axis: the device has no peak in the table "
                         "(timing.*.pct_peak is null, as on CPU).")
    out.notes += _memory_notes(df, series_col=panel["series"], dirs=dirs)
    return out


def _memory_notes(df: pd.DataFrame, series_col: str, dirs: list[str]) -> list[str]:
    """Beside TFLOP/s: each series' median achieved GB/s (against the minimal-traffic model,
    the figure that means something for memory-bound shapes) and its largest peak memory; and
    how many timings never settled. Per case, both are columns of the records table."""
    notes = []
    noisy = int(sum(df[f"{d}_noisy"].sum() for d in dirs))
    if noisy:
        notes.append(f"{noisy} timing(s) never settled (noisy: the spread stayed above the "
                     "target): their points are hollow, their bars hatched. Read them with care.")
    parts = []
    for name, s in df.groupby(series_col, sort=True):
        bits = [f"{d} {s[f'{d}_gbps'].median():.3g} GB/s" for d in dirs
                if s[f"{d}_gbps"].notna().any()]
        memory = s[[f"{d}_peak_memory_bytes" for d in dirs]].max().max()
        if not pd.isna(memory):
            bits.append(f"peak memory up to {fmt_bytes(memory)}")
        if bits:
            parts.append(f"{name}: {', '.join(bits)}")
    if parts:
        notes.append("Achieved bandwidth (median over cases, against the minimal memory traffic "
                     "of a fused kernel) and peak device memory: " + "; ".join(parts)
                     + ". Per case: the GB/s and peak mem columns of All records.")
    return notes


def _spread(curves: list, cap: int) -> list[int]:
    """Indices of at most ``cap`` facets, taken in turn from each value of the leading facets
    (GPU kind x dtype), so that a capped page still shows every GPU kind and dtype; within one,
    in turn from each attention kind (the first word of a feature combination: MHA, GQA, MQA),
    so that the MQA plots, last by name, are not the ones always left out (issue 40)."""
    groups: dict[tuple, list[int]] = {}
    for i, (key, _) in enumerate(curves):
        groups.setdefault(facet_key(key[:-1]), []).append(i)
    order, queues = [], [_by_attention_kind(q, curves) for q in groups.values()]
    while len(order) < cap and any(queues):
        for q in queues:
            if q and len(order) < cap:
                order.append(q.pop(0))
    return sorted(order)


def _by_attention_kind(indices: list[int], curves: list) -> list[int]:
    """``indices`` interleaved by the first word of their last facet: MHA causal, MQA causal,
    MHA none, MQA none (not MHA causal, MHA none, MQA causal, ...)."""
    seen: dict[str, int] = {}
    rank = {}
    for i in indices:
        word = (facet_key(curves[i][0][-1:]) or ("",))[0].split(" ")[0]
        rank[i] = seen.get(word, 0)
        seen[word] = rank[i] + 1
    return sorted(indices, key=lambda i: (rank[i], i))


def _filter_example(panel: Panel, key: tuple, facets: list[str]) -> str:
    """A filter: line for the YAML that keeps the facet ``key`` (not drawn) by its last facet
    (the feature combination), with the panel's own filter."""
    def scalar(v: Any) -> str:  # a YAML flow scalar: quoted when it holds , [ ] { } : # ...
        text = str(v)
        return json.dumps(text) if any(c in text for c in ",[]{}:#&*!|>'\"%@`") else text

    items = {col: list(vals) for col, vals in panel.include.items()}
    if facets:
        items[facets[-1]] = [facet_key(key[-1:])[0]]
    return "filter: {" + ", ".join(f"{col}: [{', '.join(scalar(v) for v in vals)}]"
                                   for col, vals in items.items()) + "}"


def _throughput_lines(panel: Panel, key: tuple, sub: pd.DataFrame, ctx: Context,
                      unit_scale: float, unit: str) -> FigureFile:
    x, series, facets = panel["x"], panel["series"], panel["facets"]
    # a forward-only facet (decode, fp8, backward: false) beside facets with a backward: no
    # empty backward subplot (the panel-wide check drops a direction no case of it timed)
    dirs = [d for d in panel["directions"] if sub[f"{d}_tflops"].notna().any()]
    title = facet_title(facets, key)
    fig = new_figure(4.2 * len(dirs) + 0.6, 3.5)
    axes = fig.subplots(1, len(dirs), squeeze=False)[0]
    handles: dict[str, Any] = {}
    many = noisy = other_lengths = False
    for ax, d in zip(axes, dirs):
        pos = setup_x(ax, sub[x].tolist(), x)
        ends: dict[str, tuple[list, list]] = {}  # Sq != Sk line -> where its label goes
        for name, s in sub.groupby(series, sort=True):
            style = ctx.style(name)
            for other, rows in length_lines(s, x):
                agg = throughput_stats(rows, d, unit_scale, by=x)
                if agg.empty:
                    continue
                many |= bool((agg.n > 1).any())
                xs = [pos(v) for v in agg.index]
                (line,) = ax.plot(xs, agg.t, ms=3.5, lw=1.6, **{**style, "ls": "--"} if other
                                  else style)
                if panel["band"]:
                    ax.fill_between(xs, agg.lo, agg.hi, color=style["color"], alpha=0.2, lw=0)
                if other:
                    other_lengths = True
                    top = ends.setdefault(other, ([], []))
                    if not top[1] or agg.t.iloc[-1] > top[1][-1]:
                        ends[other] = ([xs[-1]], [float(agg.t.iloc[-1])])
                # the legend's entry: the series' own style (its first line may be dashed)
                handles.setdefault(str(name), Line2D([], [], ms=3.5, lw=1.6, **style))
                if agg.noisy.any():  # hollow: a timing of this point never settled
                    ax.plot(np.array(xs)[agg.noisy.to_numpy()], agg.t[agg.noisy], ls="",
                            marker=style["marker"], ms=5.5, mfc="white", mec=style["color"],
                            mew=1.3, zorder=3)
                    noisy = True
        mark_other_lengths(ax, ends)
        ax.set_title(DIRECTION_LABELS[d])
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        peak_axis(ax, sub, d, unit_scale)
    caption = f"{title}: median {unit}" + (", median over cases per point" if many else "") + \
        (", band q1..q3" if panel["band"] else "") + \
        ("; hollow: noisy (a timing's spread never settled)" if noisy else "") + \
        ("; dashed: cases with seqlen_q != seqlen_kv, one line per other length (labelled), "
         "not joined to the Sq = Sk line" if other_lengths else "")
    if noisy:
        handles["hollow: noisy"] = Line2D([], [], ls="", marker="o", ms=5.5, mfc="white",
                                          mec="#444444")
    if other_lengths:
        handles[OTHER_LENGTH_LEGEND] = Line2D([], [], ls="--", color="#444444", lw=1.6)
    return finish_figure(fig, ctx, f"{panel.slug}-{slug(title)}", caption, title=title,
                         legend=handles)
