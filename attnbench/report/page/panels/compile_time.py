"""The ``compile`` panel: what Triton compiling cost the run, per kernel variant, apart from the
timed figures.

Each record of a case that launched Triton kernels carries a ``compile`` section
(:mod:`attnbench.execution.kernel_settings`): the seconds spent compiling during that case and
the kernels compiled, the autotuner's benchmarking seconds, the config mode and the compile
variant (:func:`attnbench.kernels.warm.label`). A variant's first case pays; later cases of
the same variant load the kernels from memory (0 s). Bars: total compile seconds per variant
(solid) and autotuning seconds (hatched) over the run's records, longest first, labelled with
the kernels compiled and the cases that paid. One figure per facet (by default the GPU kind).
Timed figures never include any of it: compiles happen before the timing loop's warm-up.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnbench.report.page.dashboard import Panel
from attnbench.report.read.data import Run, apply_filter
from attnbench.report.page.figures import (Context, FigureFile, PanelOutput, cap_note,
                                           facet_groups, facet_title, finish_figure, mpl_text,
                                           new_figure, slug)


COMPILE_COLOR = "0.45"
"""A grey: no backend's colour (these bars are the harness's cost, not a backend's result)."""


def compile_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (compile mode, variant): seconds, autotune_s, kernels (sums over records), cases
    (records that compiled anything) and records; longest first."""
    rows = df[df.compile_variant.notna() | df.compile_mode.notna()]
    rows = rows.assign(compile_variant=rows.compile_variant.fillna("(other Triton kernels)"),
                       paid=(rows.compile_kernels > 0).astype(int))
    table = rows.groupby(["compile_mode", "compile_variant"], sort=False).agg(
        seconds=("compile_s", "sum"), autotune_s=("compile_autotune_s", "sum"),
        kernels=("compile_kernels", "sum"), cases=("paid", "sum"), records=("id", "size"))
    return table.sort_values(["seconds", "autotune_s"], ascending=False)


def draw_compile(panel: Panel, run: Run, ctx: Context) -> PanelOutput:
    out = PanelOutput(panel)
    df = apply_filter(run.frame, panel.include, panel.exclude)
    if "compile_mode" not in df or not df.compile_mode.notna().any():
        out.notes.append("No record of this run carries a compile section (no Triton kernel of "
                         "ours ran, or the records predate it).")
        return out
    df = df[df.compile_mode.notna()]
    groups = list(facet_groups(df, panel["facets"]))
    for key, sub in groups[: panel["max_figures"]]:
        out.figures.append(_figure(panel, key, sub, ctx, out))
    if df.compile_interpreted.all():
        out.notes.append("Every case ran under Triton's interpreter, which compiles nothing: "
                         "0 s is expected here; a GPU run shows what compiling costs.")
    if df.compile_s.isna().any():
        out.notes.append("Some records have no compile seconds: their Triton has no JIT "
                         "compile hooks (3.4+).")
    if len(groups) > panel["max_figures"]:
        out.notes.append(cap_note(panel, len(groups) - panel["max_figures"], "facets",
                                  len(groups)))
    return out


def _figure(panel: Panel, key: tuple, sub: pd.DataFrame, ctx: Context,
            out: PanelOutput) -> FigureFile:
    title = facet_title(panel["facets"], key)
    table = compile_table(sub)
    shown = table.head(panel["max_rows"])
    if len(table) > len(shown):
        out.notes.append(f"{title}: {len(table) - len(shown)} more variants not drawn (max_rows="
                         f"{panel['max_rows']}); together {table.seconds[len(shown):].sum():.1f} "
                         "s of compiling.")
    fig = new_figure(9.0, 1.2 + 0.28 * max(len(shown), 1))
    ax = fig.subplots()
    y = np.arange(len(shown))[::-1]
    handles = {}
    if len(shown):
        handles["compile s (Triton JIT hooks)"] = ax.barh(
            y, shown.seconds.fillna(0), 0.6, color=COMPILE_COLOR, edgecolor="black", lw=0.4)
        handles["autotune s (benchmarking configs)"] = ax.barh(
            y, shown.autotune_s.fillna(0), 0.6, left=shown.seconds.fillna(0), color="white",
            edgecolor="grey", hatch="///", lw=0.6)
        ax.set_yticks(y, [mpl_text(variant if variant.endswith(str(mode))
                                   else f"{variant} ({mode})") for mode, variant in shown.index],
                      fontsize=7)
        ends = (shown.seconds.fillna(0) + shown.autotune_s.fillna(0)).to_numpy()
        for yy, end, (_, row) in zip(y, ends, shown.iterrows()):
            ax.text(end, yy, f"  {int(row.kernels)} kernels, {int(row.cases)}/{int(row.records)}"
                    " cases paid", va="center", fontsize=6.5)
        ax.set_xlim(0, max(float(ends.max()), 1.0) * 1.35)
    ax.set_xlabel("seconds, summed over the run's records")
    total = table.seconds.sum() + table.autotune_s.sum()
    caption = (f"{title}: Triton compile seconds (solid) and autotuning seconds (hatched) per "
               f"compile variant and config mode, summed over the run's records ({total:.1f} s "
               "in all); kernels compiled and the cases that paid beside each bar. None of it is "
               "in the timed figures.")
    return finish_figure(fig, ctx, f"{panel.slug}-{slug(title)}", caption, title=title,
                         legend=handles)
