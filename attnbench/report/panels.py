"""Panels: a run's frame in, PNG + SVG figures out (matplotlib object API, never pyplot).

Each ``draw_<kind>(panel, run, ctx)`` returns a :class:`PanelOutput`: the figures it wrote and
notes for the page (what was not drawn and why). A panel with nothing to show says so in a
note instead of drawing an empty axis.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import matplotlib
import matplotlib.text
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.colors import ListedColormap, LogNorm, to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import (FuncFormatter, LogFormatter, LogFormatterSciNotation, LogLocator,
                               NullLocator)

from attnbench.records import TENSORS
from attnbench.report.dashboard import Panel
from attnbench.report.data import Run, apply_filter, case_key, parity_checks
from attnbench.report.style import (BACKEND_PALETTE, RC, SEVERITY, VERDICT_COLORS,
                                    backend_colors, text_color_on, worst)

TENSOR_LABELS = {"out": "out", "dq": "dQ", "dk": "dK", "dv": "dV",
                 # identities <dV,V> = <dO,O>, <dQ,Q> = <dK,K>, sum over keys of dK = 0
                 "dv_v": "dV·V", "dq_q": "dQ·Q", "dk_sum": "ΣdK", "parity": "parity"}
DIRECTION_LABELS = {"fwd": "forward", "bwd": "backward"}
RAN = ("pass", "fail")  # verdicts of cases that ran to the end (and so may carry numbers)
NO_RESULT = ("crash", "timeout", "oom", "error", "lost")
PNG_DPI = 120


@dataclass
class FigureFile:
    stem: str
    caption: str
    png: Path
    svg: Path
    width_px: int = 0
    height_px: int = 0


@dataclass
class PanelOutput:
    panel: Panel
    figures: list[FigureFile] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Context:
    out_dir: Path
    colors: dict[str, str] = field(default_factory=dict)
    """series value (usually backend) -> colour, shared by every panel of a page; values not
    in it (a series other than backend) get the next free palette colour."""

    def color(self, value: Any) -> str:
        key = str(value)
        if key not in self.colors:
            used = set(self.colors.values())
            free = [c for c in BACKEND_PALETTE if c not in used]
            n = len(self.colors) % len(BACKEND_PALETTE)
            self.colors[key] = free[0] if free else BACKEND_PALETTE[n]
        return self.colors[key]


# ------------------------------------------------------------------------------------------
# helpers


def new_figure(width: float, height: float) -> Figure:
    """A figure at the PNG's dpi on an Agg canvas of its own: the layout computed for it (see
    :func:`save_figure`) and the PNG drawn from it share one renderer and its text metrics."""
    fig = Figure(figsize=(width, height), layout="constrained", dpi=PNG_DPI)
    FigureCanvasAgg(fig)
    return fig


def mpl_text(value: Any) -> str:
    """A string from a record, safe for matplotlib: ``$`` would start mathtext."""
    return str(value).replace("$", r"\$")


def save_figure(fig: Figure, ctx: Context, stem: str, caption: str) -> FigureFile:
    # Titles and legends may carry backend names or case strings from records: escape "$"
    # everywhere (tick labels set from data are escaped where they are set).
    for text in fig.findobj(matplotlib.text.Text):
        raw = text.get_text()
        if "$" in raw and "\\$" not in raw and not raw.startswith("$\\mathdefault"):
            text.set_text(mpl_text(raw))
    plain_log_ticks(fig)
    # Lay the figure out once, at the PNG's dpi, and keep that layout for both files: savefig
    # with any layout engine (even the placeholder left by set_layout_engine("none")) draws the
    # whole figure an extra time per format before drawing it for real.
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    fig.set_dpi(PNG_DPI)
    engine = fig.get_layout_engine()
    if engine is not None and fig.axes:
        engine.execute(fig)
    with matplotlib.rc_context({"figure.autolayout": False,
                                "figure.constrained_layout.use": False}):
        fig.set_layout_engine(None)  # no engine at all: positions stay as computed
    png, svg = ctx.out_dir / f"{stem}.png", ctx.out_dir / f"{stem}.svg"
    fig.savefig(png, dpi=PNG_DPI, metadata={"Software": None})
    fig.savefig(svg, metadata={"Date": None})
    w, h = fig.get_size_inches()
    return FigureFile(stem=stem, caption=caption, png=png, svg=svg,
                      width_px=int(round(w * PNG_DPI)), height_px=int(round(h * PNG_DPI)))


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def log_label(x: float, base: float = 10) -> str:
    """A log-axis tick as plain text: 0.001 .. 10000 as numbers, other powers of ten as 10⁻⁷,
    other values as 2×10⁻⁷ (matplotlib's default mathtext labels cost a parse each)."""
    if not math.isfinite(x) or x <= 0:
        return ""
    if base != 10 or 1e-3 <= x <= 1e4:
        return f"{x:g}"
    e = math.floor(math.log10(x) + 1e-9)
    m = x / 10.0 ** e
    power = "10" + str(e).translate(_SUPERSCRIPT)
    return power if abs(m - 1) < 1e-6 else f"{m:.2g}×{power}"


class PlainLogFormatter(LogFormatter):
    """matplotlib's log tick formatter (which ticks get a label), labels from :func:`log_label`."""

    def _num_to_string(self, x, vmin, vmax):
        return log_label(x, self._base)


def plain_log_ticks(fig: Figure) -> None:
    """Swap the default mathtext formatters of every log axis (colorbars too) for plain text,
    and thin its minor ticks: none on an axis spanning 100x or more (a label at every power of
    ten is enough), at 2, 3, 4, 6 otherwise (those the formatter labels when a narrow axis
    shows few powers of ten). Each tick is several artists, laid out twice and drawn once per
    format: the 8 default minor ticks per decade dominate a small figure."""
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() != "log" or type(axis.get_minor_locator()) is not LogLocator:
                continue
            lo, hi = sorted(axis.get_view_interval())
            if lo > 0 and hi / lo >= 100:
                axis.set_minor_locator(NullLocator())
            elif axis.get_transform().base == 10:
                axis.set_minor_locator(LogLocator(10, subs=(2.0, 3.0, 4.0, 6.0)))
            for get, put in ((axis.get_major_formatter, axis.set_major_formatter),
                             (axis.get_minor_formatter, axis.set_minor_formatter)):
                f = get()
                if type(f) is LogFormatterSciNotation:
                    put(PlainLogFormatter(f._base, labelOnlyBase=f.labelOnlyBase,
                                          minor_thresholds=f.minor_thresholds,
                                          linthresh=f._linthresh))


def _fmt_len(v: float, _pos: Any = None) -> str:
    v = int(round(v))
    return f"{v // 1024}k" if v >= 1024 and v % 1024 == 0 else str(v)


def setup_x(ax, values: Iterable[Any], label: str, log2: bool = False) -> Callable[[Any], float]:
    """Log2 axis for positive numbers spanning 4x or more (or always, with ``log2``), linear for
    other numbers, categories otherwise. Returns value -> position."""
    present = {v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))}
    vals = sorted(present, key=lambda v: (isinstance(v, str), v))
    ax.set_xlabel(label)
    numeric = all(isinstance(v, (int, float, np.integer, np.floating)) for v in vals)
    if numeric and vals:
        if min(vals) > 0 and (log2 or max(vals) / min(vals) >= 4):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticks(vals)
        ax.xaxis.set_major_formatter(FuncFormatter(_fmt_len))
        return float
    pos = {v: i for i, v in enumerate(vals)}
    ax.set_xticks(range(len(vals)), [mpl_text(v) for v in vals])
    return lambda v: float(pos[v])


