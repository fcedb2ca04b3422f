"""Error trends across a sweep: does a backend's error grow with the sequence faster than the
baseline's?

A correct fused kernel's relative error is flat (within noise) as the sequence doubles, like the
fused-precision baseline's on the same inputs; an accumulator kept in low precision (a P·V sum
in bf16, a dQ summed across key blocks in bf16) makes it grow -- the shape of seed 001's dQ
report -- and at short lengths every single case can still pass. So after a run, per series
(same backend and every case field but the lengths and the seed) with at least
:data:`MIN_LENGTHS` lengths, fit log2(error / baseline error) against log2(keys): the slope is
how many doublings of *excess* error each doubling of the sequence adds. A series whose slope
exceeds :data:`SLOPE_BOUND` and whose excess grew by at least :data:`GROWTH_BOUND` from the
shortest to the longest length is a :class:`Finding` -- in ``attnbench show``, the dashboard
(the ``error_trend`` panel) and the exit status (4, :mod:`attnbench.errors`).

Only judged records (pass or fail) count, and only tensors judged against the fused baseline
(``accuracy.tensors[t].baseline == "fused"``, its error in ``baseline_rel_l2``): a tensor a
backend computes in the input dtype by design (judged against naive) is expected to lose
precision with length. Pure data: no torch.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from attnbench.results.records import JUDGED_VERDICTS, TENSORS

MIN_LENGTHS = 3
"""Distinct key lengths a series needs before a slope means anything."""

SLOPE_BOUND = 0.25
"""Excess-error doublings per sequence doubling above which a series is a finding (0.25: the
excess grows 19 % per doubling, 2x over three doublings). Calibration: see GROWTH_BOUND."""

GROWTH_BOUND = 1.5
"""... and the excess at the longest length must be at least this many times the shortest's,
so a slope fitted to noise on a nearly flat series is not a finding.

