"""The throughput panel's bar charts: facets measured at a single ``x`` (a smoke run, an
``include:`` case), one grouped horizontal bar chart per GPU kind x dtype, rows the feature
combinations, bars the series; the fastest series is named and marked clear or not (``~``).
A bar holding a timing whose spread never settled (``noisy``) is hatched, and is never a clear
winner."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from attnbench.report.page.dashboard import Panel
from attnbench.report.page.figures import (DIRECTION_LABELS, Context, FigureFile, facet_title, fmt_len,
                                      legend_below, mpl_text, natural_key, new_figure, save_figure,
                                      slug)
from attnbench.report.page.panels.throughput_common import (bar_rows, facet_key, peak_axis,
                                                       throughput_stats)
from attnbench.results.records import RAN_VERDICTS

BAR_MAX_ROWS = 40  # rows of one bar chart; more rows are split into parts
BAR_LOG_SPAN = 30.0  # a bar axis spanning more than this factor is drawn on a log scale
NOISY_HATCH = "////"  # a bar holding a timing whose spread never settled


def _fmt_ratio(r: float) -> str:
    return f"×{r:.0f}" if r >= 9.95 else f"×{r:.2g}" if r >= 1.995 else f"×{r:.2f}"


def draw_bars(panel: Panel, single: list, curves: list, every: pd.DataFrame,
                     ctx: Context, unit_scale: float, unit: str) -> list[FigureFile]:
    """One grouped horizontal bar chart per value of the non-row facets (GPU kind x dtype):
    rows are feature combinations, bars the series, one subplot per direction. ``curves``:
    the facets drawn as line plots, named in the caption of the chart they would be in."""
    x, series, facets = panel["x"], panel["series"], panel["facets"]
    rows_by = bar_rows(facets)
    chart_by = [f for f in facets if f not in rows_by]
    # cases of these facets that have no numbers (unsupported, crashed, untimed): named in the
    # row instead of a bar, so that a missing bar is never mistaken for a slow one
    ran_ids = set().union(*(set(s.id) for _, s in single))
    dead: dict[tuple, dict[str, str]] = {}
    if facets:
        rest = every[~every.id.isin(ran_ids)]
        for r in rest[facets + [series, "verdict"]].itertuples(index=False):
            verdict = r[-1] if r[-1] not in RAN_VERDICTS else "no timing"
            dead.setdefault(facet_key(r[:len(facets)]), {}).setdefault(str(r[-2]), verdict)
    charts: dict[tuple, list[tuple[str, tuple, pd.DataFrame]]] = {}
    for key, sub in single:
        named = dict(zip(facets, key))
        row = facet_title(rows_by, tuple(named[f] for f in rows_by)) or "all cases"
        charts.setdefault(tuple(named[f] for f in chart_by), []).append((row, key, sub))
    as_lines: dict[tuple, list[str]] = {}
    for key, _ in curves:
        named = dict(zip(facets, key))
        as_lines.setdefault(facet_key(named[f] for f in chart_by), []).append(
            facet_title(rows_by, tuple(named[f] for f in rows_by)))
    # every series of these rows, with numbers or not (one unsupported everywhere still shows)
    names = {str(v) for _, s in single for v in s[series].dropna()}
    names |= {name for key, _ in single for name in dead.get(facet_key(key), {})}
    names = sorted(names, key=natural_key)
    figures = []
    for chart_key, rows in sorted(charts.items(), key=lambda kv: facet_key(kv[0])):
        rows.sort(key=lambda r: natural_key(r[0]))
        xs = pd.concat([s[x] for _, _, s in rows])
        common = xs.mode().iloc[0] if xs.notna().any() else None
        labels = []
        for row, _, s in rows:
            v = s[x].dropna()
            off = len(v) and common is not None and v.iloc[0] != common
            labels.append(f"{row} ({x} {_fmt_value(v.iloc[0])})" if off else row)
        n_parts = math.ceil(len(rows) / BAR_MAX_ROWS)
        per_part = math.ceil(len(rows) / n_parts)
        title = facet_title(chart_by, chart_key) if chart_by else "all cases"
        at = f" at {x} {_fmt_value(common)}" if common is not None else ""
        for part in range(n_parts):
            chunk = slice(part * per_part, (part + 1) * per_part)
            suffix = f" (part {part + 1} of {n_parts})" if n_parts > 1 else ""
            fig, log = _bar_figure(panel, rows[chunk], labels[chunk], names, dead, ctx,
                                   unit_scale, unit)
            fig.suptitle(f"{title}: throughput{at}{suffix}", fontsize=10, fontweight="bold")
            what = "feature combinations" if rows_by == ["features"] else " x ".join(rows_by)
            caption = (f"{title}: median {unit}; rows: {what or 'all cases'}, bars: {series}, "
                       f"whiskers q1..q3{', log scale' if log else ''}. "
                       f"These combinations ran at a single {x}, so they have no curve. Right "
                       f"of each plot: the fastest {series} and its speedup over the next "
                       "(grey ~: no clear winner: the q1..q3 ranges overlap, a timing is noisy, or "
                       "there are under 3 timing samples and it is less than 2x).")
            elsewhere = as_lines.get(facet_key(chart_key), [])
            if elsewhere:
                shown = ", ".join(elsewhere[:8]) + (" ..." if len(elsewhere) > 8 else "")
                caption += (f" Not here: {len(elsewhere)} combination(s) measured at several "
                            f"{x}, drawn as line plots ({shown}).")
            stem = f"{panel.slug}-bars-{slug(title)}" + (f"-part{part + 1}" if n_parts > 1
                                                          else "")
            figures.append(save_figure(fig, ctx, stem, caption))
    return figures


def _fmt_value(v: Any) -> str:
    if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
        return fmt_len(v) if float(v).is_integer() else f"{v:g}"
    return str(v)


def _bar_figure(panel: Panel, rows: list, labels: list[str], names: list[str],
                dead: dict[tuple, dict[str, str]], ctx: Context, unit_scale: float,
                unit: str) -> tuple[Figure, bool]:
    series, dirs = panel["series"], panel["directions"]
    n, k = len(rows), max(1, len(names))
    label_chars = max(len(s) for s in labels)
    fig = new_figure(0.9 + 0.058 * label_chars + 3.9 * len(dirs), 1.35 + n * (0.1 + 0.12 * k))
    axes = fig.subplots(1, len(dirs), squeeze=False, sharey=True)[0]
    height = 0.8 / k
    any_log = any_noisy = False
    every = pd.concat([sub.assign(_row=i, _name=sub[series].astype(str))
                       for i, (_, _, sub) in enumerate(rows)])
    for ax, d in zip(axes, dirs):
        # stats[i][name]: t, lo, hi, n, samples of row i and series value name
        stats: list[dict[str, Any]] = [{} for _ in rows]
        agg = throughput_stats(every, d, unit_scale, by=["_row", "_name"])
        for (i, name), st in zip(agg.index, agg.itertuples(index=False)):
            stats[i][name] = st
        values = np.array([v for st in stats for e in st.values() for v in (e.lo, e.t, e.hi)
                           if np.isfinite(v) and v > 0])
        lo_all = values.min() if len(values) else 1.0
        hi_all = values.max() if len(values) else 1.0
        log = hi_all / lo_all > BAR_LOG_SPAN
        any_log |= log
        if log:
            ax.set_xscale("log")
            left, right = lo_all / 1.8, hi_all * 1.5
        else:
            left, right = 0.0, hi_all * 1.06
        ax.set_xlim(left, right)
        ax.grid(axis="y", visible=False)
        ypos = np.arange(n)
        for j, name in enumerate(names):
            has = [i for i in range(n) if name in stats[i]]
            if not has:
                continue
            y = ypos[has] - 0.4 + height * (j + 0.5)
            e = pd.DataFrame([stats[i][name] for i in has])
            ax.barh(y, e.t - left, left=left, height=height * 0.88, color=ctx.color(name),
                    hatch=[NOISY_HATCH if v else None for v in e.noisy], edgecolor="white",
                    lw=0, zorder=2)
            any_noisy |= bool(e.noisy.any())
            ax.errorbar(e.t, y, xerr=[np.clip(e.t - e.lo, 0, None), np.clip(e.hi - e.t, 0, None)],
                        fmt="none", ecolor="#222222", elinewidth=0.8, capsize=1.8, zorder=3)
        blend = ax.get_yaxis_transform()  # x in axes fraction, y in data
        for i, (_, key, _) in enumerate(rows):
            missing = dead.get(facet_key(key), {})
            for j, name in enumerate(names):
                if name not in stats[i] and name in missing:
                    ax.text(0.01, i - 0.4 + height * (j + 0.5), f"{name}: {missing[name]}",
                            transform=blend, va="center", ha="left", fontsize=6.5,
                            fontstyle="italic", color="#666666", zorder=4, in_layout=False)
            ranked = sorted(stats[i].items(), key=lambda kv: -kv[1].t)
            if len(ranked) >= 2 and ranked[1][1].t > 0:
                (best, a), (_, b) = ranked[0], ranked[1]
                # a clear winner: the q1..q3 ranges are apart, and each has 3 samples or more
                # (n = 1 has no range at all) unless it is twice as fast
                clear = a.lo > b.hi and (min(a.samples, b.samples) >= 3 or a.t >= 2 * b.t) \
                    and not (a.noisy or b.noisy)  # a timing that never settled wins nothing
                text = f"{'' if clear else '~'}{best} {_fmt_ratio(a.t / b.t)}"
                ax.text(1.015, i, text, transform=blend, va="center", ha="left", fontsize=7,
                        color=ctx.color(best) if clear else "#888888",
                        fontweight="bold" if clear else "normal", clip_on=False)
        ax.set_ylim(n - 0.5, -0.5)
        if ax is axes[0]:
            ax.set_yticks(ypos, [mpl_text(s) for s in labels])
        ax.tick_params(axis="y", length=0)
        ax.set_title(DIRECTION_LABELS[d])
        ax.set_xlabel(unit + (" (log scale)" if log else ""))
        peak_axis(ax, every, d, unit_scale, axis="x")
    handles = [Patch(color=ctx.color(name)) for name in names]
    handles.append(Line2D([], [], color="#222222", lw=0.8, marker="|", ms=5))
    labels = [*names, "q1..q3"]
    if any_noisy:
        handles.append(Patch(facecolor="#999999", edgecolor="white", hatch=NOISY_HATCH))
        labels.append("hatched: noisy")
    legend_below(fig, handles, labels)
    return fig, any_log
