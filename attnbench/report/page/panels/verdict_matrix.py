"""The ``verdict_matrix`` panel: verdict counts in a grid of two columns of the frame
(by default feature combination x backend), each cell in the colour of its worst verdict.
"timed" cases (accuracy not checked) count as "not judged", ranked above pass: a cell with one
is never green."""

from __future__ import annotations

import numpy as np
from matplotlib.patches import Patch, Rectangle

from attnbench.report.page.dashboard import Panel
from attnbench.report.read.data import Run, apply_filter
from attnbench.report.page.figures import (Context, PanelOutput, legend_below, mpl_text,
                                      natural_key, new_figure, save_figure)
from attnbench.report.page.style import VERDICT_COLORS, text_color_on, verdict_label, worst
from attnbench.results.records import SEVERITY


def draw_verdict_matrix(panel: Panel, run: Run, ctx: Context) -> PanelOutput:
    out = PanelOutput(panel)
    rows_col, cols_col = panel["rows"], panel["columns"]
    df = apply_filter(run.frame, panel.include, panel.exclude,
                      columns=[rows_col, cols_col, "verdict"])
    if df.empty:
        out.notes.append("No cases after this panel's filter.")
        return out
    row_vals = sorted(df[rows_col].astype(str).unique(), key=natural_key)
    col_vals = sorted(df[cols_col].astype(str).unique(), key=natural_key)
    counts = df.assign(_r=df[rows_col].astype(str), _c=df[cols_col].astype(str)).groupby(
        ["_r", "_c"]).verdict.value_counts()
    max_lines = 1
    cells: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for (r, c, v), n in counts.items():
        cells.setdefault((r, c), []).append((v, int(n)))
    for key, items in cells.items():
        items.sort(key=lambda vn: SEVERITY.index(vn[0]) if vn[0] in SEVERITY else 99)
        max_lines = max(max_lines, len(items))
    row_h = 0.2 + 0.15 * max_lines
    label_chars = max(len(s) for s in row_vals)
    fig = new_figure(1.5 + 0.065 * label_chars + 1.15 * len(col_vals), 1.5 + row_h * len(row_vals))
    ax = fig.add_subplot()
    ax.grid(False)
    ax.spines[:].set_visible(False)
    for i, r in enumerate(row_vals):
        for j, c in enumerate(col_vals):
            items = cells.get((r, c))
            if not items:
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor="#fafafa", edgecolor="white",
                                       lw=1.5))
                ax.text(j + 0.5, i + 0.5, "–", ha="center", va="center", color="#bbbbbb")
                continue
            w = worst(v for v, _ in items)
            color = VERDICT_COLORS[w]
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor=color, edgecolor="white", lw=1.5))
            ax.text(j + 0.5, i + 0.5, "\n".join(f"{n} {verdict_label(v)}" for v, n in items),
                    ha="center", va="center", fontsize=7, color=text_color_on(color),
                    linespacing=1.15)
    for text in ax.texts:  # inside their cells: nothing for the layout to make room for
        text.set_in_layout(False)
    ax.set_xlim(0, len(col_vals))
    ax.set_ylim(len(row_vals), 0)
    ax.set_xticks(np.arange(len(col_vals)) + 0.5, [mpl_text(c) for c in col_vals])
    ax.xaxis.tick_top()
    ax.set_xlabel(cols_col)
    ax.xaxis.set_label_position("top")
    ax.set_yticks(np.arange(len(row_vals)) + 0.5, [mpl_text(r) for r in row_vals])
    ax.set_ylabel(rows_col)
    ax.tick_params(length=0)
    seen = set(df.verdict.unique())  # once, not per verdict (10 passes over 10^6 rows: ~9 s)
    present = [v for v in SEVERITY if v in seen]
    legend_below(fig, [Patch(color=VERDICT_COLORS[v]) for v in present],
                 [verdict_label(v) for v in present],
                 title="cell colour = worst verdict in the cell")
    fig.suptitle(f"Verdict counts: {rows_col} x {cols_col}", fontsize=10, fontweight="bold")
    out.figures.append(save_figure(fig, ctx, panel.slug, f"{len(df)} cases; each cell counts "
                                   "verdicts and takes the colour of its worst one."))
    return out

