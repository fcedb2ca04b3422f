"""The dashboard's interactive page, ``interactive.html``: its throughput and error plots drawn
with bokeh, where hovering a point shows the case and its numbers, the wheel and a box zoom,
and a click on a legend entry hides that series.

The static PNG/SVG figures of ``index.html`` stay the report (papers, pages without
JavaScript); this page is for exploring them. It is one file that works offline: BokehJS
(its core and its plotting API, about 1.4 MB; no widgets, tables, WebGL or MathJax) is inlined,
never fetched from a CDN that an air-gapped cluster cannot reach.

The plots are built in the browser from the data (BokehJS's ``Bokeh.Plotting`` API), not as
bokeh's Python models: building and serialising a dozen Python figures costs seconds, a JSON
list of points costs milliseconds, so the report is no slower for having this page.

Escaping: every string from a record (a backend named ``<img src=x onerror=...>``) reaches the
page either through :func:`~attnbench.report.page.html.esc` (headings, notes) or as JSON data
(:func:`script_json`: ``<`` written ``\\u003c``, so no text closes the script); bokeh draws
titles and legends on a canvas, and hover tooltips name fields (``@label``), whose values
bokeh inserts as text.
"""

from __future__ import annotations

import importlib.resources
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from attnbench.report.page.dashboard import Dashboard, Panel
from attnbench.report.read.data import Run, apply_filter
from attnbench.report.page.figures import DIRECTION_LABELS, TENSOR_LABELS, facet_groups, facet_title
from attnbench.report.page.html import esc, page
from attnbench.results.files import write_atomic
from attnbench.results.records import RAN_VERDICTS, TENSORS

PAGE = "interactive.html"
KINDS = ("throughput", "error_vs_seqlen")
"""The panel kinds drawn here as well as statically."""
MAX_POINTS = 5_000
"""Points in one plot: each carries its case label into the page (~200 bytes), so a 10^5-case
panel would make a page of tens of MB; past this a note says how many were left out."""
BOKEH_JS = ("bokeh.min.js", "bokeh-api.min.js")
"""BokehJS's core and its plotting API, from the installed bokeh package."""

# Builds each plot from its spec (see _plot) and keeps its view in window.attnbenchPlots, where
# the browser test finds the points to hover.
DRAW_JS = """
(function () {
  const specs = JSON.parse(document.getElementById("plot-data").textContent);
  const plt = Bokeh.Plotting;
  window.attnbenchPlots = [];
  for (const spec of specs) {
    const fig = plt.figure({title: spec.title, width: 520, height: 340,
      tools: "pan,wheel_zoom,box_zoom,reset,save",
      x_axis_type: spec.x_log ? "log" : "linear", y_axis_type: spec.y_log ? "log" : "linear",
      x_axis_label: spec.x_label, y_axis_label: spec.y_label});
    fig.toolbar.logo = null;
    const cases = [];
    if (spec.bound) {
      fig.scatter({x: spec.bound.x, y: spec.bound.y, marker: "dash", size: 14,
                   color: "#444444", legend_label: "bound"});
    }
    for (const s of spec.series) {
      for (const line of s.lines) {
        fig.line({x: line.x, y: line.y, line_color: s.color, line_width: 1.5, line_alpha: 0.7,
                  legend_label: s.name});
      }
      const source = new Bokeh.ColumnDataSource({data: s.points});
      cases.push(fig.scatter({x: {field: "x"}, y: {field: "y"}, source: source, size: 7,
                              color: s.color, alpha: 0.8, legend_label: s.name}));
    }
    fig.add_tools(new Bokeh.HoverTool({tooltips: spec.tooltips, renderers: cases}));
    if (spec.y_zero) { fig.y_range.start = 0; }
    fig.legend.click_policy = "hide";
    fig.legend.location = "top_left";
    fig.legend.label_text_font_size = "9pt";
    plt.show(fig, document.getElementById(spec.div))
      .then(view => window.attnbenchPlots.push({spec: spec, view: view}));
  }
}());
"""


def write_interactive(run: Run, dashboard: Dashboard, out_dir: Path,
                      colors: dict[str, str]) -> Path | None:
    """Write ``out_dir/interactive.html`` for the dashboard's throughput and error panels;
    None when it has none of them."""
    panels = [p for p in dashboard.panels if p.kind in KINDS]
    if not panels:
        return None
    sections = [(_throughput if p.kind == "throughput" else _errors)(p, run, colors)
                for p in panels]
    path = Path(out_dir) / PAGE
    write_atomic(path, _render(run, dashboard, sections))
    return path


def script_json(value: Any) -> str:
    """JSON to put inside ``<script type="application/json">``: nothing in it can end the
    script or start markup (``<``, ``>``, ``&`` escaped as JSON allows)."""
    text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _bokeh_js() -> str:
    static = importlib.resources.files("bokeh") / "server" / "static" / "js"
    return "\n".join(f"<script>{(static / name).read_text(encoding='utf-8')}</script>"
                     for name in BOKEH_JS)