def _facet_groups(df: pd.DataFrame, facets: list[str]):
    if not facets:
        yield (), df
        return
    for key, sub in df.groupby(facets, dropna=False, sort=True):
        yield (key if isinstance(key, tuple) else (key,)), sub


def _facet_title(facets: list[str], key: tuple) -> str:
    parts = []
    for name, value in zip(facets, key):
        if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
            value = "?"
        parts.append(str(value) if name in ("gpu_kind", "dtype", "features", "backend")
                     else f"{name}={value}")
    return " · ".join(parts)


def _slug(text: str) -> str:
    keep = "".join(c if c.isalnum() else "-" for c in text.lower())
    while "--" in keep:
        keep = keep.replace("--", "-")
    return keep.strip("-")[:60] or "all"


def _legend_below(fig: Figure, handles: list, labels: list[str], title: str | None = None) -> None:
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(handles), 6),
                   frameon=False, title=title)


def _series_color(ctx: Context, value: Any) -> str:
    return ctx.color(value)


# ------------------------------------------------------------------------------------------
# throughput: lines against the sequence length, bars where there is only one length

BAR_MAX_ROWS = 40  # rows of one bar chart; more rows are split into parts
BAR_LOG_SPAN = 30.0  # a bar axis spanning more than this factor is drawn on a log scale


def _throughput_frame(panel: Panel, run: Run) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the panel's rows, those of them timed that ran to the end)."""
    dirs = panel["directions"]
    every = apply_filter(run.frame, panel.include, panel.exclude)
    df = every[every.verdict.isin(RAN)]
    timed = df[[f"{d}_tflops" for d in dirs]].notna().any(axis=1) if len(df) else df.index == 0
    return every, df[timed]


