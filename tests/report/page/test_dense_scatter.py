"""A scatter of every case (error_vs_seqlen, architecture, parallel) at 10^6 cases: its SVG
stays small, its markers drawn as one image past ``MAX_VECTOR_MARKERS``, and the PNG is the
same pixels as before (issue 29: a 10^6-point architecture SVG was 73 MB)."""

import numpy as np
import pytest
from PIL import Image

import attnbench.report.page.figures as figures
from attnbench.report.page.figures import MAX_VECTOR_MARKERS, Context, new_figure, save_figure

DENSE = 3 * MAX_VECTOR_MARKERS
"""Markers of the dense figure (60,000: 6.6 MB of SVG drawn as elements)."""
SVG_BOUND = 1 << 20
"""Bytes its SVG may take. Measured 148 KB with its markers as an image (7x under); the mutant
that draws every marker as an element 6.55 MB (6.2x over; asserted over 4x the bound)."""


def _draw(tmp_path, n: int, name: str):
    rng = np.random.default_rng(0)
    fig = new_figure(4.0, 3.0)
    ax = fig.subplots()
    ax.scatter(rng.random(n), rng.random(n), s=9, alpha=0.35, lw=0)
    return save_figure(fig, Context(out_dir=tmp_path), name, "caption")


def test_a_dense_scatter_makes_a_small_svg(tmp_path):
    out = _draw(tmp_path, DENSE, "dense")
    assert out.svg.stat().st_size < SVG_BOUND
    assert b"<image" in out.svg.read_bytes()


def test_the_bound_catches_markers_written_one_by_one(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "rasterize_dense_markers", lambda fig: None)  # mutant
    assert _draw(tmp_path, DENSE, "dense").svg.stat().st_size > 4 * SVG_BOUND


def test_a_sparse_scatter_stays_vector(tmp_path):
    assert b"<image" not in _draw(tmp_path, MAX_VECTOR_MARKERS, "sparse").svg.read_bytes()


@pytest.mark.parametrize("n", [100, DENSE])
def test_the_png_is_the_same_pixels(tmp_path, monkeypatch, n):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    drawn = _draw(tmp_path / "a", n, "a")
    monkeypatch.setattr(figures, "rasterize_dense_markers", lambda fig: None)  # as before
    plain = _draw(tmp_path / "b", n, "b")
    assert np.array_equal(np.asarray(Image.open(drawn.png)), np.asarray(Image.open(plain.png)))
