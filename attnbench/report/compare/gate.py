"""The gate's rule: which timing pairs are SLOW, FAST, SAME or AMBIGUOUS (``attnbench compare``).

With A the baseline, B the other run and ``t`` the threshold, each side's robust interval is
``[min, q3]``::

    SLOW       B.min > bound(A) * (1 + t)     B's best sample is slower than most of A's
    FAST       A.min > bound(B) * (1 + t)
    SAME       otherwise, medians within t, and neither timing ``noisy``
    AMBIGUOUS  otherwise

``bound`` is the side's q3; when either side has too few samples (``n`` under
:data:`~attnbench.report.read.doubt.FEW_SAMPLES`), its upper fence ``q3 + 1.5 (q3 - q1)``
(Tukey's): a minimum of a few draws is no quiet moment, and a q3 of a few is one sample, so
intervals must be apart by more than the spread before they say SLOW. Seeded draws of one
noisy distribution at 3 samples a side (``python benchmarks/speed_gate.py --simulate``): 42
false SLOW in 5000 pairs by the q3, 10 by the fence, which catches fewer 3x slowdowns (3542 of
5000, not 4449): the floor of ``min_samples`` (:mod:`attnbench.timing.loop`) is what makes
both right. With 8 samples and more the rule is the q3 one of issue 27: a spread that never
settled widens an interval, it does not move every sample of B past most of A's.

:func:`classify` is the rule a pair at a time, :func:`timing_columns` every pair at once (the
two agree on every pair: tests/report/compare/test_compare_columns.py).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from attnbench.report.read.doubt import FEW_SAMPLES, why_ambiguous

FENCE = 1.5
"""Tukey's upper fence, ``q3 + 1.5 IQR``: where a side's slow samples of the same distribution
end."""


def _number(value: Any) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else math.nan


def few_samples(a: Mapping, b: Mapping) -> bool:
    """Whether either side has fewer than FEW_SAMPLES samples (an unknown ``n``: enough, as
    records older than the count had)."""
    return any(_number(s.get("n")) < FEW_SAMPLES for s in (a, b))


def bound(side: Mapping, few: bool) -> float:
    """The time the other side's best sample must pass (before the threshold): q3, or with too
    few samples the upper fence (q3 itself where q1 is unknown)."""
    q3, q1 = side["q3"], _number(side.get("q1"))
    if not few or not q1 <= q3:
        return q3
    return q3 + FENCE * (q3 - q1)


def classify(a: Mapping, b: Mapping, threshold: float) -> str:
    """FAST / SLOW / SAME / AMBIGUOUS for B against A; ``a`` and ``b`` hold median, min, q3
    and optionally q1 and n (too few samples: apart by the fence, :func:`bound`) and ``noisy``
    (a timing whose spread never settled: SAME is then AMBIGUOUS; intervals that do not overlap
    are SLOW or FAST all the same)."""
    vals = [a.get(k) for k in ("median", "min", "q3")] + [b.get(k) for k in ("median", "min", "q3")]
    if any(v is None or not math.isfinite(v) or v <= 0 for v in vals):
        return "n/a"
    # Intervals apart by the threshold settle it whatever either spread did: B's best sample
    # slower than most of A's is a slowdown, noisy or not (a 10x one was AMBIGUOUS, issue 27).
    few = few_samples(a, b)
    if b["min"] > bound(a, few) * (1 + threshold):
        return "SLOW"
    if a["min"] > bound(b, few) * (1 + threshold):
        return "FAST"
    if a.get("noisy") or b.get("noisy"):
        return "AMBIGUOUS"  # overlapping intervals of a spread that never settled: no verdict
    if abs(b["median"] / a["median"] - 1) <= threshold:
        return "SAME"
    return "AMBIGUOUS"


CLASS_CODES = np.array(["n/a", "SLOW", "FAST", "AMBIGUOUS", "SAME", "RATIO"], dtype=object)
NOISY_CODES = np.array(["", "A", "B", "A and B"], dtype=object)
"""A class or noisy text per code: every pair's cell refers to one of these strings (a string
made per cell, as numpy's astype(object) does, was ~60 B a pair a column)."""