def _throughput_stats(s: pd.DataFrame, d: str, unit_scale: float, by) -> pd.DataFrame:
    """Per value of ``by`` (column name or names): the median throughput ``t`` and its q1..q3
    range ``lo``..``hi`` (medians over the cases, in the panel's unit), the number of cases
    ``n`` and the fewest timing samples of one of them, ``samples``."""
    s = s[s[f"{d}_tflops"].notna()]
    tfl = s[f"{d}_tflops"] * unit_scale
    med = s[f"{d}_median_ms"]
    keys = [by] if isinstance(by, str) else list(by)
    t = pd.DataFrame({"t": tfl, "lo": tfl * med / s[f"{d}_q3_ms"],  # slower quartile -> lower
                      "hi": tfl * med / s[f"{d}_q1_ms"], "samples": s[f"{d}_n"],
                      **{f"_k{i}": s[k] for i, k in enumerate(keys)}})
    agg = t.groupby([f"_k{i}" for i in range(len(keys))]).agg(
        t=("t", "median"), lo=("lo", "median"), hi=("hi", "median"), n=("t", "size"),
        samples=("samples", "min"))
    agg.index.names = keys
    return agg


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
        out.notes.append("No timed cases: timing was off, or no case ran to the end.")
        return out
    unit_scale, unit = (1.0, "TFLOP/s")
    top = np.nanmax(df[[f"{d}_tflops" for d in dirs]].to_numpy(dtype=float))
    if top < 1.0:  # CPU runs: GFLOP/s reads better than 0.00x TFLOP/s
        unit_scale, unit = (1e3, "GFLOP/s")
    groups = list(_facet_groups(df, facets))
    curves = [(k, s) for k, s in groups if s[x].nunique() >= 2]
    single = [(k, s) for k, s in groups if s[x].nunique() < 2]
    cap = panel["max_figures"]

    drawn = set(_spread(curves, cap))
    line_figs = [_throughput_lines(panel, key, sub, ctx, unit_scale, unit)
                 for i, (key, sub) in enumerate(curves) if i in drawn]
    bar_figs: list[FigureFile] = []
    if single:
        bar_figs = _throughput_bars(panel, single, curves, every, ctx, unit_scale, unit)
        by = [f for f in facets if f not in _bar_rows(facets)]
        out.notes.append(
            f"{len(single)} of {len(groups)} combinations of {', '.join(facets) or 'cases'} "
            f"were measured at a single {x}: they are folded into {len(bar_figs)} bar "
            f"chart(s) (one per {' x '.join(by) or 'panel'}) instead of one-point line plots.")
    # the view that covers more facets comes first (a smoke run: bars; a GPU sweep: lines)
    out.figures += bar_figs + line_figs if len(single) > len(curves) else line_figs + bar_figs
    if len(curves) > cap:
        hidden = [k for i, (k, _) in enumerate(curves) if i not in drawn]
        rest = [_facet_title(facets, k) for k in hidden]
        shown = ", ".join(rest[:6]) + (f" and {len(rest) - 6} more" if len(rest) > 6 else "")
        out.notes.append(
            f"{len(rest)} more line plots not drawn ({shown}): this panel draws at most "
            f"max_figures={cap}, a few of each {' x '.join(facets[:-1]) or 'kind'}. Pick the "
            "ones you want in the dashboard YAML with this panel's filter: / exclude: (for "
            f"example {_filter_example(panel, hidden[0], facets)}), or raise max_figures.")
    if not any(df[f"{d}_pct_peak"].notna().any() for d in dirs):
        out.notes.append("No percent-of-peak axis: the device has no peak in the table "
                         "(timing.*.pct_peak is null, as on CPU).")
    return out


def _spread(curves: list, cap: int) -> list[int]:
    """Indices of at most ``cap`` facets, taken in turn from each value of the leading facets
    (GPU kind x dtype), so that a capped page still shows every GPU kind and dtype."""
    groups: dict[tuple, list[int]] = {}
    for i, (key, _) in enumerate(curves):
        groups.setdefault(_key(key[:-1]), []).append(i)
    order, queues = [], list(groups.values())
    while len(order) < cap and any(queues):
        for q in queues:
            if q and len(order) < cap:
                order.append(q.pop(0))
    return sorted(order)


def _filter_example(panel: Panel, key: tuple, facets: list[str]) -> str:
    """A filter: line for the YAML that keeps the facet ``key`` (not drawn) by its last facet
    (the feature combination), with the panel's own filter."""
    def scalar(v: Any) -> str:  # a YAML flow scalar: quoted when it holds , [ ] { } : # ...
        text = str(v)
        return json.dumps(text) if any(c in text for c in ",[]{}:#&*!|>'\"%@`") else text

    items = {col: list(vals) for col, vals in panel.include.items()}
    if facets:
        items[facets[-1]] = [_key(key[-1:])[0]]
    return "filter: {" + ", ".join(f"{col}: [{', '.join(scalar(v) for v in vals)}]"
                                   for col, vals in items.items()) + "}"


