"""The step rule (attnbench.report.history.steps) on synthetic series: a clean step is found
where it is, noise alone has none, an outlier is no step and does not hide one, and the
measured rates of the module's docstring hold for its seeded series."""

import math
import random

import numpy as np
import pytest

from attnbench.report.history.steps import MIN_SIDE, find_steps, is_step

NAN = math.nan


def test_a_clean_step_is_found_at_the_run_it_appeared_in():
    steps = find_steps([1.0, 1.01, 0.99, 1.0, 1.2, 1.21, 1.19, 1.2])
    assert [(s.at, s.last_before) for s in steps] == [(4, 3)]
    assert steps[0].before == pytest.approx(1.0, abs=0.01)
    assert steps[0].after == pytest.approx(1.2, abs=0.01)
    assert steps[0].ratio == pytest.approx(1.2, abs=0.02)


def test_a_step_down_and_two_steps():
    down = find_steps([2.0, 2.0, 2.02, 1.0, 1.01, 0.99])
    assert [s.at for s in down] == [3] and down[0].ratio < 1
    two = find_steps([1.0, 1.0, 1.01, 1.5, 1.5, 1.49, 2.0, 2.01, 2.0])
    assert [s.at for s in two] == [3, 6]


def test_noise_alone_has_no_step():
    """10% noise (twice the 5% threshold) over 12 runs: no step in any of 50 series."""
    for seed in range(50):
        rng = random.Random(seed)
        assert find_steps([1 + rng.gauss(0, 0.1) for _ in range(12)]) == [], seed


def test_a_change_below_the_threshold_is_no_step():
    """3% is no step at the 5% threshold however clean; at a 2% threshold it is."""
    series = [1.0] * 5 + [1.03] * 5
    assert find_steps(series, threshold=0.05) == []
    assert [s.at for s in find_steps(series, threshold=0.02)] == [5]


def test_one_outlier_is_no_step_and_does_not_hide_one():
    series = [1.0, 1.01, 0.99, 5.0, 1.0, 1.01, 1.3, 1.31, 1.29, 1.3]
    assert [s.at for s in find_steps(series)] == [6]
    assert find_steps([1.0, 1.01, 0.99, 5.0, 1.0, 1.01, 1.0, 0.99]) == []


def test_the_latest_run_alone_is_no_step():
    """One run is an outlier until the next confirms it (MIN_SIDE 2)."""
    assert MIN_SIDE == 2
    assert find_steps([1.0, 1.0, 1.0, 1.0, 2.0]) == []
    assert [s.at for s in find_steps([1.0, 1.0, 1.0, 1.0, 2.0, 2.0])] == [4]


def test_missing_runs_are_skipped_and_the_step_placed_between_runs_with_values():
    steps = find_steps([1.0, NAN, 1.0, 1.0, NAN, 2.0, 2.0, NAN])
    assert [(s.at, s.last_before) for s in steps] == [(5, 3)]
    assert find_steps([NAN] * 6) == [] and find_steps([]) == []


def test_the_runs_own_spread_widens_the_noise():
    """A 20% step between runs whose samples spread by 30% is no step; by 1%, it is."""
    series = [1.0, 1.0, 1.0, 1.2, 1.2, 1.2]
    assert [s.at for s in find_steps(series, spreads=[0.01] * 6)] == [3]
    assert find_steps(series, spreads=[0.3] * 6) == []


def test_is_step_needs_both_the_threshold_and_the_noise():
    quiet, loud = np.array([1.0, 1.0, 1.0]), np.array([1.0, 1.5, 0.6])
    assert is_step(quiet, quiet * 1.1, 0.05)
    assert not is_step(quiet, quiet * 1.1, 0.2)  # under the threshold
    assert not is_step(loud, loud * 1.1, 0.05)  # inside the noise


def test_deterministic():
    rng = random.Random(7)
    series = [1 + rng.gauss(0, 0.02) + (0.3 if i > 9 else 0) for i in range(20)]
    assert find_steps(series) == find_steps(list(series))


@pytest.mark.parametrize("sd", [0.05, 0.1, 0.3])
@pytest.mark.parametrize("runs, most", [(6, 0), (20, 2)])
def test_measured_false_steps_of_the_docstring(sd, runs, most):
    """Steps in 300 series of normal noise: none of 6 runs, 2 of 20 (steps.py's docstring)."""
    found = 0
    for seed in range(300):
        rng = random.Random(seed)
        found += len(find_steps([1 + rng.gauss(0, sd) for _ in range(runs)]))
    assert found <= most


def test_measured_detection_of_the_docstring():
    """A 20% step in 3% noise over 20 runs: found at its run in 297 of 300."""
    hits = 0
    for seed in range(300):
        rng = random.Random(seed)
        series = [(1.0 if i < 10 else 1.2) * (1 + rng.gauss(0, 0.03)) for i in range(20)]
        hits += any(s.at == 10 for s in find_steps(series))
    assert hits >= 297
