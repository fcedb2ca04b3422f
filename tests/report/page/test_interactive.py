"""The dashboard's interactive page (issue 17, item 4) without a browser: written beside the
static report and linked from it, offline (BokehJS inlined), its data escaped, and cheap to
build (no bokeh Python models). In Chromium: tests/report/page/test_dashboard_browser.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import report_runs as runs
from attnbench.report.page.interactive import PAGE, script_json
from helpers import DATA, ROOT


def _plot_data(page: Path) -> list[dict]:
    text = page.read_text()
    raw = re.search(r'<script type="application/json" id="plot-data">(.*?)</script>', text,
                    re.S).group(1)
    return json.loads(raw)


def test_the_report_writes_and_links_an_interactive_page(base, tiny):
    index = runs.report(base, "tiny", tiny)
    page = index.parent / PAGE
    html = page.read_text()
    assert f'href="{PAGE}#' in index.read_text()
    assert PAGE in json.loads((index.parent / ".attnbench-dashboard").read_text())
    assert not re.search(r"<(script|link)[^>]+(src|href)=\"?https?:", html)  # nothing fetched
    assert 1_000_000 < len(html) < 3_000_000  # BokehJS core + API inlined, ~1.4 MB
    plots = _plot_data(page)
    assert {p["y_label"] for p in plots} >= {"relative L2 error vs fp64"}
    timed = [p for p in plots if p["y_zero"]]
    assert timed, "no throughput plot"
    points = timed[0]["series"][0]["parts"][0]["points"]
    assert {"label", "id", "verdict", "x", "y", "ms"} <= set(points)
    assert len(points["label"]) == len(points["y"]) > 0


def test_a_dashboard_without_those_panels_writes_no_interactive_page(tiny, tmp_path):
    from attnbench.report.commands import write_report

    index = write_report(tiny, DATA / "minimal.yaml", tmp_path / "min")
    assert not (index.parent / PAGE).exists() and PAGE not in index.read_text()


def test_plot_data_cannot_close_its_script():
    text = script_json(["</script><img src=x onerror=alert(1)>", "a & b"])
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == ["</script><img src=x onerror=alert(1)>", "a & b"]


def test_the_page_is_built_without_bokeh_python_models(tiny, tmp_path):
    """Building bokeh figures in Python and serialising them took seconds per dozen plots;
    the page ships data and BokehJS draws it. A change back would slow every report."""
    code = ("import sys; from attnbench.report.commands import write_report\n"
            f"write_report({str(tiny)!r}, {str(ROOT / 'dashboards/default.yaml')!r}, "
            f"{str(tmp_path / 'r')!r})\n"
            "print(sorted(m for m in sys.modules if m.startswith('bokeh.')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr
    loaded = proc.stdout.strip()
    assert "bokeh.models" not in loaded and "bokeh.plotting" not in loaded, loaded
    assert (tmp_path / "r" / PAGE).exists()


def test_a_panel_with_nothing_to_plot_is_one_line_not_a_section(base, tiny):
    """The tiny run has no packed case: the page showed the packed panel's heading over "No
    timed cases." (fails on the old code); now one note names it, and the report does not
    link to a section that is not there."""
    index = runs.report(base, "tiny", tiny)
    page = (index.parent / PAGE).read_text()
    packed = "Packed batches: throughput vs total tokens"
    assert f"<h2>{packed}</h2>" not in page and "No timed cases." not in page
    assert f"Nothing to plot here for {packed}" in page
    report = index.read_text()
    section = report.split(f"<h2>{packed}</h2>", 1)[1].split("<section", 1)[0]
    assert f'href="{PAGE}#' not in section


def test_lines_join_only_cases_of_one_length_shape():
    """A 96 x 256 case was joined to the 128 x 128 line (fails on the old code: one line
    through 96, 128, 256); each other length is a line of its own, drawn from two x on."""
    import pandas as pd

    from attnbench.report.page.interactive import _median_lines

    rows = pd.DataFrame({"backend": ["a"] * 5, "features": ["MHA"] * 5,
                         "seqlen_q": [96, 128, 256, 96, 192],
                         "seqlen_kv": [256, 128, 256, 512, 512],
                         "tflops": [1.0, 2.0, 3.0, 4.0, 5.0]})
    lines = _median_lines(rows, ["backend", "features"], "seqlen_q", "tflops", 1.0)
    assert sorted((line["x"], line["y"]) for line in lines[("a", "MHA")]) == [
        ([96, 192], [4.0, 5.0]), ([128, 256], [2.0, 3.0])]


def test_feature_combinations_with_lines_get_a_dash_and_marker_each(base, tiny):
    """Colour is the backend: the lines of one backend's feature combinations were a dozen
    lines of one colour (issue 40); each combination with a line has a dash and marker of its
    own, named in the plot's features legend."""
    plots = _plot_data(runs.report(base, "tiny", tiny).parent / PAGE)
    timed = [p for p in plots if p["y_zero"]]
    with_lines = [p for p in timed if p["features"]]
    assert with_lines, "no throughput plot with two feature combinations on lines"
    for plot in with_lines:
        styles = [(json.dumps(f["dash"]), f["marker"]) for f in plot["features"]]
        assert len(set(styles)) == len(styles)
        names = [f["name"] for f in plot["features"]]
        for s in plot["series"]:
            for part in s["parts"]:
                if part["lines"]:  # a part with a line is keyed; lone points need no key
                    assert part["feature"] is not None and names[part["feature"]] in set(
                        part["points"]["features"])
