"""The ``error_vs_seqlen`` panel: relative L2 error against fp64 as the sequence grows.

One figure per facet, one subplot per tensor: cases as dots, the median per length as a line
per series, the median bound dashed, cases over their own bound ringed in red. Error that grows
faster than the bound is the finding even when every case passes.
"""

from __future__ import annotations

from typing import Any

from matplotlib.lines import Line2D

from attnbench.report.page.dashboard import Panel
from attnbench.report.read.data import Run, apply_filter
from attnbench.report.page.figures import (OTHER_LENGTH_LEGEND, TENSOR_LABELS, Context,
                                           PanelOutput, cap_note, facet_groups, facet_title,
                                           finish_figure, length_lines, mark_other_lengths,
                                           new_figure, positions, setup_x, slug)
from attnbench.report.page.style import VERDICT_COLORS
from attnbench.results.records import RAN_VERDICTS, TENSORS


def draw_error_vs_seqlen(panel: Panel, run: Run, ctx: Context) -> PanelOutput:
    out = PanelOutput(panel)
    x, series, facets = panel["x"], panel["series"], panel["facets"]
    tensors = [t for t in panel["tensors"] if t in TENSORS]  # identities have no rel. L2
    df = apply_filter(run.frame, panel.include, panel.exclude)
    df = df[df.verdict.isin(RAN_VERDICTS)]
    df = df[df[[f"{t}_rel_l2" for t in tensors]].notna().any(axis=1)] if len(df) else df
    if df.empty:
        out.notes.append("No accuracy numbers: accuracy was off or no case ran to the end.")
        return out
    groups = list(facet_groups(df, facets))
    if len(groups) > panel["max_figures"]:
        out.notes.append(cap_note(panel, len(groups) - panel["max_figures"],
                                  f"combinations of {', '.join(facets)}", len(groups)))
    for key, sub in groups[:panel["max_figures"]]:
        title = facet_title(facets, key)
        fig = new_figure(2.9 * len(tensors) + 0.4, 3.4)
        axes = fig.subplots(1, len(tensors), squeeze=False, sharey=True)[0]
        handles: dict[str, Any] = {}
        extra: dict[str, Any] = {}  # after the series in the legend
        other_lengths = False
        for ax, t in zip(axes, tensors):
            pos = setup_x(ax, sub[x].tolist(), x)
            ax.set_yscale("log")
            ax.set_title(TENSOR_LABELS[t])
            col = f"{t}_rel_l2"
            # The bound's line follows the Sq == Sk cases only, as the series' lines do; dotted,
            # so it is not read as a dashed Sq != Sk line.
            square = next((rows for label, rows in length_lines(sub, x) if not label), sub[:0])
            bound = square[[x, f"{t}_bound"]].dropna().groupby(x)[f"{t}_bound"].median()
            if len(bound):
                # a bound at a single x (a smoke run) is a line of one point: mark it
                (bl,) = ax.plot([pos(v) for v in bound.index], bound.values, ls=":", lw=1.4,
                                color="#444444", zorder=1, ms=14,
                                marker="_" if len(bound) == 1 else "")
                extra.setdefault("bound (median)", bl)
            ends: dict[str, tuple[list, list]] = {}  # Sq != Sk line -> where its label goes
            for name, s in sub.groupby(series, sort=True):
                s = s[s[col].notna() & (s[col] > 0)]
                if s.empty:
                    continue
                style = ctx.style(name)
                color = style["color"]
                ax.scatter(positions(pos, s[x]), s[col], s=9, color=color, alpha=0.35, lw=0)
                failed = s[s[f"{t}_over"] > 1]
                if len(failed):
                    fl = ax.scatter(positions(pos, failed[x]), failed[col], s=30,
                                    facecolors="none", edgecolors=VERDICT_COLORS["fail"], lw=1.1,
                                    zorder=4)
                    extra.setdefault("over its bound", fl)
                for other, rows in length_lines(s, x):
                    med = rows.groupby(x)[col].median()
                    xs = [pos(v) for v in med.index]
                    ax.plot(xs, med.values, ms=3, lw=1.5, zorder=3,
                            **{**style, "ls": "--"} if other else style)
                    if other:
                        other_lengths = True
                        if other not in ends or med.values[-1] > ends[other][1][-1]:
                            ends[other] = ([xs[-1]], [float(med.values[-1])])
                handles.setdefault(str(name), Line2D([], [], ms=3, lw=1.5, **style))
            mark_other_lengths(ax, ends)
        if other_lengths:
            extra[OTHER_LENGTH_LEGEND] = Line2D([], [], ls="--", color="#444444", lw=1.5)
        handles.update(extra)
        axes[0].set_ylabel("relative L2 error vs fp64")
        out.figures.append(finish_figure(
            fig, ctx, f"{panel.slug}-{slug(title)}",
            f"{title}: dots are cases, lines the median per {x}; dashed grey: the median bound; "
            "red rings: over their own bound" + ("; dashed colour: cases with seqlen_q != "
                                                 "seqlen_kv, one line per other length "
                                                 "(labelled)" if other_lengths else "") + ".",
            title=f"Error vs {x}: {title}" if title else f"Error vs {x}", legend=handles))
    return out

