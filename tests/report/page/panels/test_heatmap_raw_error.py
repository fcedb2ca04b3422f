"""The accuracy heatmap says what its colour means where the eye lands, and writes each cell's
raw error beside its error / bound (issue 27: coloured by error over the backend's own bound, the
backend with the lowest error looked worst)."""

from __future__ import annotations

import math

from attnbench.report.page.dashboard import default_dashboard
from attnbench.report.read.reader import read_run
from attnbench.report.page.figures import Context
from attnbench.report.page.panels import draw_panel
from attnbench.report.page.panels.accuracy_heatmap import heatmap_figure, over_cmap


def test_cells_show_the_raw_error_beside_the_ratio(tiny):
    run = read_run(tiny)
    df = run.frame[run.frame.out_rel_l2.notna()].head(5)
    from matplotlib.colors import LogNorm

    fig = heatmap_figure(df, ["out", "dq"], LogNorm(1e-3, 1e3), over_cmap(), annotate=True)
    texts = [t.get_text() for t in fig.axes[0].texts]
    for row in df.itertuples():
        want = f"{row.out_rel_l2 / row.out_bound:.2g} ({row.out_rel_l2:.1e})"
        assert want in texts or math.isclose(row.out_over, row.out_rel_l2 / row.out_bound), texts
        assert f"({row.out_rel_l2:.1e})" in " ".join(texts), (row.out_rel_l2, texts)


def test_the_title_says_the_colour_is_relative_to_each_bound(tiny, tmp_path):
    panel = next(p for p in default_dashboard().panels if p.kind == "accuracy_heatmap")
    out = draw_panel(panel, read_run(tiny), Context(out_dir=tmp_path))
    assert out.figures
    assert "not the error itself" in out.figures[0].svg.read_text()


def test_a_forward_only_run_has_no_empty_gradient_columns(tiny, tmp_path):
    import json
    import shutil

    fwd_only = tmp_path / "fwd-only"
    shutil.copytree(tiny, fwd_only, ignore=shutil.ignore_patterns("dashboard", ".lock"))
    lines = []
    for line in (fwd_only / "records.jsonl").read_text().splitlines():
        rec = json.loads(line)
        tensors = (rec.get("accuracy") or {}).get("tensors") or {}
        for t in ("dq", "dk", "dv"):
            tensors.pop(t, None)
        if rec.get("accuracy"):  # a forward-only case has no gradient identities either
            rec["accuracy"]["identities"] = {}
        lines.append(json.dumps(rec))
    (fwd_only / "records.jsonl").write_text("\n".join(lines) + "\n")
    panel = next(p for p in default_dashboard().panels if p.kind == "accuracy_heatmap")
    (tmp_path / "fig").mkdir()
    out = draw_panel(panel, read_run(fwd_only), Context(out_dir=tmp_path / "fig"))
    svg = out.figures[0].svg.read_text()
    assert ">out<" in svg or "out" in svg
    assert "dQ" not in svg and "dK" not in svg and "dV" not in svg


def test_the_title_promises_brackets_only_where_the_cells_carry_them():
    """A 78-row smoke heatmap is not annotated: its title said "in brackets: the raw error"
    over cells with no brackets."""
    from attnbench.report.page.panels.accuracy_heatmap import heatmap_title

    assert "in brackets" in heatmap_title("", annotate=True)
    assert "in brackets" not in heatmap_title("", annotate=False)
    assert "own bound" in heatmap_title(" (part 1 of 2)", annotate=False)
