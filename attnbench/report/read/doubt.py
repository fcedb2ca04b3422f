"""Why a timing cannot carry a verdict: too few samples, or too noisy.

``attnbench compare`` calls a pair AMBIGUOUS when it cannot say FAST, SLOW or SAME
(:func:`attnbench.report.compare.gate.classify`); this module says why, in the words a user acts on:

* ``too few samples`` -- a side has fewer than :data:`FEW_SAMPLES` samples: its quartiles rest
  on one or two samples each, so the robust interval is a guess. Act: raise ``min_samples``.
* ``too noisy`` -- enough samples, but the spread never settled (the record's ``noisy`` flag) or
  the two intervals overlap while the medians differ by more than the threshold. Act: a quieter
  machine, locked clocks, longer ``max_seconds``.

``attnbench show --all`` marks the same timings per case, so a run is known to be hard to
compare before it is compared. Imports nothing heavy (``show`` stays light).
"""

from __future__ import annotations

import math
from typing import Mapping, Optional

FEW_SAMPLES = 8
"""Below 8 samples, q3 (the interval's upper end) is the 2nd-largest sample or closer: a single
slow call moves it."""


def _n(stats: Mapping) -> float:
    n = stats.get("n")
    return float(n) if isinstance(n, (int, float)) and not isinstance(n, bool) else math.nan


def timing_doubt(stats: Optional[Mapping]) -> str:
    """"" for a timing fit for a verdict, else why not (one side, as in ``show``)."""
    if not stats:
        return ""
    n = _n(stats)
    if math.isfinite(n) and n < FEW_SAMPLES:
        return f"too few samples (n={n:.0f} < {FEW_SAMPLES})"
    if stats.get("noisy") is True:
        return "too noisy (spread never settled)"
    return ""


def why_ambiguous(a: Mapping, b: Mapping, threshold: float) -> str:
    """Why a pair classified AMBIGUOUS is: ``a`` and ``b`` hold median, q1, q3, n and noisy
    (A the baseline). Too few samples wins over noise: more samples is the first fix."""
    few = [(side, _n(s)) for side, s in (("A", a), ("B", b))
           if math.isfinite(_n(s)) and _n(s) < FEW_SAMPLES]
    if few:
        return "too few samples (" + ", ".join(f"{side} n={n:.0f}" for side, n in few) + \
            f" < {FEW_SAMPLES})"
    noisy = [side for side, s in (("A", a), ("B", b)) if s.get("noisy") is True]
    if noisy:
        return f"too noisy ({' and '.join(noisy)}: spread never settled)"
    spreads = []
    for side, s in (("A", a), ("B", b)):
        q1, q3, median = s.get("q1"), s.get("q3"), s.get("median")
        if all(isinstance(v, (int, float)) and math.isfinite(v) for v in (q1, q3, median)) \
                and median > 0:
            spreads.append(f"{side} IQR {100 * (q3 - q1) / median:.0f}%")
    gap = ""
    if a.get("median") and b.get("median"):
        gap = f"; medians {100 * (b['median'] / a['median'] - 1):+.0f}%"
    return (f"too noisy (intervals overlap: {', '.join(spreads) or 'spread unknown'}{gap}, "
            f"threshold {threshold:.0%})")