def _render(run: Run, dashboard: Dashboard, sections: list[tuple[Panel, list, list]]) -> str:
    specs = []
    body = ["<noscript><p class=\"note\">This page needs JavaScript; the same plots as "
            "images are in <a href=\"index.html\">index.html</a>.</p></noscript>", _bokeh_js()]
    for panel, plots, notes in sections:
        body.append(f'<section id="{esc(panel.slug)}"><h2>{esc(panel.title)}</h2>')
        body += [f'<p class="note">{esc(note)}</p>' for note in notes]
        divs = []
        for plot in plots:
            plot["div"] = f"plot{len(specs)}"
            specs.append(plot)
            divs.append(f'<div class="plot" id="{plot["div"]}"></div>')
        body.append(f'<div class="figs">{"".join(divs)}</div></section>')
    body.append(f'<script type="application/json" id="plot-data">{script_json(specs)}</script>')
    body.append(f"<script>{DRAW_JS}</script>")
    header = (f'<header class="run"><h1>{esc(dashboard.title)} · interactive</h1>'
              f'<div class="sub">run <code>{esc(run.run_id)}</code> · hover a point for its '
              "case and numbers; wheel or box to zoom; click a legend entry to hide it · "
              'static figures: <a href="index.html" style="color:#fff">index.html</a></div>'
              "</header>")
    nav = [(panel.slug, panel.title.split(":")[0]) for panel, _, _ in sections]
    return page(f"attnbench · {run.run_id} · interactive", header, nav, "\n".join(body))


# -- the plots: one spec each, drawn by DRAW_JS -------------------------------------------------

def _values(series: pd.Series) -> list:
    """JSON-ready: NaN and infinities become null (bokeh leaves a gap)."""
    out = []
    for v in series.tolist():
        if isinstance(v, float) and not math.isfinite(v):
            v = None
        out.append(v if isinstance(v, (int, float, str, bool)) or v is None else str(v))
    return out


POINT_COLUMNS = ("label", "id", "verdict", "features")
"""What every point's hover names besides its numbers; a plot's rows are these columns and
those it draws, not the frame's ~100 (issue 29: ~0.4 GB more at 10^6 rows)."""


def _points(rows: pd.DataFrame, columns: dict[str, pd.Series]) -> dict[str, list]:
    data = {name: _values(values) for name, values in columns.items()}
    for name in POINT_COLUMNS:
        data[name] = rows[name].astype(str).tolist()
    return data


def _log_x(xs: pd.Series) -> bool:
    numeric = pd.to_numeric(xs, errors="coerce")
    return bool(numeric.notna().all() and (numeric > 0).all() and numeric.nunique() > 1)


def _median_lines(rows: pd.DataFrame, by: list[str], x: str, column: str,
                  scale: float) -> dict[Any, list[dict]]:
    """Per value of ``by[0]``: a line through the medians at each x of every group of ``by``
    measured at two or more x (one groupby: a groupby per line costs seconds on big runs)."""
    points: dict[tuple, tuple[list, list]] = {}
    for (*key, at), value in rows.groupby([*by, x], sort=True)[column].median().items():
        xs, ys = points.setdefault(tuple(key), ([], []))
        xs.append(at)
        ys.append(value * scale)
    lines: dict[Any, list[dict]] = {}
    for key, (xs, ys) in points.items():
        if len(xs) >= 2:
            lines.setdefault(key[0], []).append({"x": _values(pd.Series(xs)),
                                                 "y": _values(pd.Series(ys))})
    return lines


def _cap(rows: pd.DataFrame, notes: list[str], what: str) -> pd.DataFrame:
    if len(rows) > MAX_POINTS:
        notes.append(f"{what}: {len(rows) - MAX_POINTS} of {len(rows)} cases left out (at most "
                     f"{MAX_POINTS} points a plot; narrow the panel with filter:).")
        return rows.head(MAX_POINTS)
    return rows