def _throughput_lines(panel: Panel, key: tuple, sub: pd.DataFrame, ctx: Context,
                      unit_scale: float, unit: str) -> FigureFile:
    x, series, facets, dirs = panel["x"], panel["series"], panel["facets"], panel["directions"]
    title = _facet_title(facets, key)
    fig = new_figure(4.2 * len(dirs) + 0.6, 3.5)
    axes = fig.subplots(1, len(dirs), squeeze=False)[0]
    handles: dict[str, Any] = {}
    many = False
    for ax, d in zip(axes, dirs):
        pos = setup_x(ax, sub[x].tolist(), x)
        for name, s in sub.groupby(series, sort=True):
            agg = _throughput_stats(s, d, unit_scale, by=x)
            if agg.empty:
                continue
            many |= bool((agg.n > 1).any())
            xs = [pos(v) for v in agg.index]
            color = _series_color(ctx, name)
            (line,) = ax.plot(xs, agg.t, marker="o", ms=3.5, lw=1.6, color=color)
            if panel["band"]:
                ax.fill_between(xs, agg.lo, agg.hi, color=color, alpha=0.2, lw=0)
            handles[str(name)] = line
        ax.set_title(DIRECTION_LABELS[d])
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        _peak_axis(ax, sub, d, unit_scale)
    fig.suptitle(title, fontsize=10, fontweight="bold")
    _legend_below(fig, list(handles.values()), list(handles))
    caption = f"{title}: median {unit}" + (", median over cases per point" if many else "") + \
        (", band q1..q3" if panel["band"] else "")
    return save_figure(fig, ctx, f"{panel.slug}-{_slug(title)}", caption)


def _bar_rows(facets: list[str]) -> list[str]:
    """The facets that make the rows of a bar chart (the others make one chart each)."""
    return ["features"] if "features" in facets else facets[-1:]


def _key(values: Iterable[Any]) -> tuple[str, ...]:
    return tuple("?" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)
                 for v in values)


def _fmt_ratio(r: float) -> str:
    return f"×{r:.0f}" if r >= 9.95 else f"×{r:.2g}" if r >= 1.995 else f"×{r:.2f}"


def _throughput_bars(panel: Panel, single: list, curves: list, every: pd.DataFrame,
                     ctx: Context, unit_scale: float, unit: str) -> list[FigureFile]:
    """One grouped horizontal bar chart per value of the non-row facets (GPU kind x dtype):
    rows are feature combinations, bars the series, one subplot per direction. ``curves``:
    the facets drawn as line plots, named in the caption of the chart they would be in."""
    x, series, facets = panel["x"], panel["series"], panel["facets"]
    rows_by = _bar_rows(facets)
    chart_by = [f for f in facets if f not in rows_by]
    # cases of these facets that have no numbers (unsupported, crashed, untimed): named in the
    # row instead of a bar, so that a missing bar is never mistaken for a slow one
    ran_ids = set().union(*(set(s.id) for _, s in single))
    dead: dict[tuple, dict[str, str]] = {}
    if facets:
        rest = every[~every.id.isin(ran_ids)]
        for r in rest[facets + [series, "verdict"]].itertuples(index=False):
            verdict = r[-1] if r[-1] not in RAN else "no timing"
            dead.setdefault(_key(r[:len(facets)]), {}).setdefault(str(r[-2]), verdict)
    charts: dict[tuple, list[tuple[str, tuple, pd.DataFrame]]] = {}
    for key, sub in single:
        named = dict(zip(facets, key))
        row = _facet_title(rows_by, tuple(named[f] for f in rows_by)) or "all cases"
        charts.setdefault(tuple(named[f] for f in chart_by), []).append((row, key, sub))
    as_lines: dict[tuple, list[str]] = {}
    for key, _ in curves:
        named = dict(zip(facets, key))
        as_lines.setdefault(_key(named[f] for f in chart_by), []).append(
            _facet_title(rows_by, tuple(named[f] for f in rows_by)))
    # every series of these rows, with numbers or not (one unsupported everywhere still shows)
    names = {str(v) for _, s in single for v in s[series].dropna()}
    names |= {name for key, _ in single for name in dead.get(_key(key), {})}
    names = sorted(names, key=_natural)
    figures = []
    for chart_key, rows in sorted(charts.items(), key=lambda kv: _key(kv[0])):
        rows.sort(key=lambda r: _natural(r[0]))
        xs = pd.concat([s[x] for _, _, s in rows])
        common = xs.mode().iloc[0] if xs.notna().any() else None
        labels = []
        for row, _, s in rows:
            v = s[x].dropna()
            off = len(v) and common is not None and v.iloc[0] != common
            labels.append(f"{row} ({x} {_fmt_value(v.iloc[0])})" if off else row)
        n_parts = math.ceil(len(rows) / BAR_MAX_ROWS)
        per_part = math.ceil(len(rows) / n_parts)
        title = _facet_title(chart_by, chart_key) if chart_by else "all cases"
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
                       "(grey ~: no clear winner: the q1..q3 ranges overlap, or there are "
                       "under 3 timing samples and it is less than 2x).")
            elsewhere = as_lines.get(_key(chart_key), [])
            if elsewhere:
                shown = ", ".join(elsewhere[:8]) + (" ..." if len(elsewhere) > 8 else "")
                caption += (f" Not here: {len(elsewhere)} combination(s) measured at several "
                            f"{x}, drawn as line plots ({shown}).")
            stem = f"{panel.slug}-bars-{_slug(title)}" + (f"-part{part + 1}" if n_parts > 1
                                                          else "")
            figures.append(save_figure(fig, ctx, stem, caption))
    return figures


