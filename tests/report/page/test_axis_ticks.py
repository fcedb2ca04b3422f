"""Tick labels do not sit on each other (issue 27: "1000" and "1k" for 1024 overlapped)."""

from __future__ import annotations

import pytest

from attnbench.report.page.figures import MAX_TICKS, new_figure, setup_x, spaced_ticks


def test_close_lengths_keep_one_tick_the_power_of_two():
    assert spaced_ticks([512, 1000, 1024, 2048, 4096], log=True) == [512, 1024, 2048, 4096]
    assert spaced_ticks([96, 113, 128, 203, 256], log=True) == [96, 113, 128, 203, 256]


def test_evenly_spread_ticks_all_stay():
    ladder = [2 ** k for k in range(9, 9 + MAX_TICKS)]
    assert spaced_ticks(ladder, log=True) == ladder
    assert spaced_ticks([1, 2, 3], log=False) == [1, 2, 3]
    assert spaced_ticks([7], log=True) == [7]


def test_setup_x_draws_the_spaced_ticks():
    fig = new_figure(4, 3)
    ax = fig.add_subplot()
    setup_x(ax, [512, 1000, 1024, 4096], "seqlen")
    assert list(ax.get_xticks()) == [512, 1024, 4096]


@pytest.mark.parametrize("values", [
    [512, 1024, 512, 4096, None, 1024],          # a numeric axis (log2), a missing value
    [1.5, float("nan"), 3.0, 1.5],               # floats with NaN
    ["ring", "zigzag", "ring", "a2a"],           # a category axis
])
def test_positions_are_those_of_each_point(values):
    """``positions`` (one call of ``pos`` per distinct value, issue 29) gives each point the
    position the per-point loop gave it, NaN where that gave NaN. Mutant: positions of the
    distinct values in first-seen order, not indexed by each point's code, fails here."""
    import numpy as np
    import pandas as pd
    from matplotlib.figure import Figure

    from attnbench.report.page.figures import positions, setup_x

    series = pd.Series(values)
    if series.dtype == object and all(isinstance(v, str) for v in values):
        series = series.astype("category")
    pos = setup_x(Figure().subplots(), series.tolist(), "x")
    want = np.array([pos(v) if v is not None else np.nan for v in series], dtype=float)
    np.testing.assert_array_equal(positions(pos, series), want)