Measured with ``python benchmarks/error_trends.py`` (the lengths of sweeps/standard.yaml's trend
block): see the module docstring of that script for the table; correct backends stay well under
both bounds, the accumulation mutants far over them."""

_SERIES_IGNORES = ("seqlen_q", "seqlen_kv", "seed")


@dataclass(frozen=True)
class Point:
    keys: int
    error: float
    baseline: float


class _Mean:
    """The geometric mean of positive numbers added one at a time, as exactly as
    ``2 ** statistics.fmean(log2 values)`` (that is ``fsum(logs) / n``): the logs' sum is kept
    exact as non-overlapping partials (Shewchuk's, as in ``math.fsum``), a handful of floats
    whatever the count, so a series of 10^6 cases holds no list of them."""

    __slots__ = ("n", "partials")

    def __init__(self) -> None:
        self.n = 0
        self.partials: list[float] = []

    def add(self, value: float) -> None:
        self._add_log(math.log2(value))
        self.n += 1

    def _add_log(self, x: float) -> None:
        """``x`` into the exact sum (Shewchuk's partials, as ``math.fsum`` keeps them)."""
        i = 0
        for y in self.partials:
            if abs(x) < abs(y):
                x, y = y, x
            high = x + y
            low = y - (high - x)
            if low:
                self.partials[i] = low
                i += 1
            x = high
        self.partials[i:] = [x]

    def merge(self, other: "_Mean") -> None:
        """Add another mean's values: their exact sum joins this one (each partial added
        as :meth:`add` adds a logarithm), so the mean is that of every value added here."""
        for x in other.partials:
            self._add_log(x)
        self.n += other.n

    def value(self) -> float:
        return 2 ** (math.fsum(self.partials) / self.n)


@dataclass
class Series:
    """One backend's cases that differ only in length (and seed), for one tensor: per key
    length, the geometric means of the error and of the baseline error so far."""

    backend: str
    tensor: str
    key: tuple
    label: str
    lengths: dict[int, tuple[_Mean, _Mean]] = field(default_factory=dict)

    def add(self, point: Point) -> None:
        error, baseline = self.lengths.setdefault(point.keys, (_Mean(), _Mean()))
        error.add(point.error)
        baseline.add(point.baseline)

    def merge(self, other: "Series") -> None:
        """Add ``other``'s points (the same series, of records after these)."""
        for n, (error, baseline) in other.lengths.items():
            mine = self.lengths.setdefault(n, (_Mean(), _Mean()))
            mine[0].merge(error)
            mine[1].merge(baseline)

    def by_length(self) -> list[tuple[int, float, float]]:
        """(keys, geometric-mean error, geometric-mean baseline) per length, shortest first."""
        return [(n, error.value(), baseline.value())
                for n, (error, baseline) in sorted(self.lengths.items())]


@dataclass(frozen=True)
class Trend:
    series: Series
    slope: float
    """Least-squares slope of log2(error / baseline) against log2(keys)."""
    backend_slope: float
    baseline_slope: float
    growth: float
    """Excess error (error / baseline) at the longest length over that at the shortest."""
    lengths: tuple[int, ...]

    @property
    def finding(self) -> bool:
        return self.slope > SLOPE_BOUND and self.growth >= GROWTH_BOUND

    def describe(self) -> str:
        n0, n1 = self.lengths[0], self.lengths[-1]
        return (f"{self.series.label}: {self.series.tensor} error grows {2 ** self.slope:.2f}x "
                f"per doubling relative to the baseline (slope {self.backend_slope:+.2f} vs "
                f"{self.baseline_slope:+.2f} in log2 error per log2 keys; excess x"
                f"{self.growth:.2f} from {n0} to {n1} keys)")

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.series.backend, "tensor": self.series.tensor,
                "series": self.series.label, "slope": self.slope,
                "backend_slope": self.backend_slope, "baseline_slope": self.baseline_slope,
                "growth": self.growth, "lengths": list(self.lengths),
                "points": [list(p) for p in self.series.by_length()],
                "finding": self.finding}


Finding = Trend  # a Trend whose ``finding`` is True


class SeriesCollector:
    """:func:`collect_series` one record at a time (``attnbench show`` reads a run once)."""

    def __init__(self) -> None:
        self._found: dict[tuple, Series] = {}

    def add(self, r: dict) -> None:
        if r.get("verdict") not in JUDGED_VERDICTS:
            return
        case = r.get("case") or {}
        tensors = ((r.get("accuracy") or {}).get("tensors") or {})
        key = None
        for t in TENSORS:
            row = tensors.get(t) or {}
            error, base = row.get("rel_l2"), row.get("baseline_rel_l2")
            if row.get("baseline") != "fused" or not _positive(error) or not _positive(base):
                continue
            if key is None:
                key = tuple(sorted((k, _hashable(v)) for k, v in case.items()
                                   if k not in _SERIES_IGNORES))
            series = self._found.get((key, t))
            if series is None:
                series = self._found[(key, t)] = Series(case.get("backend", "?"), t, key,
                                                        _label(case))
            series.add(Point(int(case.get("seqlen_kv") or case.get("seqlen_q") or 0),
                             float(error), float(base)))

    def merge(self, other: "SeriesCollector") -> None:
        """Add what ``other`` collected of the records after these (series stay in the order
        first seen)."""
        for key, series in other._found.items():
            mine = self._found.get(key)
            if mine is None:
                self._found[key] = series
            else:
                mine.merge(series)

    def series(self) -> list[Series]:
        return list(self._found.values())


def collect_series(records: Iterable[dict]) -> list[Series]:
    """Series of judged records with both an error and a baseline error per tensor."""
    collector = SeriesCollector()
    for r in records:
        collector.add(r)
    return collector.series()


def fit(series: Series) -> Optional[Trend]:
    """The trend of one series, or None with fewer than MIN_LENGTHS lengths."""
    rows = series.by_length()
    if len(rows) < MIN_LENGTHS:
        return None
    xs = [math.log2(n) for n, _, _ in rows]
    own = [math.log2(e) for _, e, _ in rows]
    base = [math.log2(b) for _, _, b in rows]
    excess = [o - b for o, b in zip(own, base)]
    return Trend(series=series, slope=_slope(xs, excess), backend_slope=_slope(xs, own),
                 baseline_slope=_slope(xs, base), growth=2 ** (excess[-1] - excess[0]),
                 lengths=tuple(n for n, _, _ in rows))


def trends(records: Iterable[dict]) -> list[Trend]:
    """Every fitted series, findings first (steepest first)."""
    return fitted(collect_series(records))


def fitted(series: Iterable[Series]) -> list[Trend]:
    """:func:`trends` of series already collected."""
    fits = [t for t in (fit(s) for s in series) if t is not None]
    return sorted(fits, key=lambda t: (not t.finding, -t.slope))


def findings(records: Iterable[dict]) -> list[Trend]:
    return [t for t in trends(records) if t.finding]


def _slope(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _hashable(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def _label(case: dict) -> str:
    """The series in words: the case label without its lengths and seed."""
    parts = [case.get("backend", "?"), case.get("dtype", "?"),
             f"b{case.get('batch')} h{case.get('heads_q')}/{case.get('heads_kv')} "
             f"d{case.get('head_dim')}"]
    ratio = ""
    if case.get("seqlen_q") and case.get("seqlen_kv") and case["seqlen_q"] != case["seqlen_kv"]:
        ratio = f" Sq/Sk {case['seqlen_q'] / case['seqlen_kv']:.3g}"
    extras = [f"{k}={case[k]}" for k in ("mask", "bias", "dropout", "softcap", "inputs", "cp",
                                         "tp") if case.get(k) not in (None, "none", 0, 0.0, 1,
                                                                      "normal")]
    return " ".join(parts) + ratio + (" " + " ".join(extras) if extras else "")
