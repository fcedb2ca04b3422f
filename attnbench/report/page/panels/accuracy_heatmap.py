"""The ``accuracy_heatmap`` panel: error over bound, one row per case, one column per check.

Columns are the tensors against fp64, the reference-free identities and (in multi-rank runs)
parity; a cell is green under its bound and red over it, and a case that died is one hatched
row naming its verdict. Cases timed with ``accuracy: false`` ("not judged") have no errors to
show: they are left out and counted in a note, unless a NaN/Inf failed them.
"""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.collections import PolyCollection
from matplotlib.colors import ListedColormap, LogNorm, to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from attnbench.report.page.dashboard import Panel
from attnbench.report.read.data import Run, apply_filter
from attnbench.report.page.figures import (TENSOR_LABELS, Context, PanelOutput, legend_below, mpl_text,
                                      new_figure, save_figure)
from attnbench.report.page.style import VERDICT_COLORS, text_color_on, verdict_label
from attnbench.results.records import DIED_VERDICTS, RAN_VERDICTS, SEVERITY, TENSORS


def over_cmap(steps: int = 128) -> ListedColormap:
    """Under the bound: pale to mid green (deeper = closer to failing). Over it: red to dark
    red. The hue flips exactly at error == bound."""
    def ramp(a: str, b: str) -> list[tuple[float, float, float]]:
        ca, cb = np.array(to_rgb(a)), np.array(to_rgb(b))
        return [tuple(ca + (cb - ca) * i / (steps - 1)) for i in range(steps)]

    return ListedColormap(ramp("#f2faef", "#5fb56a") + ramp("#f0593f", "#5c0010"), name="over")


def heatmap_rows(panel: Panel, run: Run) -> pd.DataFrame:
    """The heatmap's rows in order: the panel's filter, then cases with accuracy numbers or
    that died (crash, timeout, ...), sorted by the panel's ``sort``."""
    tensors = panel["tensors"]
    df = apply_filter(run.frame, panel.include, panel.exclude)
    if df.empty:
        return df
    has_acc = df[[f"{t}_over" for t in tensors]].notna().any(axis=1)
    df = df[has_acc | ~df.verdict.isin(RAN_VERDICTS)]
    sort = panel["sort"]
    rank = {v: i for i, v in enumerate(SEVERITY)}
    if sort == "verdict":  # worst verdict first, patterns (features) together within a verdict
        keys = ["_r", "features", "backend", "dtype", "seqlen_q", "label"]
        df = df.assign(_r=df.verdict.map(rank))
    elif sort == "worst":
        keys = ["_r", "_w", "label"]
        df = df.assign(_r=df.verdict.map(rank), _w=-df.worst_over.fillna(-1))
    elif sort == "label":
        keys = ["label"]
    else:
        keys = ["features", "backend", "dtype", "seqlen_q", "label"]
    return df.sort_values(keys, kind="stable")


def draw_accuracy_heatmap(panel: Panel, run: Run, ctx: Context) -> PanelOutput:
    out = PanelOutput(panel)
    tensors = panel["tensors"]
    if apply_filter(run.frame, panel.include, panel.exclude).empty:
        out.notes.append("No cases after this panel's filter.")
        return out
    df = heatmap_rows(panel, run)
    every = apply_filter(run.frame, panel.include, panel.exclude)
    unjudged = int((every.verdict == "timed").sum())
    if unjudged:
        out.notes.append(f"{unjudged} case(s) ran with accuracy: false: timed and checked for "
                         f"NaN/Inf only, {verdict_label('timed')}; they have no errors to show "
                         "and are not in this heatmap.")
    if df.empty:
        out.notes.append("No accuracy data: accuracy was off for every case that ran.")
        return out
    # A check no case of this run made (parity in a single-device run; dQ, dK, dV in a
    # forward-only run) is not a column -- unless no tensor has a value at all (all died).
    made = [t for t in tensors if df[f"{t}_over"].notna().any()]
    tensors = made if any(t in TENSORS for t in made) else \
        [t for t in tensors if t in TENSORS or t in made]
    n_parts = max(1, math.ceil(len(df) / panel["max_rows"]))
    per_part = math.ceil(len(df) / n_parts)
    decades = panel["decades"]
    norm = LogNorm(vmin=10.0 ** -decades, vmax=10.0 ** decades)
    cmap = over_cmap()
    bad = int(df.verdict.isin(("fail",) + DIED_VERDICTS).sum())
    for part in range(n_parts):
        chunk = df.iloc[part * per_part:(part + 1) * per_part]
        suffix = f" (part {part + 1} of {n_parts})" if n_parts > 1 else ""
        annotate = len(chunk) <= 70  # past that the cells are too small to read
        fig = heatmap_figure(chunk, tensors, norm, cmap, annotate=annotate)
        fig.suptitle(heatmap_title(suffix, annotate), fontsize=10, fontweight="bold")
        caption = (f"{len(chunk)} cases{suffix}; {bad} of {len(df)} cases in this panel failed, "
                   "crashed, timed out or ran out of memory. Green: under the bound; red: over "
                   "it; hatched: no numbers (the case died).")
        out.figures.append(save_figure(fig, ctx, f"{panel.slug}-part{part + 1}", caption))
    return out