def _throughput(panel: Panel, run: Run, colors: dict[str, str]) -> tuple[Panel, list, list]:
    """Per facet (the panel's facets less the last, usually GPU kind x dtype) and direction:
    every timed case a point at (x, TFLOP/s), and a line through the medians of each series and
    feature combination measured at several x."""
    plots: list[dict] = []
    notes: list[str] = []
    x, series, dirs = panel["x"], panel["series"], panel["directions"]
    df = apply_filter(run.frame, panel.include, panel.exclude, columns=[
        *POINT_COLUMNS, x, series, *panel["facets"],
        *(f"{d}_{s}" for d in dirs for s in ("tflops", "median_ms", "pct_peak", "gbps", "noisy"))])
    df = df[df.verdict.isin(RAN_VERDICTS)]
    df = df[df[[f"{d}_tflops" for d in dirs]].notna().any(axis=1)] if len(df) else df
    if df.empty:
        return panel, plots, ["No timed cases."]
    top = max(float(df[f"{d}_tflops"].max()) for d in dirs)
    scale, unit = (1e3, "GFLOP/s") if top < 1.0 else (1.0, "TFLOP/s")
    facets = panel["facets"][:-1]
    groups = list(facet_groups(df, facets))
    cap = panel["max_figures"]
    if len(groups) * len(dirs) > cap:
        notes.append(f"{len(groups) * len(dirs) - cap} plots not drawn (max_figures={cap}); "
                     "narrow the panel with filter:.")
    tooltips = [["case", "@label"], [x, "@x"], [unit, "@y{0.000}"], ["median ms", "@ms{0.000}"],
                ["% of peak", "@pct{0.0}"], ["GB/s", "@gbps{0.000}"], ["noisy", "@noisy"],
                ["verdict", "@verdict"], ["id", "@id"]]
    optional = {"@pct{0.0}": "pct_peak", "@gbps{0.000}": "gbps"}  # null on CPU: not shown
    for key, sub in groups:
        for d in dirs:
            rows = _cap(sub[sub[f"{d}_tflops"].notna()], notes, facet_title(facets, key))
            if rows.empty or len(plots) >= cap:
                continue
            lines = _median_lines(rows, [series, "features"], x, f"{d}_tflops", scale)
            spec_series = []
            for name, s in rows.groupby(series, sort=True):
                spec_series.append({"name": str(name), "color": colors.get(str(name), "#555555"),
                                    "lines": lines.get(name, []), "points": _points(s, {
                                        "x": s[x], "y": s[f"{d}_tflops"] * scale,
                                        "ms": s[f"{d}_median_ms"], "pct": s[f"{d}_pct_peak"],
                                        "gbps": s[f"{d}_gbps"],
                                        "noisy": s[f"{d}_noisy"].map(str)})})
            plots.append({"title": " · ".join(t for t in (facet_title(facets, key),
                                                           DIRECTION_LABELS[d]) if t),
                          "x_label": x, "y_label": unit, "x_log": _log_x(rows[x]), "y_log": False,
                          "y_zero": True, "series": spec_series,
                          "tooltips": [tip for tip in tooltips if tip[1] not in optional
                                       or rows[f"{d}_{optional[tip[1]]}"].notna().any()]})
    return panel, plots, notes


def _errors(panel: Panel, run: Run, colors: dict[str, str]) -> tuple[Panel, list, list]:
    """Per facet (default: dtype) and tensor: each case's relative L2 error against fp64 (log
    scale) at its x, its own bound in the hover and as a grey dash."""
    plots: list[dict] = []
    notes: list[str] = []
    x, series, facets = panel["x"], panel["series"], panel["facets"]
    tensors = [t for t in panel["tensors"] if t in TENSORS]
    df = apply_filter(run.frame, panel.include, panel.exclude, columns=[
        *POINT_COLUMNS, x, series, *facets,
        *(f"{t}_{s}" for t in tensors for s in ("rel_l2", "bound", "over"))])
    df = df[df.verdict.isin(RAN_VERDICTS)]
    if df.empty or not tensors:
        return panel, plots, ["No accuracy numbers."]
    groups = list(facet_groups(df, facets))
    if len(groups) > panel["max_figures"]:
        notes.append(f"{len(groups) - panel['max_figures']} more combinations of "
                     f"{', '.join(facets)} not drawn (max_figures).")
    tooltips = [["case", "@label"], [x, "@x"], ["rel. L2 error", "@y{0.00e}"],
                ["bound", "@bound{0.00e}"], ["error / bound", "@over{0.000}"],
                ["verdict", "@verdict"], ["id", "@id"]]
    for key, sub in groups[:panel["max_figures"]]:
        for t in tensors:
            col = f"{t}_rel_l2"
            rows = _cap(sub[sub[col].notna() & (sub[col] > 0)], notes, facet_title(facets, key))
            if rows.empty:
                continue
            bounds = rows[rows[f"{t}_bound"].notna() & (rows[f"{t}_bound"] > 0)]
            plots.append({
                "title": " · ".join(p for p in (facet_title(facets, key), TENSOR_LABELS[t]) if p),
                "x_label": x, "y_label": "relative L2 error vs fp64", "x_log": _log_x(rows[x]),
                "y_log": True, "y_zero": False, "tooltips": tooltips,
                "bound": {"x": _values(bounds[x]), "y": _values(bounds[f"{t}_bound"])}
                if len(bounds) else None,
                "series": [{"name": str(name), "color": colors.get(str(name), "#555555"),
                            "lines": [], "points": _points(s, {
                                "x": s[x], "y": s[col], "bound": s[f"{t}_bound"],
                                "over": s[f"{t}_over"]})}
                           for name, s in rows.groupby(series, sort=True)]})
    return panel, plots, notes
