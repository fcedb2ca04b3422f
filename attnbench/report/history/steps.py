"""Steps in a series of runs: where a case's time (or error) moved to a new level and stayed.

The rule, deterministic (the same series always gives the same steps), after asv's
piecewise-constant fit but robust to one bad run:

1. Missing values (NaN: the case did not run, or was not timed/judged) are left out; a step
   is placed between two runs that have a value.
2. Binary segmentation. In a segment, every split ``k`` leaving at least :data:`MIN_SIDE`
   values on each side is tried; the split of the least L1 cost (sum of absolute deviations of
   each side from its median; the earliest of equals) is kept if it is a step, and both sides
   are searched again. A segment whose best split is no step has none.
3. A split is a step when both hold, with ``b`` / ``a`` the medians before / after and
   ``nb`` / ``na`` the number of values on each side::

       |a - b| > threshold * b                             (large enough to matter: 5%)
       |a - b| > Z * 1.2533 * sigma * sqrt(1/nb + 1/na)    (Z = 5: far outside the noise)

   ``sigma`` is the noise of one run: the larger of 1.4826 x the median absolute successive
   difference of the segment's values / sqrt(2) (a step is one difference among many, so it
   does not inflate the noise, and a second step elsewhere in the segment does not hide the
   first), and the median of the runs' own spreads, where given (a timing's ``(q3 - q1) /
   1.349``: runs whose samples spread widely widen it). 1.2533 x sigma / sqrt(n) is the
   standard error of a median of n values of normal noise. ``Z`` is 5, not 2 or 3, because
   the split tested is the best of many (the largest gap a series of noise offers). Measured
   on normal noise with :func:`random.Random` seeds 0-299 (tests/report/history/test_steps.py
   checks the same series): at 5%, 10% and 30% noise, no step in 300 series of 6 runs and 2
   in 300 series of 20 runs; a 20% step in 3% noise is found at its run in 297 of 300 series
   of 20 runs and 120 of 300 of 6 runs (a short history needs a larger step, or quieter
   runs: on a GPU timings spread ~1%).

Medians make one outlier run move neither side's level; the noise term keeps a noisy series
from stepping. :data:`MIN_SIDE` 2 means the latest run alone never makes a step: one run is an
outlier until the next confirms it (``attnbench compare`` judges one run against another).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

MIN_SIDE = 2
"""Values each side of a step needs: one value cannot tell a step from an outlier."""
MAD_TO_SIGMA = 1.4826  # 1 / Phi^-1(3/4): the MAD of normal noise is 0.6745 sigma
IQR_TO_SIGMA = 1.349  # the interquartile range of normal noise is 1.349 sigma
MEDIAN_ERROR = 1.2533  # sqrt(pi/2): a median of n normal values is off by 1.2533 sigma/sqrt(n)
Z = 5.0
"""How many standard errors a step's gap must clear (rule 3: measured in the docstring)."""


@dataclass(frozen=True)
class Step:
    """A new level from position ``at`` (an index of the series given) on."""

    at: int
    """The first position of the new level: the run the step appeared in."""
    last_before: int
    """The last position before it with a value (the run it is measured against)."""
    before: float
    """Median of the segment before the step."""
    after: float
    """Median of the segment from the step on."""

    @property
    def ratio(self) -> float:
        """after / before: above 1 the value went up (slower, or a larger error)."""
        return self.after / self.before if self.before else math.inf


def _sigma(values: np.ndarray, spreads: np.ndarray | None) -> float:
    """The noise of one run's value (rule 3): from successive differences, or the runs' own
    spreads, whichever is larger."""
    sigma = MAD_TO_SIGMA * float(np.median(np.abs(np.diff(values)))) / math.sqrt(2)
    if spreads is not None:
        finite = spreads[np.isfinite(spreads)]
        if len(finite):
            sigma = max(sigma, float(np.median(finite)))
    return sigma


def _l1(values: np.ndarray) -> float:
    return float(np.abs(values - np.median(values)).sum())


def _best_split(values: np.ndarray, min_side: int) -> int | None:
    """The split of the least L1 cost (the earliest of equals), or None when none fits."""
    best, best_cost = None, math.inf
    for k in range(min_side, len(values) - min_side + 1):
        cost = _l1(values[:k]) + _l1(values[k:])
        if cost < best_cost:  # strictly: the earliest of equal splits stays
            best, best_cost = k, cost
    return best


def is_step(before: np.ndarray, after: np.ndarray, threshold: float,
            spreads: np.ndarray | None = None) -> bool:
    """Rule 3 of the module's docstring, for the values either side of one split
    (``spreads``: the runs' own noise, both sides', NaN where unknown)."""
    b, a = float(np.median(before)), float(np.median(after))
    gap = abs(a - b)
    sigma = _sigma(np.concatenate([before, after]), spreads)
    error = MEDIAN_ERROR * sigma * math.sqrt(1 / len(before) + 1 / len(after))
    return gap > threshold * abs(b) and gap > Z * error


def find_steps(values: Sequence[float], threshold: float = 0.05,
               spreads: Sequence[float] | None = None, min_side: int = MIN_SIDE) -> list[Step]:
    """The steps of ``values`` (one per run, in history order; NaN where a run has none),
    first to last. ``spreads``: each run's own noise (same length; NaN where unknown)."""
    x = np.asarray(values, dtype=float)
    where = np.flatnonzero(np.isfinite(x))
    v = x[where]
    s = None if spreads is None else np.asarray(spreads, dtype=float)[where]
    found: list[int] = []
    todo = [(0, len(v))]
    while todo:  # a stack of segments, not recursion: a long history cannot overflow it
        lo, hi = todo.pop()
        k = _best_split(v[lo:hi], min_side)
        if k is None:
            continue
        k += lo
        if is_step(v[lo:k], v[k:hi], threshold, None if s is None else s[lo:hi]):
            found.append(k)
            todo += [(lo, k), (k, hi)]
    bounds = [0, *sorted(found), len(v)]
    return [Step(at=int(where[k]), last_before=int(where[k - 1]),
                 before=float(np.median(v[bounds[i]:k])),
                 after=float(np.median(v[k:bounds[i + 2]])))
            for i, k in enumerate(bounds[1:-1])]