def float_column(column: Any) -> np.ndarray:
    """A column as float64, a missing value NaN (a taken numpy array is used as it is)."""
    if isinstance(column, np.ndarray):
        return column.astype(float, copy=False)
    return column.to_numpy(dtype=float, na_value=np.nan)


def _flags(column: Any) -> np.ndarray:
    """A noisy column as bool, as a pair's dict held it: a missing flag True (``bool(NaN)``)."""
    if np.asarray(column).dtype == bool:
        return np.asarray(column)
    return np.array([bool(v) for v in column], dtype=bool)


def timing_columns(pairs: Any, d: str, threshold: float) -> dict[str, Any]:
    """Direction ``d``'s columns of the pairs, all rows at once (:func:`classify` a pair at a
    time, over the ``<d>_<stat>_a`` / ``_b`` columns and ``same_kind`` of ``pairs``, a frame or
    a dict of arrays; a Python loop cost ~10 us a pair, 20 s for 10^6): ``<d>_class`` (RATIO
    across GPU kinds), ``<d>_speed`` (A's median over B's; above 1: B is faster) and its robust
    range ``_lo`` / ``_hi``, ``<d>_noisy`` ("", "A", "B" or "A and B": whose timing never
    settled) and ``<d>_why`` (AMBIGUOUS only:
    :func:`~attnbench.report.read.doubt.why_ambiguous`)."""
    # per side, as a pair's dict held them: a missing value NaN, a missing flag True (bool())
    side = {s: {stat: float_column(pairs[f"{d}_{stat}_{s}"])
                for stat in ("median_ms", "min_ms", "q1_ms", "q3_ms", "n")} for s in "ab"}
    for s in "ab":
        side[s]["noisy"] = _flags(pairs[f"{d}_noisy_{s}"])
    a, b = side["a"], side["b"]
    a_noisy, b_noisy = a["noisy"], b["noisy"]
    same_kind = np.asarray(pairs["same_kind"], dtype=bool)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        none = np.zeros(len(same_kind), dtype=bool)  # classify's "n/a"
        for x in (a, b):
            for k in ("median_ms", "min_ms", "q3_ms"):
                none |= ~np.isfinite(x[k]) | (x[k] <= 0)
        few = (a["n"] < FEW_SAMPLES) | (b["n"] < FEW_SAMPLES)  # an unknown n (NaN): enough
        bounds = {s: np.where(few & (x["q1_ms"] <= x["q3_ms"]),
                              x["q3_ms"] + FENCE * (x["q3_ms"] - x["q1_ms"]), x["q3_ms"])
                  for s, x in (("a", a), ("b", b))}  # bound(), every pair
        code = np.select(
            [none, b["min_ms"] > bounds["a"] * (1 + threshold),
             a["min_ms"] > bounds["b"] * (1 + threshold), a_noisy | b_noisy,
             np.abs(b["median_ms"] / a["median_ms"] - 1) <= threshold],
            [np.int8(k) for k in range(5)], np.int8(3))  # CLASS_CODES
        code[~none & ~same_kind] = 5  # RATIO
        speed, lo, hi = (np.where(none, math.nan, a[x] / b[y]) for x, y in
                         (("median_ms", "median_ms"), ("min_ms", "q3_ms"), ("q3_ms", "min_ms")))
    why = np.full(len(same_kind), "", dtype=object)
    for i in np.flatnonzero(code == 3):  # the few a run has, a pair at a time
        sa, sb = ({"median": float(x["median_ms"][i]), "min": float(x["min_ms"][i]),
                   "q3": float(x["q3_ms"][i]), "q1": float(x["q1_ms"][i]), "n": float(x["n"][i]),
                   "noisy": bool(x["noisy"][i])} for x in (a, b))
        why[i] = why_ambiguous(sa, sb, threshold)
    noisy = NOISY_CODES[a_noisy.astype(np.int8) + 2 * b_noisy.astype(np.int8)]
    return {f"{d}_class": CLASS_CODES[code].tolist(), f"{d}_speed": speed, f"{d}_speed_lo": lo,
            f"{d}_speed_hi": hi, f"{d}_noisy": noisy.tolist(), f"{d}_why": why.tolist()}
