"""Figures a new reader does not stumble on (issue 40 item 10): no empty backward subplot for
a forward-only facet, a case with Sq != Sk not joined to the Sq = Sk line, one y label on the
architecture comparison, error-trend titles whole and told apart, and a max_figures note that
says how to get the rest. The figures are caught as :func:`save_figure` gets them."""

from __future__ import annotations

import pytest

import report_runs as runs  # tests/support/ is on sys.path (pyproject: pythonpath)
from attnbench.report.page import figures
from attnbench.report.page.dashboard import parse_dashboard
from attnbench.report.page.figures import Context
from attnbench.report.page.panels import draw_panel
from attnbench.report.read.reader import read_run


@pytest.fixture
def drawn(monkeypatch):
    """The matplotlib figures saved while a test draws, by file stem."""
    saved = {}
    real = figures.save_figure

    def keep(fig, ctx, stem, caption):
        saved[stem] = fig
        return real(fig, ctx, stem, caption)

    monkeypatch.setattr(figures, "save_figure", keep)
    return saved


def _draw(run_dir, tmp_path, panel: dict):
    spec = parse_dashboard({"panels": [panel]}, "test.yaml").panels[0]
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    ctx = Context(out_dir=out)
    return draw_panel(spec, read_run(run_dir), ctx), ctx


def _main_axes(fig):
    """The subplots, not the percent-of-peak axes beside them."""
    return [ax for ax in fig.axes if ax.get_subplotspec() is not None]


H100_MHA = {"gpu_kind": ["H100"], "world_size": [1], "features": ["MHA causal", "MHA none"]}


def test_a_forward_only_facet_has_no_backward_subplot(synthetic, tmp_path, drawn):
    """Its forward-only cases beside cases with a backward: the panel-wide check kept the
    backward, and the facet's figure had an empty backward subplot (fails on the old code)."""
    def forward_only(rec):
        if rec["features"] == "MHA causal" and rec.get("timing"):
            rec["timing"]["bwd"] = None

    run = runs.edit_run(synthetic["mixed"], tmp_path / "fwd-only", forward_only)
    _draw(run, tmp_path, {"kind": "throughput", "filter": H100_MHA})
    fwd = [f for stem, f in drawn.items() if stem.endswith("-mha-causal")]
    both = [f for stem, f in drawn.items() if stem.endswith("-mha-none")]
    assert len(fwd) == len(both) == 1, list(drawn)
    assert [ax.get_title() for ax in _main_axes(fwd[0])] == ["forward"]
    assert [ax.get_title() for ax in _main_axes(both[0])] == ["forward", "backward"]


def _other_lengths(rec):
    """triton's MHA causal cases at 1024 queries read 4096 keys (Sq != Sk)."""
    case = rec["case"]
    if case["backend"] == "triton" and rec["features"] == "MHA causal" \
            and case["seqlen_q"] == 1024:
        case["seqlen_kv"] = 4096


@pytest.mark.parametrize("kind", ["throughput", "error_vs_seqlen"])
def test_a_case_with_sq_not_sk_is_not_on_the_length_line(synthetic, tmp_path, drawn, kind):
    """A 1024 x 4096 case was the first point of the 1024 .. 16384 line of square cases, a
    drop that is no drop (fails on the old code: the solid line started at 1024)."""
    run = runs.edit_run(synthetic["mixed"], tmp_path / "sq-sk", _other_lengths)
    where = {"gpu_kind": ["H100"], "world_size": [1], "features": ["MHA causal"]}
    out, ctx = _draw(run, tmp_path, {"kind": kind, "filter": where, "facets": ["gpu_kind"]})
    assert out.figures, out.notes
    (fig,) = drawn.values()
    color = ctx.color("triton")
    ax = _main_axes(fig)[0]
    lines = [ln for ln in ax.get_lines() if ln.get_color() == color and len(ln.get_xdata())]
    solid = [list(ln.get_xdata()) for ln in lines if ln.get_linestyle() == "-"]
    dashed = [list(ln.get_xdata()) for ln in lines if ln.get_linestyle() == "--"]
    assert solid == [[4096, 16384]], solid
    assert dashed == [[1024]], dashed
    assert "Sk=4k" in [t.get_text() for t in ax.texts]  # labelled with its other length
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert figures.OTHER_LENGTH_LEGEND in legend


