"""The ``architecture`` panel: one GPU kind against another within one run.

The same cases on each GPU kind against the baseline kind: the throughput ratio per series,
with the ratio of the devices' peaks for reference. Across GPU kinds there are ratios, never
verdicts; a case whose verdict differs between kinds is named in a note.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from attnbench.report.page.dashboard import Panel
from attnbench.report.read.data import Run, apply_filter
from attnbench.report.read.reader import MATCH_KEY
from attnbench.report.page.figures import (DIRECTION_LABELS, OTHER_LENGTH, OTHER_LENGTH_LEGEND,
                                           Context, PanelOutput, finish_figure, length_lines,
                                           new_figure, positions, setup_x, slug, wrap_text)
from attnbench.report.page.style import verdict_label


MAX_CHANGED_NAMED = 20  # cases whose verdict differs between kinds, named in the note


def draw_architecture(panel: Panel, run: Run, ctx: Context) -> PanelOutput:
    out = PanelOutput(panel)
    x, series, dirs = panel["x"], panel["series"], panel["directions"]
    df = apply_filter(run.frame, panel.include, panel.exclude, columns=[
        "gpu_kind", MATCH_KEY, "verdict", x, series,
        *([OTHER_LENGTH[x]] if x in OTHER_LENGTH else []),
        *(f"{d}_{s}" for d in dirs for s in ("median_ms", "tflops", "pct_peak"))])
    kinds = sorted(k for k in df.gpu_kind.dropna().unique())
    if len(kinds) < 2:
        out.notes.append((f"One GPU kind in this run ({kinds[0]})" if kinds else
                          "No GPU kind in the records (env.gpu_kind)") +
                         "; `attnbench compare` sets runs from different GPUs side by side.")
        return out
    baseline = panel["baseline"] or max(kinds, key=lambda k: ((df.gpu_kind == k).sum(), k))
    if baseline not in kinds:
        out.notes.append(f"baseline {baseline!r} is not among this run's GPU kinds "
                         f"({', '.join(kinds)}).")
        return out
    df = df.assign(_key=df[MATCH_KEY])  # the case without gpu (report.reading)
    base = df[df.gpu_kind == baseline].drop_duplicates("_key").set_index("_key")
    changed: list[str] = []  # the first MAX_CHANGED_NAMED, counted in n_changed
    n_changed = 0
    for kind in kinds:
        if kind == baseline:
            continue
        other = df[(df.gpu_kind == kind) & df._key.isin(base.index)]
        if other.empty:
            out.notes.append(f"{kind}: no case in common with {baseline}.")
            continue
        b = base.loc[other._key]
        differ = other.verdict.to_numpy() != b.verdict.to_numpy()  # (a row each: 10^6 rows)
        n_changed += int(differ.sum())
        # labels only of the cases named (apply_filter keeps the frame's index)
        labels = run.frame.label.loc[other.index[differ]]
        for label, was, now in zip(labels, b.verdict[differ], other.verdict[differ]):
            if len(changed) == MAX_CHANGED_NAMED:
                break
            changed.append(f"{label}: {verdict_label(was)} on {baseline}, "
                           f"{verdict_label(now)} on {kind}")
        # directions this pair timed (a forward-only run drew an empty backward panel)
        timed = [d for d in dirs if (other[f"{d}_median_ms"].notna().to_numpy()
                                     & b[f"{d}_median_ms"].notna().to_numpy()).any()]
        if not timed:
            out.notes.append(f"{kind}: no case timed on both {kind} and {baseline}.")
            continue
        fig = new_figure(4.2 * len(timed) + 0.6, 3.5)
        # one y axis shared, labelled once: the right panel's label ran into the left panel
        axes = fig.subplots(1, len(timed), squeeze=False, sharey=True)[0]
        handles: dict[str, Any] = {}
        for ax, d in zip(axes, timed):
            ratio = b[f"{d}_median_ms"].to_numpy() / other[f"{d}_median_ms"].to_numpy()
            s_all = other.assign(ratio=ratio)
            s_all = s_all[np.isfinite(s_all.ratio)]
            pos = setup_x(ax, s_all[x].tolist(), x)
            ax.axhline(1.0, color="#444444", lw=1)
            peak_ratio = _peak_ratio(other, b, d)
            if peak_ratio:
                ax.axhline(peak_ratio, color="#888888", lw=1, ls="--")
                handles.setdefault("ratio of peaks",
                                   Line2D([], [], color="#888888", lw=1, ls="--"))
            for name, s in s_all.groupby(series, sort=True):
                style = ctx.style(name)
                ax.scatter(positions(pos, s[x]), s.ratio, s=9, color=style["color"], alpha=0.35,
                           lw=0)
                for other_length, rows in length_lines(s, x):  # Sq != Sk: lines of their own
                    med = rows.groupby(x).ratio.median()
                    ax.plot([pos(v) for v in med.index], med.values, ms=3.5, lw=1.5,
                            **{**style, "ls": "--"} if other_length else style)
                    if other_length:
                        handles.setdefault(OTHER_LENGTH_LEGEND,
                                           Line2D([], [], ls="--", color="#444444", lw=1.5))
                        ax.annotate(other_length, (pos(med.index[-1]), med.values[-1]),
                                    xytext=(4, 3), textcoords="offset points", fontsize=7,
                                    color="#444444")
                handles.setdefault(str(name), Line2D([], [], ms=3.5, lw=1.5, **style))
            ax.set_title(DIRECTION_LABELS[d])
            ax.set_ylim(bottom=0)
        axes[0].set_ylabel(wrap_text(f"throughput ratio {kind} / {baseline}", 2.6, 9))
        out.figures.append(finish_figure(
            fig, ctx, f"{panel.slug}-{slug(kind)}-vs-{slug(baseline)}",
            f"{len(other)} cases run on both {kind} and {baseline}; above 1: {kind} is faster. "
            "Ratios across GPU kinds, never verdicts.",
            title=f"{kind} against {baseline}: same cases, throughput ratio", legend=handles))
    if n_changed:
        more = " ..." if n_changed > MAX_CHANGED_NAMED else ""
        out.notes.append(f"{n_changed} case(s) have a different verdict on different GPU "
                         "kinds: " + "; ".join(changed) + more)
    return out


def _peak_ratio(other: pd.DataFrame, base: pd.DataFrame, d: str) -> float | None:
    def peak(df: pd.DataFrame) -> float | None:
        p = (df[f"{d}_tflops"] / (df[f"{d}_pct_peak"] / 100.0)).dropna()
        return float(p.median()) if len(p) else None

    a, b = peak(other), peak(base)
    return a / b if a and b else None