def _fmt_value(v: Any) -> str:
    if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
        return _fmt_len(v) if float(v).is_integer() else f"{v:g}"
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
    any_log = False
    every = pd.concat([sub.assign(_row=i, _name=sub[series].astype(str))
                       for i, (_, _, sub) in enumerate(rows)])
    for ax, d in zip(axes, dirs):
        # stats[i][name]: t, lo, hi, n, samples of row i and series value name
        stats: list[dict[str, Any]] = [{} for _ in rows]
        agg = _throughput_stats(every, d, unit_scale, by=["_row", "_name"])
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
                    zorder=2)
            ax.errorbar(e.t, y, xerr=[np.clip(e.t - e.lo, 0, None), np.clip(e.hi - e.t, 0, None)],
                        fmt="none", ecolor="#222222", elinewidth=0.8, capsize=1.8, zorder=3)
        blend = ax.get_yaxis_transform()  # x in axes fraction, y in data
        for i, (_, key, _) in enumerate(rows):
            missing = dead.get(_key(key), {})
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
                clear = a.lo > b.hi and (min(a.samples, b.samples) >= 3 or a.t >= 2 * b.t)
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
        _peak_axis(ax, every, d, unit_scale, axis="x")
    handles = [Patch(color=ctx.color(name)) for name in names]
    handles.append(Line2D([], [], color="#222222", lw=0.8, marker="|", ms=5))
    _legend_below(fig, handles, [*names, "q1..q3"])
    return fig, any_log


def _peak_axis(ax, sub: pd.DataFrame, d: str, unit_scale: float, axis: str = "y") -> None:
    """A second axis in percent of peak (right of a y axis, above an x axis), when every
    point's peak is the same device peak."""
    rows = sub[sub[f"{d}_tflops"].notna()]
    pct = rows[f"{d}_pct_peak"]
    if rows.empty or pct.isna().any() or (pct <= 0).any():
        return
    peaks = rows[f"{d}_tflops"] / (pct / 100.0)
    peak = float(peaks.median())
    if not np.allclose(peaks, peak, rtol=0.02):
        return  # several devices or dtypes with different peaks share this axis: no single %
    peak *= unit_scale
    functions = (lambda t: t / peak * 100.0, lambda p: p * peak / 100.0)
    if axis == "x":
        sec = ax.secondary_xaxis("top", functions=functions)
        sec.set_xlabel("% of peak")
        ax.spines["top"].set_visible(True)
        return
    sec = ax.secondary_yaxis("right", functions=functions)
    sec.set_ylabel("% of peak")
    ax.spines["right"].set_visible(True)


# ------------------------------------------------------------------------------------------
# accuracy heatmap


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
    df = df[has_acc | ~df.verdict.isin(RAN)]
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
    if df.empty:
        out.notes.append("No accuracy data: accuracy was off for every case that ran.")
        return out
    # A check no case of this run made (parity in a single-device run) is not a column.
    tensors = [t for t in tensors if t in TENSORS or df[f"{t}_over"].notna().any()]
    n_parts = max(1, math.ceil(len(df) / panel["max_rows"]))
    per_part = math.ceil(len(df) / n_parts)
    decades = panel["decades"]
    norm = LogNorm(vmin=10.0 ** -decades, vmax=10.0 ** decades)
    cmap = over_cmap()
    bad = int(df.verdict.isin(("fail",) + NO_RESULT).sum())
    for part in range(n_parts):
        chunk = df.iloc[part * per_part:(part + 1) * per_part]
        suffix = f" (part {part + 1} of {n_parts})" if n_parts > 1 else ""
        fig = heatmap_figure(chunk, tensors, norm, cmap, annotate=len(chunk) <= 70)
        fig.suptitle(f"Error over bound per case: tensors vs fp64, identities, parity{suffix}",
                     fontsize=10, fontweight="bold")
        caption = (f"{len(chunk)} cases{suffix}; {bad} of {len(df)} cases in this panel failed, "
                   "crashed, timed out or ran out of memory. Green: under the bound; red: over "
                   "it; hatched: no numbers (the case died).")
        out.figures.append(save_figure(fig, ctx, f"{panel.slug}-part{part + 1}", caption))
    return out


