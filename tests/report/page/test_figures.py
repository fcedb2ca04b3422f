"""What every figure shares (issue 40 item 10): titles wrapped inside their figure, never cut;
legends under the axes with rows filled evenly; a marker per series where colours look alike;
Sq != Sk cases apart from the Sq = Sk line; a cap note that says how to raise the cap."""

from __future__ import annotations

import pandas as pd

from attnbench.report.page.dashboard import parse_dashboard
from attnbench.report.page.figures import (Context, cap_note, finish_figure, legend_columns,
                                           length_lines, new_figure, wrap_text)
from attnbench.report.page.style import BACKEND_PALETTE

LONG_TITLE = ("H100-SXM5-80GB · bf16 · GQA causal alibi dropout0.1 softcap30 window(255,0) "
              "fwd-only · seqlen_q=4096")


def test_a_long_title_is_wrapped_inside_its_figure(tmp_path):
    """A one-subplot figure 4.8 in wide: the title ran past both edges (fails on the old code:
    its width was 1.8x the figure's); wrapped, every word stays."""
    fig = new_figure(4.8, 3.5)
    fig.add_subplot().plot([1, 2], [1, 2])
    finish_figure(fig, Context(out_dir=tmp_path), "t", "", title=LONG_TITLE, legend={})
    title = fig._suptitle
    box = title.get_window_extent(fig.canvas.get_renderer())
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width, (box, fig.bbox.width)
    assert title.get_text().split() == LONG_TITLE.split()


def test_wrap_text_breaks_at_words_and_keeps_them():
    text = wrap_text(LONG_TITLE, 2.0, 10)
    assert text.split() == LONG_TITLE.split() and text.count("\n") >= 2
    assert max(len(line) for line in text.splitlines()) <= int(2.0 * 72 / (10 * 0.6))
    assert wrap_text("short", 4.0, 10) == "short"


def test_legend_rows_are_filled_evenly():
    """7 entries were 6 + a lone seventh under them (read as a caption): now 4 + 3."""
    assert [legend_columns(n) for n in (1, 3, 6, 7, 9, 12, 13)] == [1, 3, 6, 4, 5, 6, 5]


def test_each_series_has_its_own_colour_and_marker_pair():
    """Ten palette colours: olive next to gold and navy next to blue on a thin line; the
    marker tells them apart, and a series past the tenth colour gets a line style too."""
    ctx = Context(out_dir=None)
    styles = [ctx.style(f"backend{i}") for i in range(24)]
    pairs = {(s["color"], s["marker"], s["ls"]) for s in styles}
    assert len(pairs) == 24
    first = styles[:len(BACKEND_PALETTE)]
    assert len({s["color"] for s in first}) == len(first) and {s["ls"] for s in first} == {"-"}
    assert styles[len(BACKEND_PALETTE)]["ls"] != "-"
    assert ctx.style("backend3") == styles[3]  # stable: one page, one style per series


def test_length_lines_keep_sq_not_sk_apart():
    df = pd.DataFrame({"seqlen_q": [1024, 4096, 1024, 2048, 512],
                       "seqlen_kv": [1024, 4096, 4096, 4096, 512]})
    got = {label: sorted(rows.seqlen_q) for label, rows in length_lines(df, "seqlen_q")}
    assert got == {"": [512, 1024, 4096], "Sk=4k": [1024, 2048]}
    by_kv = {label: sorted(rows.seqlen_kv) for label, rows in length_lines(df, "seqlen_kv")}
    assert by_kv == {"": [512, 1024, 4096], "Sq=1k": [4096], "Sq=2k": [4096]}
    # another x axis (tokens): one line of every row
    assert [len(rows) for _, rows in length_lines(df.assign(tokens=1), "tokens")] == [5]


def test_the_cap_note_names_the_option_its_value_and_the_flag():
    panel = parse_dashboard({"panels": [{"kind": "decode", "max_figures": 3}]}, "d.yaml").panels[0]
    note = cap_note(panel, 5, "facets", 8)
    assert note.startswith("5 more facets not drawn: this panel draws at most max_figures=3.")
    assert "set max_figures: 8 in this panel" in note
    assert "attnbench report RUN --dashboard FILE" in note and "filter:" in note


def test_log_tick_labels_are_spread_on_an_axis_under_two_decades(tmp_path):
    """An error axis from 0.0015 to 0.09 (the smoke run's bf16 errors) was labelled 0.002,
    0.003, 0.004, 0.006, 0.01, 0.02, 0.03, 0.04, 0.06: 0.03 on 0.04 (fails on the old code,
    a ratio of 1.33 between labels); now each label is at least twice the one before."""
    fig = new_figure(3.0, 3.0)
    ax = fig.add_subplot()
    ax.set_yscale("log")
    ax.plot([0, 1], [0.0015, 0.09])
    ax.set_ylim(0.0015, 0.09)
    finish_figure(fig, Context(out_dir=tmp_path), "ticks", "", title="", legend={})
    renderer = fig.canvas.get_renderer()
    shown = sorted(t.get_loc() for t in ax.yaxis.get_major_ticks() + ax.yaxis.get_minor_ticks()
                   if t.label1.get_visible() and t.label1.get_text()
                   and 0.0015 <= t.get_loc() <= 0.09 and t.label1.get_window_extent(renderer).width)
    assert len(shown) >= 4, shown
    assert all(b / a >= 1.99 for a, b in zip(shown, shown[1:])), shown
