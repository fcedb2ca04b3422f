"""What every figure of the report shares: the figure records, a page's colours, and helpers.

The dashboard's panels (:mod:`attnbench.report.page.panels`) and the compare page
(:mod:`attnbench.report.compare.page`) draw with these: :func:`new_figure` and
:func:`save_figure` (one layout, PNG + SVG), plain-text log ticks, :func:`setup_x` (log2 /
linear / categorical x axes), facets, legends and the series colours of a page
(:class:`Context`). Figures use matplotlib's object API, never pyplot.
"""

from __future__ import annotations

import io
import math
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import matplotlib
import matplotlib.collections
import matplotlib.text
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import (FuncFormatter, LogFormatter, LogFormatterSciNotation, LogLocator,
                               NullLocator)

from attnbench.report.page.dashboard import Panel
from attnbench.report.page.style import (BACKEND_PALETTE, SERIES_LINESTYLES, SERIES_MARKERS,
                                         backend_colors)
from attnbench.results.files import write_atomic

TENSOR_LABELS = {"out": "out", "dq": "dQ", "dk": "dK", "dv": "dV",
                 # identities <dV,V> = <dO,O>, <dQ,Q> = <dK,K>, sum over keys of dK = 0
                 "dv_v": "dV·V", "dq_q": "dQ·Q", "dk_sum": "ΣdK", "parity": "parity"}
DIRECTION_LABELS = {"fwd": "forward", "bwd": "backward"}
PNG_DPI = 120
MAX_VECTOR_MARKERS = 20_000
"""Markers one collection (a scatter) may write into an SVG as elements; past that its markers
are drawn into the SVG as one image at the PNG's dpi (the PNG is the same either way). A
scatter of 10^6 cases made a 73 MB SVG, too big for a browser and ~0.3 GB of ``report``'s
peak at 10^6 records (issue 29); 20,000 markers are ~2.2 MB (~110 B each), 60,000 as an image
148 KB (tests/report/page/test_dense_scatter.py)."""


@dataclass
class FigureFile:
    """One figure, written as ``<stem>.png`` and ``<stem>.svg``, with its caption and PNG size."""

    stem: str
    caption: str
    png: Path
    svg: Path
    width_px: int = 0
    height_px: int = 0