def _exact_kinds(rec):
    """The kinds' exact names, long as real ones are ("H100-SXM5-80GB")."""
    env = rec.get("env") or {}
    env["gpu_kind"] = {"H100": "H100-SXM5-80GB", "A100": "A100-SXM4-80GB"}[env["gpu_kind"]]


def test_the_architecture_comparison_has_one_y_label_that_fits(synthetic, tmp_path, drawn):
    """The right panel's y label ran into the left panel, and each was longer than its axis
    (fails on the old code: a label on both, 'throughput A100-SXM4-80GB / H100-SXM5-80GB')."""
    run = runs.edit_run(synthetic["mixed"], tmp_path / "exact", _exact_kinds)
    out, _ = _draw(run, tmp_path, {"kind": "architecture", "filter": {"world_size": [1]}})
    (fig,) = drawn.values()
    axes = _main_axes(fig)
    assert [ax.get_title() for ax in axes] == ["forward", "backward"]
    assert axes[1].get_ylabel() == ""  # shared: labelled once, on the left
    renderer = fig.canvas.get_renderer()
    label = axes[0].yaxis.label.get_window_extent(renderer)
    frame = axes[0].get_window_extent(renderer)
    assert label.height <= frame.height, (label.height, frame.height)
    assert "A100-SXM4-80GB" in axes[0].get_ylabel() and "H100-SXM5-80GB" in axes[0].get_ylabel()


def test_the_architecture_comparison_of_a_forward_only_run_has_no_backward(synthetic, tmp_path,
                                                                           drawn):
    def forward_only(rec):
        if rec.get("timing"):
            rec["timing"]["bwd"] = None

    run = runs.edit_run(synthetic["mixed"], tmp_path / "fwd", forward_only)
    _draw(run, tmp_path, {"kind": "architecture", "filter": {"world_size": [1]}})
    (fig,) = drawn.values()
    assert [ax.get_title() for ax in _main_axes(fig)] == ["forward"]


def test_error_trend_titles_are_whole_and_name_the_gpu(synthetic, tmp_path, drawn):
    """Two GPU kinds have the same series: their subplots had one title (fails on the old
    code), and titles over 60 characters lost their end to "..."."""
    _draw(synthetic["mixed"], tmp_path, {"kind": "error_trend"})
    (fig,) = drawn.values()
    titles = [ax.get_title() for ax in _main_axes(fig) if ax.get_visible()]
    assert titles and not any(t.endswith("...") for t in titles)
    assert len(set(titles)) == len(titles), titles
    assert any("H100" in t for t in titles) and any("A100" in t for t in titles)


def test_a_capped_panel_says_how_to_draw_the_rest(synthetic, tmp_path):
    """The note said "1 more combinations of dtype, gpu_kind not drawn." and no more (fails
    on the old code): it names the option, the value that draws them all and the flag."""
    out, _ = _draw(synthetic["mixed"], tmp_path, {
        "kind": "error_vs_seqlen", "facets": ["gpu_kind"], "max_figures": 1,
        "filter": {"world_size": [1], "features": ["MHA causal"]}})
    note = next(n for n in out.notes if "not drawn" in n)
    assert "max_figures=1" in note and "max_figures: 2" in note, note
    assert "--dashboard" in note and "dashboards/default.yaml" in note and "filter:" in note


def test_a_capped_throughput_panel_takes_each_attention_kind_in_turn(synthetic, tmp_path,
                                                                     drawn):
    """Four line plots of eight (MHA/MQA x causal/none x two GPU kinds): the old spread took
    the first two by name of each GPU kind, MHA causal and MHA none, and never an MQA plot
    (fails on the old code)."""
    out, _ = _draw(synthetic["mixed"], tmp_path, {
        "kind": "throughput", "max_figures": 4, "filter": {"world_size": [1]}})
    lines = sorted(stem.split("-", 2)[-1] for stem in drawn if "-bars-" not in stem)
    assert lines == ["a100-bf16-mha-causal", "a100-bf16-mqa-causal", "h100-bf16-mha-causal",
                     "h100-bf16-mqa-causal"], lines