def heatmap_title(suffix: str, annotate: bool) -> str:
    """What the colour means, where the eye lands; the brackets only where cells carry them."""
    return (f"Error over bound per case: tensors vs fp64, identities, parity{suffix}\n"
            "colour: error / that case's own bound (not the error itself)"
            + ("; in brackets: the raw rel. L2 error" if annotate else ""))


def heatmap_figure(chunk: pd.DataFrame, tensors: list[str], norm: LogNorm, cmap,
                   annotate: bool) -> Figure:
    """Rows of ``chunk`` (frame rows) x ``tensors``, coloured by ``<t>_over``. Every value over
    1 is written in its cell; rows of cases that died are one hatched cell naming the verdict."""
    rows = len(chunk)
    label_chars = max(len(str(s)) for s in chunk.label) if rows else 10
    # annotated cells hold "0.45 (1.9e-03)": the ratio, and the raw error beside it, since a
    # tight bound colours a small error deep (issue 27: the lowest error looked worst)
    width = 2.6 + 0.055 * label_chars + (1.1 if annotate else 0.75) * len(tensors)
    height = 1.6 + 0.175 * rows
    fig = new_figure(width, height)
    ax = fig.add_subplot()
    ax.grid(False)
    ax.spines[:].set_visible(False)
    values = chunk[[f"{t}_over" for t in tensors]].to_numpy(dtype=float)
    finite = np.where(np.isfinite(values), values, np.nan)
    masked = np.ma.masked_invalid(np.clip(finite, norm.vmin, norm.vmax))
    cell_rgba = cmap(norm(masked))  # every cell's colour at once (a norm call per cell is slow)
    mesh = ax.pcolormesh(np.arange(len(tensors) + 1), np.arange(rows + 1), masked, cmap=cmap,
                         norm=norm, edgecolors="white", linewidth=0.6)
    ax.set_xlim(-0.35, len(tensors))
    ax.set_ylim(rows, 0)
    # a verdict strip left of the cells, in the verdict's colour (one artist for all rows)
    ax.add_collection(PolyCollection(
        [[(-0.32, i + 0.08), (-0.10, i + 0.08), (-0.10, i + 0.92), (-0.32, i + 0.92)]
         for i in range(rows)], facecolors=[VERDICT_COLORS.get(v, "#777777")
                                            for v in chunk.verdict],
        edgecolors="none", clip_on=False), autolim=False)
    for i, r in enumerate(chunk.itertuples(index=False)):
        verdict = r.verdict
        if verdict in DIED_VERDICTS and np.isnan(values[i]).all():
            color = VERDICT_COLORS[verdict]
            ax.add_patch(Rectangle((0, i), len(tensors), 1, facecolor=color, edgecolor="white",
                                   hatch="////", linewidth=0.6))
            text = verdict.upper()
            if isinstance(r.crash_signal, str) and r.crash_signal:
                text += f" {r.crash_signal}"
            ax.text(len(tensors) / 2, i + 0.5, text, ha="center", va="center", fontsize=7,
                    fontweight="bold", color=text_color_on(color),
                    bbox=dict(boxstyle="round,pad=0.15", fc=color, ec="none"))
            continue
        for j, t in enumerate(tensors):
            v = values[i, j]
            if np.isinf(v):
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor=VERDICT_COLORS["error"],
                                       edgecolor="white", linewidth=0.6))
                ax.text(j + 0.5, i + 0.5, "NaN/Inf", ha="center", va="center", fontsize=6.5,
                        color="white", fontweight="bold")
            elif np.isnan(v):
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor="#eeeeee", edgecolor="white",
                                       linewidth=0.6))
                ax.text(j + 0.5, i + 0.5, "n/a", ha="center", va="center", fontsize=6.5,
                        color="#888888")
            elif annotate or v > 1:
                fg = text_color_on(matplotlib.colors.to_hex(cell_rgba[i, j]))
                raw = getattr(r, f"{t}_rel_l2", None) if annotate else None
                shown = isinstance(raw, (int, float)) and np.isfinite(raw)
                text = f"{v:.2g}" + (f" ({raw:.1e})" if shown else "")
                ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=6.5,
                        color=fg, fontweight="bold" if v > 1 else "normal")
    for text in ax.texts:  # inside their cells: nothing for the layout to make room for
        text.set_in_layout(False)
    ax.set_xticks(np.arange(len(tensors)) + 0.5, [TENSOR_LABELS[t] for t in tensors])
    ax.xaxis.tick_top()
    ax.tick_params(axis="x", length=0, labelsize=9)
    ax.set_yticks(np.arange(rows) + 0.5, [mpl_text(s) for s in chunk.label], fontsize=7,
                  fontfamily="monospace")
    ax.tick_params(axis="y", length=0, pad=14)
    for tick, verdict in zip(ax.get_yticklabels(), chunk.verdict):
        if verdict != "pass":
            tick.set_color(VERDICT_COLORS.get(verdict, "#000"))
            tick.set_fontweight("bold")
    cbar = fig.colorbar(mesh, ax=ax, extend="both", shrink=min(1.0, 6.0 / height), aspect=25,
                        pad=0.02)
    cbar.set_label("rel. L2 error / bound  (> 1 fails)")
    cbar.ax.axhline(1.0, color="black", lw=1.2)
    verdicts = [v for v in SEVERITY if v in set(chunk.verdict)]
    legend_below(fig, [Patch(color=VERDICT_COLORS[v]) for v in verdicts],
                 [verdict_label(v) for v in verdicts], title="verdict (strip left of the cells)")
    return fig