@dataclass
class PanelOutput:
    """What drawing one panel made: its figures, and notes for the page (what was not drawn
    and why)."""

    panel: Panel
    figures: list[FigureFile] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Context:
    """What the figures of one page share: where they go and the colour of each series."""

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

    def style(self, value: Any) -> dict[str, Any]:
        """``color``, ``marker`` and ``ls`` (keywords of ``ax.plot``) of a series: colours of a
        page look alike past five or six lines (olive and gold, navy and blue), so each series
        has its own marker too, and a line style of its own past the palette's ten colours."""
        color = self.color(value)
        i = list(self.colors).index(str(value))
        return {"color": color, "marker": SERIES_MARKERS[i % len(SERIES_MARKERS)][0],
                "ls": SERIES_LINESTYLES[(i // len(BACKEND_PALETTE)) % len(SERIES_LINESTYLES)]}


# ------------------------------------------------------------------------------------------
# figures: create, save, log ticks


def new_figure(width: float, height: float) -> Figure:
    """A figure at the PNG's dpi on an Agg canvas of its own: the layout computed for it (see
    :func:`save_figure`) and the PNG drawn from it share one renderer and its text metrics."""
    fig = Figure(figsize=(width, height), layout="constrained", dpi=PNG_DPI)
    FigureCanvasAgg(fig)
    return fig


def mpl_text(value: Any) -> str:
    """A string from a record, safe for matplotlib: ``$`` would start mathtext."""
    return str(value).replace("$", r"\$")


CHAR_WIDTH_EM = 0.6
"""The width of an average character of the report's sans-serif font, in ems (DejaVu Sans:
0.55-0.63 for lower-case and digits); wrapping at it keeps a line inside its width."""


def wrap_text(text: str, width_in: float, fontsize: float) -> str:
    """``text`` broken at words into lines that fit ``width_in`` inches at ``fontsize`` points,
    never cut: a title longer than its figure lost its end (issue 40)."""
    chars = max(12, int(width_in * 72 / (fontsize * CHAR_WIDTH_EM)))
    return "\n".join(textwrap.wrap(text, chars, break_on_hyphens=False)) or text


def save_figure(fig: Figure, ctx: Context, stem: str, caption: str) -> FigureFile:
    # Titles and legends may carry backend names or case strings from records: escape "$"
    # everywhere (tick labels set from data are escaped where they are set).
    for text in fig.findobj(matplotlib.text.Text):
        raw = text.get_text()
        if "$" in raw and "\\$" not in raw and not raw.startswith("$\\mathdefault"):
            text.set_text(mpl_text(raw))
    plain_log_ticks(fig)
    # A figure's title wrapped to its width (every figure: panels, the compare page): a long
    # facet or run name ran past both edges and lost its ends (issue 40).
    title = fig._suptitle
    if title is not None and title.get_text():
        title.set_text(wrap_text(title.get_text(), fig.get_figwidth() - 0.2,
                                 title.get_fontsize()))
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
    rasterize_dense_markers(fig)
    png, svg = ctx.out_dir / f"{stem}.png", ctx.out_dir / f"{stem}.svg"
    for path, kind, options in ((png, "png", {"dpi": PNG_DPI, "metadata": {"Software": None}}),
                                (svg, "svg", {"metadata": {"Date": None}})):
        drawn = io.BytesIO()  # drawn here, then renamed into place: a planted link is not followed
        fig.savefig(drawn, format=kind, **options)
        write_atomic(path, drawn.getvalue())
    w, h = fig.get_size_inches()
    return FigureFile(stem=stem, caption=caption, png=png, svg=svg,
                      width_px=int(round(w * PNG_DPI)), height_px=int(round(h * PNG_DPI)))


def rasterize_dense_markers(fig: Figure) -> None:
    """Collections of more than :data:`MAX_VECTOR_MARKERS` markers drawn as an image in vector
    output (rasterizing changes nothing in a PNG: Agg draws everything as pixels anyway)."""
    for collection in fig.findobj(matplotlib.collections.Collection):
        if len(collection.get_offsets()) > MAX_VECTOR_MARKERS:
            collection.set_rasterized(True)


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
    ten is enough), at 2 and 4 on one spanning 10x or more (evenly spaced in log), at 2, 3, 4,
    6 on a narrower one (those the formatter labels when a narrow axis shows few powers of
    ten). Each tick is several artists, laid out twice and drawn once per format: the 8
    default minor ticks per decade dominate a small figure."""
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() != "log" or type(axis.get_minor_locator()) is not LogLocator:
                continue
            lo, hi = sorted(axis.get_view_interval())
            if lo > 0 and hi / lo >= 100:
                axis.set_minor_locator(NullLocator())
            elif axis.get_transform().base == 10:
                # past 10x, 2, 3, 4, 6 put eight labels in 1.8 decades, 0.03 on 0.04 (issue 40)
                subs = (2.0, 4.0) if lo > 0 and hi / lo >= 10 else (2.0, 3.0, 4.0, 6.0)
                axis.set_minor_locator(LogLocator(10, subs=subs))
            for get, put in ((axis.get_major_formatter, axis.set_major_formatter),
                             (axis.get_minor_formatter, axis.set_minor_formatter)):
                f = get()
                if type(f) is LogFormatterSciNotation:
                    put(PlainLogFormatter(f._base, labelOnlyBase=f.labelOnlyBase,
                                          minor_thresholds=f.minor_thresholds,
                                          linthresh=f._linthresh))


# ------------------------------------------------------------------------------------------
# axes, facets, legends, colours


def fmt_len(v: float, _pos: Any = None) -> str:
    """A length as a tick label: 4096 -> "4k" (a tick formatter: ``_pos`` is unused)."""
    v = int(round(v))
    return f"{v // 1024}k" if v >= 1024 and v % 1024 == 0 else str(v)


MAX_TICKS = 12
"""Tick labels across one axis at most as far apart as 1/12 of its span: "1000" and "1k"
(1024) sat on top of each other (issue 27); a 4-character label is ~1/12 of a 3-inch axis."""


def spaced_ticks(vals: list, log: bool) -> list:
    """``vals`` (sorted) less those closer to the last kept one than the span / MAX_TICKS (in
    log2 units on a log axis); powers of two are kept first, so 1024 wins over 1000."""
    where = (lambda v: math.log2(v)) if log else float
    span = where(vals[-1]) - where(vals[0]) if len(vals) > 1 else 0.0
    if span <= 0:
        return list(vals)
    gap = span / MAX_TICKS
    ranked = sorted(vals, key=lambda v: (not _power_of_two(v), vals.index(v)))
    kept: list = []
    for v in ranked:
        if all(abs(where(v) - where(k)) >= gap for k in kept):
            kept.append(v)
    return sorted(kept)


def _power_of_two(v: Any) -> bool:
    return float(v).is_integer() and int(v) > 0 and int(v) & (int(v) - 1) == 0


def setup_x(ax, values: Iterable[Any], label: str, log2: bool = False) -> Callable[[Any], float]:
    """Log2 axis for positive numbers spanning 4x or more (or always, with ``log2``), linear for
    other numbers, categories otherwise. Returns value -> position."""
    present = {v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))}
    vals = sorted(present, key=lambda v: (isinstance(v, str), v))
    ax.set_xlabel(label)
    numeric = all(isinstance(v, (int, float, np.integer, np.floating)) for v in vals)
    if numeric and vals:
        log = min(vals) > 0 and (log2 or max(vals) / min(vals) >= 4)
        if log:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticks(spaced_ticks(vals, log))
        ax.xaxis.set_major_formatter(FuncFormatter(fmt_len))
        return float
    pos = {v: i for i, v in enumerate(vals)}
    ax.set_xticks(range(len(vals)), [mpl_text(v) for v in vals])
    return lambda v: float(pos[v])


def positions(pos: Callable[[Any], float], values: pd.Series) -> np.ndarray:
    """``[pos(v) for v in values]`` as an array, ``pos`` called once per distinct value: a
    scatter of 10^6 points spent ~3 s on the Python list (the call per point and matplotlib's
    conversion of the list), issue 29."""
    codes, distinct = pd.factorize(values, use_na_sentinel=False)
    return np.array([pos(v) for v in distinct.tolist()], dtype=float)[codes]


def facet_groups(df: pd.DataFrame, facets: list[str]):
    """(key tuple, rows) per combination of the ``facets`` columns, sorted; all rows as one
    group when there are no facets."""
    if not facets:
        yield (), df
        return
    for key, sub in df.groupby(facets, dropna=False, sort=True):
        yield (key if isinstance(key, tuple) else (key,)), sub


def facet_title(facets: list[str], key: tuple) -> str:
    """"H100 · bf16 · seqlen_q=4096": bare values for columns whose values say what they are
    (GPU kind, dtype, features, backend), ``name=value`` for the others, ``?`` for none."""
    parts = []
    for name, value in zip(facets, key):
        if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
            value = "?"
        parts.append(str(value) if name in ("gpu_kind", "dtype", "features", "backend")
                     else f"{name}={value}")
    return " · ".join(parts)


def slug(text: str) -> str:
    """``text`` as part of a file name: lower case, runs of other characters as one "-"."""
    keep = "".join(c if c.isalnum() else "-" for c in text.lower())
    while "--" in keep:
        keep = keep.replace("--", "-")
    return keep.strip("-")[:60] or "all"


LEGEND_COLUMNS = 6  # entries in one row of a legend under the axes, at most


def legend_columns(n: int) -> int:
    """Columns for ``n`` legend entries: at most LEGEND_COLUMNS, rows filled evenly (7 entries
    are 4 + 3, not 6 + a lone last entry that reads as a caption)."""
    rows = math.ceil(n / LEGEND_COLUMNS)
    return max(1, math.ceil(n / rows)) if n else 1


def legend_below(fig: Figure, handles: list, labels: list[str], title: str | None = None) -> None:
    """One legend under the axes (outside them: it never covers data), its rows filled evenly;
    none without handles."""
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=legend_columns(len(handles)),
                   frameon=False, title=title)


def finish_figure(fig: Figure, ctx: Context, stem: str, caption: str, *, title: str,
                  legend: dict[str, Any]) -> FigureFile:
    """Title the figure (:func:`save_figure` wraps it to its width), put ``legend`` (label ->
    handle) below it, and save it."""
    fig.suptitle(title, fontsize=10, fontweight="bold")
    legend_below(fig, list(legend.values()), list(legend))
    return save_figure(fig, ctx, stem, caption)


def cap_note(panel: Panel, hidden: int, what: str, needed: int | None = None, *,
             named: str = "", example: str = "") -> str:
    """The note for ``hidden`` ``what`` a panel did not draw past its ``max_figures``: which
    option, and how to raise it or pick the ones wanted (issue 40: "a note says so, not how to
    get them"). ``needed``: the ``max_figures`` that draws them all; ``named``: which ones;
    ``example``: a ``filter:`` line that brings one back."""
    cap = panel["max_figures"]
    return (f"{hidden} more {what} not drawn" + (f" ({named})" if named else "") +
            f": this panel draws at most max_figures={cap}. To draw them all, set "
            f"max_figures: {needed or cap + hidden} {IN_A_DASHBOARD}; or keep the ones you want "
            "with this panel's filter: / exclude:"
            + (f" (for example {example})" if example else "") + ".")


IN_A_DASHBOARD = ("in this panel of a dashboard file (a copy of dashboards/default.yaml) and "
                  "pass it with attnbench report RUN --dashboard FILE")
"""Where a panel option is set, as a note says it."""


OTHER_LENGTH = {"seqlen_q": "seqlen_kv", "seqlen_kv": "seqlen_q"}
"""The length that is not on a length axis: a case whose other length differs (Sq != Sk) is
not a point of the Sq = Sk line."""
_SHORT_LENGTH = {"seqlen_q": "Sq", "seqlen_kv": "Sk"}


def length_lines(df: pd.DataFrame, x: str):
    """(label, rows) per line a length axis ``x`` may join: the cases with seqlen_q ==
    seqlen_kv (label ""), then those with Sq != Sk, one line per value of the other length
    (label "Sk=4k"). A 96 x 256 case joined to the 128 x 128 line read as "slower at
    96" (issue 40). Other axes: one line of all rows."""
    other = OTHER_LENGTH.get(x)
    if other is None or other not in df or x not in df:
        yield "", df
        return
    square = (df[other] == df[x]).to_numpy() | df[other].isna().to_numpy()
    if square.any():
        yield "", df[square]
    rest = df[~square]
    for value, rows in rest.groupby(other, sort=True):
        yield f"{_SHORT_LENGTH[other]}={fmt_len(value)}", rows


def mark_other_lengths(ax, lines: dict[str, tuple[list, list]]) -> None:
    """Write each Sq != Sk line's label beside its last point (the highest where several
    series end there), once per label: the legend says only that dashed lines are Sq != Sk."""
    for label, (xs, ys) in lines.items():
        if xs:
            ax.annotate(label, (xs[-1], ys[-1]), xytext=(4, 3), textcoords="offset points",
                        fontsize=7, color="#444444")


OTHER_LENGTH_LEGEND = "dashed or lone: Sq ≠ Sk (labelled)"


def natural_key(s: str) -> list[int | str]:
    """Sort key that orders "s1024" before "s16384" (digit runs compare as numbers)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def page_colors(run_frames: Iterable[pd.DataFrame], column: str = "backend") -> dict[str, str]:
    """``column`` value -> colour over all runs of a page, so that its figures agree."""
    names: set[str] = set()
    for df in run_frames:
        if column in df:
            names |= set(df[column].dropna().astype(str))
    return backend_colors(names)
