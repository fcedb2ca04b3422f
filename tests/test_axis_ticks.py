"""Tick labels do not sit on each other (issue 27: "1000" and "1k" for 1024 overlapped)."""

from __future__ import annotations

from attnbench.report.figures import MAX_TICKS, new_figure, setup_x, spaced_ticks


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
