"""The ``error_trend`` panel: does a backend's error grow with the sequence faster than the fused
baseline's? (:mod:`attnbench.report.read.trends`)

One subplot per series (a backend and every case field but the lengths), findings first: the
backend's relative L2 error and the fused baseline's on the same inputs against keys, both log2,
with each fitted slope in the legend. A finding is titled in red: the error grows faster than the
baseline's, even if every case passed.
"""

from __future__ import annotations

import math

from attnbench.report.page.dashboard import Panel
from attnbench.report.read.data import Run
from attnbench.report.page.figures import (IN_A_DASHBOARD, TENSOR_LABELS, Context, PanelOutput,
                                           finish_figure, fmt_len, new_figure, plain_log_ticks,
                                           wrap_text)
from attnbench.report.page.style import VERDICT_COLORS
from attnbench.report.read.trends import GROWTH_BOUND, LEVEL_BOUND, MIN_LENGTHS, SLOPE_BOUND
from attnbench.report.read.trends import fitted as fitted_trends

BASELINE_COLOR = "#444444"
COLUMNS = 3
MIN_SPAN = 8.0  # the y axis spans at least this factor
SHORT_LISTED = 10  # level findings of short series listed in words


def _finding(trend) -> bool:
    """A finding the panel shows: not one on a series that already fails that tensor."""
    return trend.finding and not trend.series.failing


def _gpu(trend) -> str:
    """The GPU of a series (a case field of its key; "" for records without one)."""
    return str(dict(trend.series.key).get("gpu") or "")


def draw_error_trend(panel: Panel, run: Run, ctx: Context) -> PanelOutput:
    out = PanelOutput(panel)
    wanted = set(panel["tensors"])
    every = [t for t in fitted_trends(run.series) if t.series.tensor in wanted]
    # A finding on a series that already fails a check of that tensor repeats the failure: the
    # verdict matrix shows it; counted here, not listed or titled as a finding.
    repeated = [t for t in every if t.finding and t.series.failing]
    if repeated:
        out.notes.append(f"{len(repeated)} finding{'s' if len(repeated) != 1 else ''} on series "
                         "that already fail not listed as findings (the verdicts say more).")
    fitted = [t for t in every if t.fitted]
    short = [t for t in every if _finding(t) and not t.fitted]  # a declared tensor's level
    if short:
        out.notes.append(f"{len(short)} finding{'s' if len(short) != 1 else ''} on series with "
                         f"fewer than {MIN_LENGTHS} lengths (not drawn): a tensor the backend "
                         f"declares computed in the input dtype, over {LEVEL_BOUND:g}x the fused "
                         "baseline's error (docs/findings.md).")
        out.notes.extend(t.describe() for t in short[:SHORT_LISTED])
        if len(short) > SHORT_LISTED:
            out.notes.append(f"... and {len(short) - SHORT_LISTED} more (attnbench show RUN).")
    if not fitted:
        out.notes.append(f"No series with {MIN_LENGTHS} or more lengths judged against the fused "
                         "baseline: nothing to fit (a sweep needs a length ladder, e.g. "
                         "sweeps/standard.yaml's).")
        return out
    found = [t for t in fitted if _finding(t)]
    out.notes.append(f"{len(found)} finding{'s' if len(found) != 1 else ''} in {len(fitted)} "
                     f"series (a finding: slope over {SLOPE_BOUND:g} and the excess error grown "
                     f"{GROWTH_BOUND:g}x or more across the lengths; or a tensor the backend "
                     f"declares computed in the input dtype over {LEVEL_BOUND:g}x the fused "
                     "baseline's error).")
    shown = fitted[:panel["max_figures"] * COLUMNS]
    if len(fitted) > len(shown):
        # not cap_note: this panel reads the run's series, not its filter:, and a figure of
        # every series of a big run would be hundreds of subplots
        out.notes.append(f"{len(fitted) - len(shown)} flatter series not drawn: this panel "
                         f"draws at most max_figures={panel['max_figures']} rows of {COLUMNS} "
                         "series, findings first. To draw more, raise max_figures "
                         f"{IN_A_DASHBOARD}; attnbench show RUN lists every finding.")
    # the same series on two GPU kinds would have two subplots of one title
    gpus = {_gpu(t) for t in shown}
    rows = math.ceil(len(shown) / COLUMNS)
    columns = min(COLUMNS, len(shown))
    fig = new_figure(4.2 * columns, 3.0 * rows + 0.6)
    axes = fig.subplots(rows, columns, squeeze=False)
    handles = {}
    for ax, trend in zip(axes.flat, shown):
        points = trend.series.by_length()
        keys = [n for n, _, _ in points]
        style = ctx.style(trend.series.backend)
        (own,) = ax.plot(keys, [e for _, e, _ in points], ms=3, lw=1.5, **style,
                         label=f"{trend.series.backend}: slope {trend.backend_slope:+.2f}")
        (base,) = ax.plot(keys, [b for _, _, b in points], marker="s", ms=3, lw=1.2, ls="--",
                          color=BASELINE_COLOR,
                          label=f"fused baseline: slope {trend.baseline_slope:+.2f}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(keys, [fmt_len(n) for n in keys])
        ax.minorticks_off()
        ax.set_yscale("log")
        # At least a factor MIN_SPAN in view: a flat series must look flat, not zoomed to noise.
        values = [e for _, e, _ in points] + [b for _, _, b in points]
        middle = math.sqrt(min(values) * max(values))
        half = max(math.sqrt(MIN_SPAN), math.sqrt(max(values) / min(values)) * 1.15)
        ax.set_ylim(middle / half, middle * half)
        ax.set_xlabel("keys")
        ax.set_ylabel(f"{TENSOR_LABELS[trend.series.tensor]} rel. L2 vs fp64")
        ax.legend(handles=[own, base], fontsize=7, loc="best")  # where it covers least
        title = f"{TENSOR_LABELS[trend.series.tensor]}: {trend.series.label}" + (
            f" · {_gpu(trend)}" if len(gpus) > 1 else "")
        ax.set_title(wrap_text(title, 4.0, 8), fontsize=8,  # wrapped, never cut
                     color=VERDICT_COLORS["fail"] if _finding(trend) else "black")
        handles.setdefault(trend.series.backend, own)
    handles["fused baseline"] = base
    for ax in list(axes.flat)[len(shown):]:
        ax.set_visible(False)
    plain_log_ticks(fig)
    out.figures.append(finish_figure(
        fig, ctx, f"{panel.slug}-series",
        "Error against fp64 of each backend and of the fused baseline on the same inputs, by "
        "keys (log2 both). Red titles are findings: the error grows faster than the baseline's.",
        title="Error trend across lengths", legend=handles))
    return out
