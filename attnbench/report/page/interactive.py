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
from attnbench.report.page.figures import (DIRECTION_LABELS, OTHER_LENGTH, TENSOR_LABELS, cap_note,
                                           facet_groups, facet_title, length_lines, natural_key,
                                           spaced_ticks)
from attnbench.report.page.style import SERIES_MARKERS
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

# Builds each plot from its spec (see _throughput, _errors) and keeps its view in
# window.attnbenchPlots, where the browser test finds the points to hover. The legends sit
# right of the plot, outside the data: inside they covered the top-left points. Colour is the
# series (backend); line dash and marker the feature combination, with a legend of its own, so
# a dozen lines of one backend are told apart (issue 40).
DRAW_JS = """
(function () {
  const specs = JSON.parse(document.getElementById("plot-data").textContent);
  const plt = Bokeh.Plotting;
  window.attnbenchPlots = [];
  const MAX_TICKS = 6;
  // bokeh's LogTicker puts linear ticks on an axis spanning under two decades (0.02, 0.03, ...
  // 0.09 piled up at its top); these are the densest of 1 / 1-3 / 1-2-5 / ... steps per decade
  // (powers of two on a length axis) with at most MAX_TICKS in view, every k-th power past it.
  class SpreadLogTicker extends Bokeh.LogTicker {
    get_ticks_no_defaults(lo, hi, cross, desired) {
      if (!(lo > 0) || !(hi > lo)) return {major: [], minor: []};
      const base = this.base;
      const k0 = Math.floor(Math.log(lo) / Math.log(base)) - 1;
      const k1 = Math.ceil(Math.log(hi) / Math.log(base)) + 1;
      const at = subs => { const out = [];
        for (let k = k0; k <= k1; k++) for (const m of subs) {
          const v = m * Math.pow(base, k); if (v >= lo && v <= hi) out.push(v); }
        return out; };
      const sets = base !== 10 ? [[1]]
        : [[1], [1, 3], [1, 2, 5], [1, 2, 3, 5, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9]];
      let major = at(sets[0]);
      for (const subs of sets.slice(1)) { const ticks = at(subs);
        if (ticks.length > MAX_TICKS) break; major = ticks; }
      if (major.length > MAX_TICKS) { const step = Math.ceil(major.length / MAX_TICKS);
        major = major.filter((v, i) => i % step === 0); }
      return {major: major, minor: []};
    }
  }
  const SUPERSCRIPT = {"-": "\\u207b", "0": "\\u2070", "1": "\\u00b9", "2": "\\u00b2",
    "3": "\\u00b3", "4": "\\u2074", "5": "\\u2075", "6": "\\u2076", "7": "\\u2077",
    "8": "\\u2078", "9": "\\u2079"};
  // tick labels as in the static figures: 4096 -> 4k on a length axis; 0.001 .. 10000 as
  // numbers, other values as 2×10⁻⁷ (bokeh's default: 2.000e-7)
  class PlainTickFormatter extends Bokeh.BasicTickFormatter {
    doFormat(ticks) { return ticks.map(v => this.length_axis ? plainLength(v) : plainNumber(v)); }
  }
  function plainLength(v) {
    const n = Math.round(v);
    return n >= 1024 && n % 1024 === 0 ? (n / 1024) + "k" : String(+v.toPrecision(4));
  }
  function plainNumber(v) {
    if (v === 0 || (Math.abs(v) >= 1e-3 && Math.abs(v) <= 1e4)) return String(+v.toPrecision(3));
    const e = Math.floor(Math.log10(Math.abs(v)) + 1e-9), m = v / Math.pow(10, e);
    const power = "10" + String(e).split("").map(c => SUPERSCRIPT[c]).join("");
    return Math.abs(m - 1) < 1e-6 ? power : (+m.toPrecision(2)) + "\\u00d7" + power;
  }
  // the grid keeps the ticker it was made with: give it the axis's
  function axis(ax, grid, log, base, length, ticks) {
    const ticker = log ? new SpreadLogTicker({base: base})
      : ticks ? new Bokeh.FixedTicker({ticks: ticks}) : null;
    if (ticker) { ax.ticker = ticker; grid.ticker = ticker; }
    const formatter = new PlainTickFormatter();
    formatter.length_axis = length;
    ax.formatter = formatter;
  }
  for (const spec of specs) {
    const fig = plt.figure({title: spec.title, frame_width: 370, frame_height: 250,
      tools: "pan,wheel_zoom,box_zoom,reset,save",
      x_axis_type: spec.x_log ? "log" : "linear", y_axis_type: spec.y_log ? "log" : "linear",
      x_axis_label: spec.x_label, y_axis_label: spec.y_label});
    fig.toolbar.logo = null;
    axis(fig.xaxis, fig.xgrid, spec.x_log, 2, spec.x_length, spec.x_ticks);
    axis(fig.yaxis, fig.ygrid, spec.y_log, 10, false, null);
    // A legend entry is a sample of its own, drawn from a point not in the plot (an entry
    // holding the series' renderers draws every one of their glyphs on top of each other);
    // a click hides the sample, and a renderer is shown while its series' sample and its
    // feature's sample both are.
    const sample = (color, dash, marker) => [
      fig.line({x: [NaN], y: [NaN], line_color: color, line_width: 1.5,
                line_dash: dash || "solid", line_alpha: dash ? 1 : 0}),
      fig.scatter({x: [NaN], y: [NaN], marker: marker, size: 7, color: color})];
    const cases = [], items = [], drawn = [];  // drawn: [renderer, series sample, feature's]
    if (spec.bound) {
      const bound = fig.scatter({x: spec.bound.x, y: spec.bound.y, marker: "dash", size: 14,
                                 color: "#444444"});
      items.push(new Bokeh.LegendItem({label: "bound", renderers: [bound]}));
    }
    const featureSamples = spec.features.map(f => sample("#555555", f.dash, f.marker));
    for (const s of spec.series) {
      const own = sample(s.color, s.parts.some(p => p.lines.length) ? "solid" : null, "circle");
      for (const part of s.parts) {
        const feature = part.feature === null ? null : spec.features[part.feature];
        const mark = feature ? featureSamples[part.feature][1] : null;
        for (const line of part.lines) {
          drawn.push([fig.line({x: line.x, y: line.y, line_color: s.color, line_width: 1.5,
                                line_alpha: 0.7, line_dash: feature ? feature.dash : "solid"}),
                      own[1], mark]);
        }
        const source = new Bokeh.ColumnDataSource({data: part.points});
        const points = fig.scatter({x: {field: "x"}, y: {field: "y"}, source: source, size: 7,
                                    marker: feature ? feature.marker : "circle",
                                    color: s.color, alpha: 0.8});
        cases.push(points);
        drawn.push([points, own[1], mark]);
      }
      items.push(new Bokeh.LegendItem({label: s.name, renderers: own}));
    }
    const update = () => {
      for (const [r, mine, feature] of drawn) {
        r.visible = mine.visible && (!feature || feature.visible);
      }
    };
    for (const r of [...items.flatMap(i => i.renderers), ...featureSamples.flat()]) {
      r.properties.visible.change.connect(update);
    }
    const legends = [[new Bokeh.Legend({items: items, title: spec.series_title}), "right"]];
    if (spec.features.length) {
      // under the plot, in columns: there may be a dozen
      legends.push([new Bokeh.Legend({title: "features (line dash and marker)",
        ncols: Math.min(3, Math.ceil(spec.features.length / 2)),
        items: spec.features.map((f, i) => new Bokeh.LegendItem({label: f.name,
          renderers: featureSamples[i]}))}), "below"]);
    }
    for (const [legend, side] of legends) {
      legend.click_policy = "hide";
      legend.label_text_font_size = "9pt";
      legend.title_text_font_size = "9pt";
      legend.location = "top_left";
      fig.add_layout(legend, side);
    }
    fig.add_tools(new Bokeh.HoverTool({tooltips: spec.tooltips, renderers: cases}));
    if (spec.y_zero) { fig.y_range.start = 0; }
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
    empty = [panel for panel, plots, _ in sections if not plots]
    sections = [section for section in sections if section[1]]
    if empty:  # a section with nothing to plot was a heading over "No timed cases."
        body.append('<p class="note">Nothing to plot here for '
                    + ", ".join(esc(panel.title) for panel in empty)
                    + ' (its notes are in <a href="index.html">index.html</a>).</p>')
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
                  scale: float) -> dict[tuple, list[dict]]:
    """Per value of ``by``: lines through the medians at each x, one per length line
    (:func:`~attnbench.report.page.figures.length_lines`: cases with Sq != Sk are not joined
    to the Sq = Sk line), those measured at two or more x (one groupby per length line: a
    groupby per line costs seconds on big runs)."""
    lines: dict[tuple, list[dict]] = {}
    for _, part in length_lines(rows, x):
        points: dict[tuple, tuple[list, list]] = {}
        for (*key, at), value in part.groupby([*by, x], sort=True)[column].median().items():
            xs, ys = points.setdefault(tuple(key), ([], []))
            xs.append(at)
            ys.append(value * scale)
        for key, (xs, ys) in points.items():
            if len(xs) >= 2:
                lines.setdefault(key, []).append({"x": _values(pd.Series(xs)),
                                                  "y": _values(pd.Series(ys))})
    return lines


FEATURE_DASHES = ("solid", "dashed", "dotted", "dotdash", "dashdot", [10, 3], [2, 5],
                  [12, 3, 2, 3, 2, 3])
"""Line dashes of the feature combinations of one plot (with a marker each from
SERIES_MARKERS): 8 x 7 pairs before one repeats."""


def _features(lines: dict[tuple, list]) -> list[dict]:
    """The feature combinations of a plot that have a line (``lines``: (series, features) ->
    lines), each with its dash and marker; none where fewer than two have one (points alone
    need no key: the hover names their features)."""
    names = sorted({str(feature) for (_, feature), drawn in lines.items() if drawn},
                   key=natural_key)
    if len(names) < 2:
        return []
    return [{"name": name, "dash": FEATURE_DASHES[i % len(FEATURE_DASHES)],
             "marker": SERIES_MARKERS[i % len(SERIES_MARKERS)][1]} for i, name in enumerate(names)]


def _axis_keys(x: str, rows: pd.DataFrame) -> dict[str, Any]:
    """The x axis of a plot: log (base 2) or linear; a linear numeric axis ticked at its values
    (one length, 128, was ticked 127, 127.5, 128, ...)."""
    log = _log_x(rows[x])
    numeric = pd.to_numeric(rows[x], errors="coerce").dropna()
    ticks = None if log or numeric.empty else spaced_ticks(sorted(set(numeric.tolist())), False)
    return {"x_label": x, "x_log": log, "x_length": x in LENGTH_AXES, "x_ticks": ticks}


LENGTH_AXES = ("seqlen_q", "seqlen_kv", "tokens")  # labelled 4k on the interactive page


def _cap(rows: pd.DataFrame, notes: list[str], what: str) -> pd.DataFrame:
    if len(rows) > MAX_POINTS:
        notes.append(f"{what}: {len(rows) - MAX_POINTS} of {len(rows)} cases left out (at most "
                     f"{MAX_POINTS} points a plot; narrow the panel with filter:).")
        return rows.head(MAX_POINTS)
    return rows


def _throughput(panel: Panel, run: Run, colors: dict[str, str]) -> tuple[Panel, list, list]:
    """Per facet (the panel's facets less the last, usually GPU kind x dtype) and direction:
    every timed case a point at (x, TFLOP/s), and a line through the medians of each series and
    feature combination measured at several x (colour: series; dash and marker: features)."""
    plots: list[dict] = []
    notes: list[str] = []
    x, series, dirs = panel["x"], panel["series"], panel["directions"]
    df = apply_filter(run.frame, panel.include, panel.exclude, columns=[
        *POINT_COLUMNS, x, series, *panel["facets"],
        *([OTHER_LENGTH[x]] if x in OTHER_LENGTH else []),
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
    wanted = sum(1 for _, sub in groups for d in dirs if sub[f"{d}_tflops"].notna().any())
    if wanted > cap:
        notes.append(cap_note(panel, wanted - cap, "plots", wanted))
    tooltips = [["case", "@label"], [x, "@x"], [unit, "@y{0.000}"], ["median ms", "@ms{0.000}"],
                ["% of peak", "@pct{0.0}"], ["GB/s", "@gbps{0.000}"], ["noisy", "@noisy"],
                ["verdict", "@verdict"], ["features", "@features"], ["id", "@id"]]
    optional = {"@pct{0.0}": "pct_peak", "@gbps{0.000}": "gbps"}  # null on CPU: not shown
    for key, sub in groups:
        for d in dirs:
            rows = _cap(sub[sub[f"{d}_tflops"].notna()], notes, facet_title(facets, key))
            if rows.empty or len(plots) >= cap:
                continue
            lines = _median_lines(rows, [series, "features"], x, f"{d}_tflops", scale)
            features = _features(lines)
            index = {f["name"]: i for i, f in enumerate(features)}
            spec_series = []
            for name, s in rows.groupby(series, sort=True):
                parts = []
                for feature, f in s.groupby(s.features.astype(str), sort=True):
                    parts.append({"feature": index.get(feature),
                                  "lines": lines.get((name, feature), []), "points": _points(f, {
                                      "x": f[x], "y": f[f"{d}_tflops"] * scale,
                                      "ms": f[f"{d}_median_ms"], "pct": f[f"{d}_pct_peak"],
                                      "gbps": f[f"{d}_gbps"],
                                      "noisy": f[f"{d}_noisy"].map(str)})})
                spec_series.append({"name": str(name), "color": colors.get(str(name), "#555555"),
                                    "parts": parts})
            plots.append({"title": " · ".join(t for t in (facet_title(facets, key),
                                                           DIRECTION_LABELS[d]) if t),
                          **_axis_keys(x, rows), "y_label": unit, "y_log": False,
                          "y_zero": True, "series": spec_series, "series_title": series,
                          "features": features,
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
        notes.append(cap_note(panel, len(groups) - panel["max_figures"],
                              f"combinations of {', '.join(facets)}", len(groups)))
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
                **_axis_keys(x, rows), "y_label": "relative L2 error vs fp64",
                "y_log": True, "y_zero": False, "tooltips": tooltips,
                "series_title": series, "features": [],
                "bound": {"x": _values(bounds[x]), "y": _values(bounds[f"{t}_bound"])}
                if len(bounds) else None,
                "series": [{"name": str(name), "color": colors.get(str(name), "#555555"),
                            "parts": [{"feature": None, "lines": [], "points": _points(s, {
                                "x": s[x], "y": s[col], "bound": s[f"{t}_bound"],
                                "over": s[f"{t}_over"]})}]}
                           for name, s in rows.groupby(series, sort=True)]})
    return panel, plots, notes