def heatmap_figure(chunk: pd.DataFrame, tensors: list[str], norm: LogNorm, cmap,
                   annotate: bool) -> Figure:
    """Rows of ``chunk`` (frame rows) x ``tensors``, coloured by ``<t>_over``. Every value over
    1 is written in its cell; rows of cases that died are one hatched cell naming the verdict."""
    rows = len(chunk)
    label_chars = max(len(str(s)) for s in chunk.label) if rows else 10
    width = 2.6 + 0.055 * label_chars + 0.75 * len(tensors)
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
        if verdict in NO_RESULT and np.isnan(values[i]).all():
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
                ax.text(j + 0.5, i + 0.5, f"{v:.2g}", ha="center", va="center", fontsize=6.5,
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
    _legend_below(fig, [Patch(color=VERDICT_COLORS[v]) for v in verdicts], verdicts,
                  title="verdict (strip left of the cells)")
    return fig


# ------------------------------------------------------------------------------------------
# verdict matrix


def draw_verdict_matrix(panel: Panel, run: Run, ctx: Context) -> PanelOutput:
    out = PanelOutput(panel)
    rows_col, cols_col = panel["rows"], panel["columns"]
    df = apply_filter(run.frame, panel.include, panel.exclude)
    if df.empty:
        out.notes.append("No cases after this panel's filter.")
        return out
    row_vals = sorted(df[rows_col].astype(str).unique(), key=_natural)
    col_vals = sorted(df[cols_col].astype(str).unique(), key=_natural)
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
            ax.text(j + 0.5, i + 0.5, "\n".join(f"{n} {v}" for v, n in items), ha="center",
                    va="center", fontsize=7, color=text_color_on(color), linespacing=1.15)
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
    present = [v for v in SEVERITY if v in set(df.verdict)]
    _legend_below(fig, [Patch(color=VERDICT_COLORS[v]) for v in present], present,
                  title="cell colour = worst verdict in the cell")
    fig.suptitle(f"Verdict counts: {rows_col} x {cols_col}", fontsize=10, fontweight="bold")
    out.figures.append(save_figure(fig, ctx, panel.slug, f"{len(df)} cases; each cell counts "
                                   "verdicts and takes the colour of its worst one."))
    return out


def _natural(s: str):
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


# ------------------------------------------------------------------------------------------
# error vs sequence length


def draw_error_vs_seqlen(panel: Panel, run: Run, ctx: Context) -> PanelOutput:
    out = PanelOutput(panel)
    x, series, facets = panel["x"], panel["series"], panel["facets"]
    tensors = [t for t in panel["tensors"] if t in TENSORS]  # identities have no rel. L2
    df = apply_filter(run.frame, panel.include, panel.exclude)
    df = df[df.verdict.isin(RAN)]
    df = df[df[[f"{t}_rel_l2" for t in tensors]].notna().any(axis=1)] if len(df) else df
    if df.empty:
        out.notes.append("No accuracy numbers: accuracy was off or no case ran to the end.")
        return out
    groups = list(_facet_groups(df, facets))
    if len(groups) > panel["max_figures"]:
        out.notes.append(f"{len(groups) - panel['max_figures']} more combinations of "
                         f"{', '.join(facets)} not drawn.")
    for key, sub in groups[:panel["max_figures"]]:
        title = _facet_title(facets, key)
        fig = new_figure(2.9 * len(tensors) + 0.4, 3.4)
        axes = fig.subplots(1, len(tensors), squeeze=False, sharey=True)[0]
        handles: dict[str, Any] = {}
        extra: dict[str, Any] = {}  # after the series in the legend
        for ax, t in zip(axes, tensors):
            pos = setup_x(ax, sub[x].tolist(), x)
            ax.set_yscale("log")
            ax.set_title(TENSOR_LABELS[t])
            col = f"{t}_rel_l2"
            bound = sub[[x, f"{t}_bound"]].dropna().groupby(x)[f"{t}_bound"].median()
            if len(bound):
                # a bound at a single x (a smoke run) is a line of one point: mark it
                (bl,) = ax.plot([pos(v) for v in bound.index], bound.values, ls="--", lw=1.2,
                                color="#444444", zorder=1, ms=14,
                                marker="_" if len(bound) == 1 else "")
                extra.setdefault("bound (median)", bl)
            for name, s in sub.groupby(series, sort=True):
                s = s[s[col].notna() & (s[col] > 0)]
                if s.empty:
                    continue
                color = _series_color(ctx, name)
                ax.scatter([pos(v) for v in s[x]], s[col], s=9, color=color, alpha=0.35, lw=0)
                failed = s[s[f"{t}_over"] > 1]
                if len(failed):
                    fl = ax.scatter([pos(v) for v in failed[x]], failed[col], s=30,
                                    facecolors="none", edgecolors=VERDICT_COLORS["fail"], lw=1.1,
                                    zorder=4)
                    extra.setdefault("over its bound", fl)
                med = s.groupby(x)[col].median()
                (line,) = ax.plot([pos(v) for v in med.index], med.values, marker="o", ms=3,
                                  lw=1.5, color=color, zorder=3)
                handles.setdefault(str(name), line)
        handles.update(extra)
        axes[0].set_ylabel("relative L2 error vs fp64")
        fig.suptitle(f"Error vs {x}: {title}" if title else f"Error vs {x}", fontsize=10,
                     fontweight="bold")
        _legend_below(fig, list(handles.values()), list(handles))
        out.figures.append(save_figure(fig, ctx, f"{panel.slug}-{_slug(title)}",
                                 f"{title}: dots are cases, lines the median per {x}; dashed: "
                                 "the median bound; red rings: over their own bound."))
    return out


# ------------------------------------------------------------------------------------------
# CP / TP scaling


def _parallel_kind(r) -> str:
    parts = []
    if r.cp > 1:
        parts.append(f"cp-{r.cp_algo}")
    if r.tp > 1:
        parts.append("tp")
    return "+".join(parts) or "single"


def draw_parallel(panel: Panel, run: Run, ctx: Context) -> PanelOutput:
    out = PanelOutput(panel)
    series, dirs = panel["series"], panel["directions"]
    df = apply_filter(run.frame, panel.include, panel.exclude)
    if not (df.world_size > 1).any():
        out.notes.append("No case with cp * tp > 1 in this run.")
        return out
    # speedup: the same case at world size 1 (same GPU kind) is the baseline
    keyed = []
    by_id = {rec.get("id"): rec for rec in run.records}
    for _, r in df.iterrows():
        case = by_id.get(r.id, {}).get("case", {})
        keyed.append(case_key(case, ignore=("gpu", "cp", "tp", "cp_algo")) + f"|{r.gpu_kind}")
    df = df.assign(_key=keyed)
    ran = df[df.verdict.isin(RAN)]
    base = ran[ran.world_size == 1].drop_duplicates("_key").set_index("_key")
    multi = ran[ran.world_size > 1]
    pairs = multi[multi._key.isin(base.index)]
    if len(pairs) and any(pairs[f"{d}_median_ms"].notna().any() for d in dirs):
        fig = new_figure(4.2 * len(dirs) + 0.6, 3.6)
        axes = fig.subplots(1, len(dirs), squeeze=False)[0]
        handles: dict[str, Any] = {}
        worlds = sorted(set(pairs.world_size) | {1})
        styles = ["-", "--", ":", "-."]
        kinds = sorted({_parallel_kind(r) for _, r in pairs.iterrows()})
        for ax, d in zip(axes, dirs):
            pos = setup_x(ax, worlds, "world size (cp x tp)", log2=True)
            ax.plot(worlds, worlds, color="#aaaaaa", lw=1, ls=":", zorder=0)
            handles.setdefault("linear", Line2D([], [], color="#aaaaaa", lw=1, ls=":"))
            sp = pairs.assign(
                speedup=base.loc[pairs._key, f"{d}_median_ms"].to_numpy() / pairs[f"{d}_median_ms"],
                kind=[_parallel_kind(r) for _, r in pairs.iterrows()])
            for (name, kind), s in sp.groupby([series, "kind"], sort=True):
                s = s[s.speedup.notna()]
                if s.empty:
                    continue
                color = _series_color(ctx, name)
                ls = styles[kinds.index(kind) % len(styles)]
                ax.scatter([pos(v) for v in s.world_size], s.speedup, s=10, color=color, alpha=0.35)
                med = s.groupby("world_size").speedup.median()
                xs, ys = [1.0] + [pos(v) for v in med.index], [1.0] + list(med.values)
                (line,) = ax.plot(xs, ys, marker="o", ms=3.5, lw=1.5, color=color, ls=ls)
                handles.setdefault(f"{name} {kind}", line)
            ax.set_title(DIRECTION_LABELS[d])
            ax.set_ylabel("speedup over world size 1")
        fig.suptitle("Speedup against world size (same case at cp = tp = 1 as baseline)",
                     fontsize=10, fontweight="bold")
        _legend_below(fig, list(handles.values()), list(handles))
        out.figures.append(save_figure(fig, ctx, f"{panel.slug}-speedup",
                                 f"{len(pairs)} multi-rank cases with a world-size-1 twin; lines: "
                                 "median per world size; dotted: linear scaling."))
    else:
        out.notes.append("No speedup plot: no multi-rank case has a timed world-size-1 twin "
                         "in this run.")

    parity = parity_checks(r for r in run.records if r.get("id") in set(df.id))
    if parity.empty:
        out.notes.append("No parity plot: no record has a check == \"parity\".")
        return out
    tensors = [t for t in TENSORS if t in set(parity.tensor)]
    parity = parity.assign(kind=[_parallel_kind(r) for r in parity.itertuples()])
    kinds = sorted(set(parity.kind))
    markers = dict(zip(kinds, "o^sDv<>"))
    backends = sorted(set(parity[series if series in parity else "backend"].astype(str)))
    # spread backends a little sideways so points at one world size do not hide each other
    jitter = {name: 2 ** ((k - 0.5 * (len(backends) - 1)) * 0.07)
              for k, name in enumerate(backends)}
    fig = new_figure(2.9 * len(tensors) + 0.4, 3.4)
    axes = fig.subplots(1, len(tensors), squeeze=False, sharey=True)[0]
    handles: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    worlds = sorted(set(parity.world_size))
    for ax, t in zip(axes, tensors):
        pos = setup_x(ax, worlds, "world size (cp x tp)", log2=True)
        ax.set_xlim(min(worlds) / 1.4, max(worlds) * 1.4)
        ax.set_yscale("log")
        ax.set_title(f"{TENSOR_LABELS[t]} vs world size 1")
        s_all = parity[(parity.tensor == t) & (parity.value > 0)]
        bound = s_all.groupby("world_size").bound.median()
        if len(bound):
            (bl,) = ax.plot([pos(v) for v in bound.index], bound.values, ls="--", lw=1.2,
                            color="#444444", marker="_", ms=14)
            extra.setdefault("bound (median)", bl)
        for (name, kind), s in s_all.groupby([series if series in s_all else "backend", "kind"],
                                             sort=True):
            color = _series_color(ctx, name)
            xs = [pos(v) * jitter.get(str(name), 1.0) for v in s.world_size]
            ax.scatter(xs, s.value, s=18, color=color, alpha=0.75, lw=0, marker=markers[kind])
            handles.setdefault(str(name), Patch(color=color))
            extra.setdefault(kind, Line2D([], [], color="#555555", marker=markers[kind], ls=""))
            failed = s[s.passed == False]  # noqa: E712 (None means "not judged")
            if len(failed):
                fl = ax.scatter([pos(v) * jitter.get(str(name), 1.0) for v in failed.world_size],
                                failed.value, s=60, facecolors="none",
                                edgecolors=VERDICT_COLORS["fail"], lw=1.3)
                extra.setdefault("failed parity", fl)
    handles.update(extra)
    axes[0].set_ylabel("parity error (" + ", ".join(sorted(set(parity.metric.dropna()))) + ")")
    fig.suptitle("Parity: multi-rank result against the same backend at world size 1",
                 fontsize=10, fontweight="bold")
    _legend_below(fig, list(handles.values()), list(handles))
    out.figures.append(save_figure(fig, ctx, f"{panel.slug}-parity",
                             f"{len(parity)} parity checks from {parity.id.nunique()} cases; red "
                             "rings: over their bound."))
    return out


# ------------------------------------------------------------------------------------------
# architecture comparison


def draw_architecture(panel: Panel, run: Run, ctx: Context) -> PanelOutput:
    out = PanelOutput(panel)
    x, series, dirs = panel["x"], panel["series"], panel["directions"]
    df = apply_filter(run.frame, panel.include, panel.exclude)
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
    by_id = {rec.get("id"): rec for rec in run.records}
    df = df.assign(_key=[case_key(by_id.get(i, {}).get("case", {})) for i in df.id])
    base = df[df.gpu_kind == baseline].drop_duplicates("_key").set_index("_key")
    changed = []
    for kind in kinds:
        if kind == baseline:
            continue
        other = df[(df.gpu_kind == kind) & df._key.isin(base.index)]
        if other.empty:
            out.notes.append(f"{kind}: no case in common with {baseline}.")
            continue
        b = base.loc[other._key]
        for (_, o), (_, bb) in zip(other.iterrows(), b.iterrows()):
            if o.verdict != bb.verdict:
                changed.append(f"{o.label}: {bb.verdict} on {baseline}, {o.verdict} on {kind}")
        fig = new_figure(4.2 * len(dirs) + 0.6, 3.5)
        axes = fig.subplots(1, len(dirs), squeeze=False)[0]
        handles: dict[str, Any] = {}
        for ax, d in zip(axes, dirs):
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
                color = _series_color(ctx, name)
                ax.scatter([pos(v) for v in s[x]], s.ratio, s=9, color=color, alpha=0.35, lw=0)
                med = s.groupby(x).ratio.median()
                (line,) = ax.plot([pos(v) for v in med.index], med.values, marker="o", ms=3.5,
                                  lw=1.5, color=color)
                handles.setdefault(str(name), line)
            ax.set_title(DIRECTION_LABELS[d])
            ax.set_ylabel(f"throughput {kind} / {baseline}")
            ax.set_ylim(bottom=0)
        fig.suptitle(f"{kind} against {baseline}: same cases, throughput ratio", fontsize=10,
                     fontweight="bold")
        _legend_below(fig, list(handles.values()), list(handles))
        out.figures.append(save_figure(fig, ctx, f"{panel.slug}-{_slug(kind)}-vs-{_slug(baseline)}",
                                 f"{len(other)} cases run on both {kind} and {baseline}; above 1: "
                                 f"{kind} is faster. Ratios across GPU kinds, never verdicts."))
    if changed:
        more = " ..." if len(changed) > 20 else ""
        out.notes.append(f"{len(changed)} case(s) have a different verdict on different GPU "
                         "kinds: " + "; ".join(changed[:20]) + more)
    return out


def _peak_ratio(other: pd.DataFrame, base: pd.DataFrame, d: str) -> float | None:
    def peak(df: pd.DataFrame) -> float | None:
        p = (df[f"{d}_tflops"] / (df[f"{d}_pct_peak"] / 100.0)).dropna()
        return float(p.median()) if len(p) else None

    a, b = peak(other), peak(base)
    return a / b if a and b else None


DRAW = {
    "throughput": draw_throughput,
    "accuracy_heatmap": draw_accuracy_heatmap,
    "verdict_matrix": draw_verdict_matrix,
    "error_vs_seqlen": draw_error_vs_seqlen,
    "parallel": draw_parallel,
    "architecture": draw_architecture,
}


def draw_panel(panel: Panel, run: Run, ctx: Context) -> PanelOutput:
    with matplotlib.rc_context(RC):
        return DRAW[panel.kind](panel, run, ctx)


def page_colors(run_frames: Iterable[pd.DataFrame], column: str = "backend") -> dict[str, str]:
    names: set[str] = set()
    for df in run_frames:
        if column in df:
            names |= set(df[column].dropna().astype(str))
    return backend_colors(names)
