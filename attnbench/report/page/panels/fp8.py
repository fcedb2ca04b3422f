"""The ``fp8`` panel: how much of an fp8 case's error is the kernel's and how much quantization's,
and how much faster fp8 is than bf16.

Left: per backend and fp8 format, the median relative L2 error of the output split as
:mod:`attnbench.accuracy.fp8_split` measures it -- the kernel's (against exact attention on the
dequantized inputs; what the verdict judges) beside the quantization's (exact on the dequantized
vs exact on the original inputs) -- on a log axis. Right: the forward's speed-up, bf16 median
time over fp8 median time of the same backend on the same case (every field but dtype and
fp8_scaling equal), median over the pairs; a dashed line at 1. One figure per facet (by default
the GPU kind).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnbench.dtypes import FP8_DTYPES
from attnbench.report.page.dashboard import Panel
from attnbench.report.page.figures import (Context, FigureFile, PanelOutput, cap_note,
                                           facet_groups, facet_title, finish_figure, mpl_text,
                                           new_figure, slug)
from attnbench.report.read.data import Run, apply_filter
from attnbench.results.records import RAN_VERDICTS
from attnbench.sweep.case import case_fields

PAIR_FREE = ("dtype", "fp8_scaling", "fp8_promotion", "backward", "gpu")
"""Case fields in which an fp8 case and the bf16 case it is timed against may differ (``gpu``:
the kind it ran on, ``gpu_kind``, is paired instead: a sweep's ``any`` runs anywhere)."""
PAIR_KEYS = (*case_fields(without=PAIR_FREE), "gpu_kind")
"""Columns the two share: every other case field, so a new field pairs by itself (a hand-kept
list lacked dropout, cp, cp_algo, tp, decode and page_size, and timed an fp8 case against a
bf16 case of another world size)."""


def draw_fp8(panel: Panel, run: Run, ctx: Context) -> PanelOutput:
    out = PanelOutput(panel)
    df = apply_filter(run.frame, panel.include, panel.exclude)
    if "dtype" not in df or not df.dtype.isin(FP8_DTYPES).any():
        out.notes.append(f"No fp8 cases (dtype: {' or '.join(FP8_DTYPES)}) in this run.")
        return out
    groups = list(facet_groups(df[df.dtype.isin(FP8_DTYPES + ("bf16",))], panel["facets"]))
    groups = [(key, sub) for key, sub in groups if sub.dtype.isin(FP8_DTYPES).any()]
    for key, sub in groups[: panel["max_figures"]]:
        out.figures.append(_figure(panel, key, sub, ctx))
    if (df.get("device_name") == "cpu").any() or (df.get("gpu_kind") == "cpu").any():
        out.notes.append("On CPU the Triton kernels run in the interpreter: their speed-ups "
                         "measure it, not a GPU's fp8 tensor cores.")
    if len(groups) > panel["max_figures"]:
        out.notes.append(cap_note(panel, len(groups) - panel["max_figures"], "facets",
                                  len(groups)))
    return out


def speedups(sub: pd.DataFrame) -> pd.DataFrame:
    """One row per (fp8 case, bf16 case) pair of the same backend and problem, timed both:
    backend, dtype (the fp8 one) and speedup = bf16 median ms / fp8 median ms."""
    timed = sub[sub.verdict.isin(RAN_VERDICTS) & sub.fwd_median_ms.notna()
                & (sub.fwd_median_ms > 0)]
    keys = [k for k in PAIR_KEYS if k in timed]
    # one string per problem: the cells mix None, numbers and tuples (packed lengths)
    timed = timed.assign(_pair=timed[keys].apply(lambda row: "|".join(map(str, row)), axis=1))
    fp8 = timed[timed.dtype.isin(FP8_DTYPES)]
    bf16 = timed[timed.dtype == "bf16"].groupby("_pair").fwd_median_ms.median()
    if fp8.empty or bf16.empty:
        return pd.DataFrame(columns=["backend", "dtype", "speedup"])
    pairs = fp8.join(bf16.rename("bf16_ms"), on="_pair", how="inner")
    return pd.DataFrame({"backend": pairs.backend, "dtype": pairs.dtype,
                         "speedup": pairs.bf16_ms / pairs.fwd_median_ms})


def _tick(backend: str, dtype: str, n: int) -> str:
    """Three short lines: neighbouring bars' labels must not run into each other."""
    return f"{mpl_text(backend)}\n{dtype.removeprefix('fp8_')}\nn={n}"


def _figure(panel: Panel, key: tuple, sub: pd.DataFrame, ctx: Context) -> FigureFile:
    title = facet_title(panel["facets"], key)
    fig = new_figure(9.0, 3.6)
    ax_err, ax_speed = fig.subplots(1, 2, squeeze=True)
    judged = sub[sub.dtype.isin(FP8_DTYPES) & sub.fp8_kernel_rel_l2.notna()]
    split = judged.groupby(["backend", "dtype"], sort=True).agg(
        kernel=("fp8_kernel_rel_l2", "median"), quantization=("fp8_quantization_rel_l2", "median"),
        n=("fp8_kernel_rel_l2", "size"))
    handles = {}
    x = np.arange(len(split))
    if len(split):
        colors = [ctx.color(str(b)) for b, _ in split.index]
        kernel = ax_err.bar(x - 0.2, split.kernel, 0.4, color=colors, edgecolor="black", lw=0.4)
        quant = ax_err.bar(x + 0.2, split.quantization, 0.4, color="white", edgecolor=colors,
                           hatch="///", lw=0.8)
        handles["kernel error (vs exact on the dequantized inputs)"] = kernel
        handles["quantization error (exact: dequantized vs original inputs)"] = quant
        ax_err.set_yscale("log")
        ax_err.set_xticks(x, [_tick(b, d, n) for (b, d), n in zip(split.index, split.n)],
                          fontsize=7)
    else:
        ax_err.text(0.5, 0.5, "no judged fp8 case", ha="center", va="center",
                    transform=ax_err.transAxes)
    ax_err.set_title("output error split (median rel. L2)")
    ax_err.set_ylabel("relative L2 error")
    ratios = speedups(sub)
    agg = ratios.groupby(["backend", "dtype"], sort=True).speedup.agg(["median", "size"])
    if len(agg):
        xs = np.arange(len(agg))
        ax_speed.bar(xs, agg["median"], 0.6, color=[ctx.color(str(b)) for b, _ in agg.index])
        ax_speed.axhline(1.0, color="black", lw=0.8, ls="--")
        ax_speed.set_xticks(xs, [_tick(b, d, n) for (b, d), n in zip(agg.index, agg["size"])],
                            fontsize=7)
    else:
        ax_speed.text(0.5, 0.5, "no fp8 case timed beside\nthe same bf16 case", ha="center",
                      va="center", transform=ax_speed.transAxes)
    ax_speed.set_title("forward speed-up over bf16")
    ax_speed.set_ylabel("bf16 time / fp8 time")
    caption = (f"{title}: left, per backend and fp8 format, the median relative L2 error of "
               "the output against exact attention on the dequantized fp8 inputs (the kernel's "
               "share, judged; solid) beside the error quantizing q, k, v costs on its own "
               "(hatched); right, the forward speed-up over the same backend's bf16 run of the "
               "same case (median over the pairs; above 1: fp8 is faster)")
    return finish_figure(fig, ctx, f"{panel.slug}-{slug(title)}", caption, title=title,
                         legend=handles)
