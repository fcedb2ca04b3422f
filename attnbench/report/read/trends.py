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

Only judged records (pass or fail) count; every tensor of every backend, whatever it is judged
against: its error over the fused baseline's on the same inputs (``fused_rel_l2``; records
before it carried one only for tensors judged against the fused baseline, in
``baseline_rel_l2``). A declaration (``input_precision``: a tensor computed in the input dtype
by design, judged against naive) chooses a tensor's bound, never whether it is shown: a
declared tensor whose error is over :data:`LEVEL_BOUND` times a correct fused kernel's at some
length -- where an undeclared one would fail -- and worse than eager itself
(:data:`NAIVE_EXCESS` x naive's error) is a finding too, at one length or many
(docs/findings.md: PyTorch's CPU flash backward). The ``naive`` backend is the input-precision
baseline itself, held to absolute bounds: no level finding on it. Pure data: no torch.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from attnbench.report.read.commonality import failed_tensors
from attnbench.results.records import JUDGED_VERDICTS, TENSORS
from attnbench.sweep.case import Case

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

LEVEL_BOUND = 2.0
"""A declared tensor's error over the fused baseline's above which it is a finding:
``attnbench.accuracy.bounds.FUSED_FACTOR``, what an undeclared tensor may lose before it fails
(a test holds the two equal). Correct fused kernels measured at most 1.29x (bounds.py); sdpa_math
on the CPU 1.0-1.1x; PyTorch 2.13's CPU flash backward 2.8-6.1x (dK/dV, bf16, docs/findings.md)."""

NAIVE_EXCESS = 1.25
"""... and worse than eager itself: over this many times the naive baseline's error, the
precision the declaration claims. An eager-precision kernel is 1.6-2.6x the fused baseline by
nature (naive, measured) and 0.7-1.1x naive (sdpa_math 0.35-0.5x, a flash-style recomputation
1.0x: naive's bound takes the worse of its two backwards); PyTorch's CPU flash dK/dV 1.1-2.2x."""

_SERIES_IGNORES = ("seqlen_q", "seqlen_kv", "seed")


@dataclass(frozen=True)
class Point:
    keys: int
    error: float
    baseline: float
    declared: bool = False
    queries: int = 0
    """Query rows (0: as many as keys)."""
    naive_ratio: float = 0.0
    """A declared tensor's error over the naive baseline's it is judged against (0: none)."""
    """The backend declared the tensor computed in the input dtype (judged against naive)."""


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
    declared: bool = False
    """Some case of it judged the tensor against naive by the backend's declaration."""
    shapes: dict[tuple[int, int], tuple[_Mean, _Mean, _Mean]] = field(default_factory=dict)
    """The same means per (keys, queries): the level is a shape's, not a length's mix of
    query counts (512 queries on 64 keys lose 35x where 256 on 64 lose 1x)."""
    failing: bool = False
    """Some case of it failed a check of this tensor: a finding on it repeats the failure."""

    def add(self, point: Point) -> None:
        shape = (point.keys, point.queries or point.keys)
        for means in (self.lengths.setdefault(point.keys, (_Mean(), _Mean())),
                      self.shapes.setdefault(shape, (_Mean(), _Mean(), _Mean()))):
            means[0].add(point.error)
            means[1].add(point.baseline)
        if point.naive_ratio > 0:
            self.shapes[shape][2].add(point.naive_ratio)
        self.declared = self.declared or point.declared

    def merge(self, other: "Series") -> None:
        """Add ``other``'s points (the same series, of records after these)."""
        self.declared = self.declared or other.declared
        self.failing = self.failing or other.failing
        for mine_all, theirs in ((self.lengths, other.lengths), (self.shapes, other.shapes)):
            for n, means in theirs.items():
                mine = mine_all.setdefault(n, tuple(_Mean() for _ in means))
                for kept, added in zip(mine, means):
                    kept.merge(added)

    def worst_shape(self) -> tuple[float, str]:
        """(error / baseline, where) of the shape whose excess error is the largest among those
        worse than eager (over NAIVE_EXCESS times naive's error, where naive judged them), else
        among all."""
        found, worse = [], []
        for (keys, queries), (error, baseline, naive) in self.shapes.items():
            where = f"{keys} keys" if queries == keys else f"{queries} queries on {keys} keys"
            found.append((error.value() / baseline.value(), where))
            if not naive.n or naive.value() > NAIVE_EXCESS:
                worse.append(found[-1])
        return max(worse or found)

    def worse_than_eager(self) -> bool:
        """Some shape's declared tensor is over NAIVE_EXCESS times the naive baseline's error,
        or was not measured against it (naive's S x S did not fit): unknown is not exempt."""
        return any(not naive.n or naive.value() > NAIVE_EXCESS
                   for _, _, naive in self.shapes.values())

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
    level: float = 0.0
    """The largest excess error over the lengths."""
    level_at: str = ""
    """... and the shape it is at ("4096 keys", "512 queries on 64 keys")."""

    @property
    def fitted(self) -> bool:
        """Enough lengths for a slope (a declared series is kept with fewer, for its level)."""
        return len(self.lengths) >= MIN_LENGTHS

    @property
    def grows(self) -> bool:
        return self.fitted and self.slope > SLOPE_BOUND and self.growth >= GROWTH_BOUND

    @property
    def over_level(self) -> bool:
        """A declared tensor that loses more than a fused kernel may (:data:`LEVEL_BOUND`)."""
        return self.series.declared and self.series.backend != "naive" \
            and self.level > LEVEL_BOUND and self.series.worse_than_eager()

    @property
    def finding(self) -> bool:
        return self.grows or self.over_level

    def describe(self) -> str:
        n0, n1 = self.lengths[0], self.lengths[-1]
        growth = (f"slope {self.backend_slope:+.2f} vs {self.baseline_slope:+.2f} in log2 error "
                  f"per log2 keys; excess x{self.growth:.2f} from {n0} to {n1} keys")
        if not self.grows:
            span = f"; x{self.growth:.2f} from {n0} to {n1} keys" if len(self.lengths) > 1 else ""
            return (f"{self.series.label}: {self.series.tensor} error is {self.level:.2f}x a "
                    f"correct fused kernel's at {self.level_at} (over {LEVEL_BOUND:g}x; "
                    f"declared computed in the input dtype, so judged against naive{span})")
        return (f"{self.series.label}: {self.series.tensor} error grows {2 ** self.slope:.2f}x "
                f"per doubling relative to the baseline ({growth})"
                + (f"; {self.level:.2f}x a correct fused kernel's at {self.level_at}, "
                   "declared computed in the input dtype" if self.over_level else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.series.backend, "tensor": self.series.tensor,
                "series": self.series.label, "slope": self.slope,
                "backend_slope": self.backend_slope, "baseline_slope": self.baseline_slope,
                "growth": self.growth, "lengths": list(self.lengths),
                "level": self.level, "level_at": self.level_at,
                "declared": self.series.declared,
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
        failed = failed_tensors(r) if r.get("verdict") == "fail" else set()
        key = None
        for t in TENSORS:
            row = tensors.get(t) or {}
            error, base = row.get("rel_l2"), row.get("fused_rel_l2")
            if base is None and row.get("baseline") == "fused":  # a record before fused_rel_l2
                base = row.get("baseline_rel_l2")
            if not _positive(error) or not _positive(base):
                continue
            if key is None:
                key = series_key(case)
            series = self._found.get((key, t))
            if series is None:
                series = self._found[(key, t)] = Series(case.get("backend", "?"), t, key,
                                                        _label(case))
            naive = row.get("baseline") == "naive"
            ratio = row.get("ratio") if naive else None
            series.add(Point(int(case.get("seqlen_kv") or case.get("seqlen_q") or 0),
                             float(error), float(base), naive, int(case.get("seqlen_q") or 0),
                             float(ratio) if _positive(ratio) else 0.0))
            series.failing = series.failing or t in failed

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


def series_key(case: dict) -> tuple:
    """The series a case belongs to (with a tensor, a :class:`Series`' ``key``): every case
    field but the lengths and the seed."""
    return tuple(sorted((k, _hashable(v)) for k, v in case.items() if k not in _SERIES_IGNORES))


def collect_series(records: Iterable[dict]) -> list[Series]:
    """Series of judged records with both an error and a baseline error per tensor."""
    collector = SeriesCollector()
    for r in records:
        collector.add(r)
    return collector.series()


def fit(series: Series) -> Optional[Trend]:
    """The trend of one series, or None with fewer than MIN_LENGTHS lengths (a declared series
    is kept with any number: its level alone may be a finding)."""
    rows = series.by_length()
    if not rows or (len(rows) < MIN_LENGTHS and not series.declared):
        return None
    xs = [math.log2(n) for n, _, _ in rows]
    own = [math.log2(e) for _, e, _ in rows]
    base = [math.log2(b) for _, _, b in rows]
    excess = [o - b for o, b in zip(own, base)]
    level, level_at = series.worst_shape()
    return Trend(series=series, slope=_slope(xs, excess), backend_slope=_slope(xs, own),
                 baseline_slope=_slope(xs, base), growth=2 ** (excess[-1] - excess[0]),
                 lengths=tuple(n for n, _, _ in rows), level=level, level_at=level_at)


def trends(records: Iterable[dict]) -> list[Trend]:
    """Every fitted series, findings first (steepest first)."""
    return fitted(collect_series(records))


def fitted(series: Iterable[Series]) -> list[Trend]:
    """:func:`trends` of series already collected."""
    fits = [t for t in (fit(s) for s in series) if t is not None]
    return sorted(fits, key=lambda t: (not t.finding, not t.grows, -t.slope, -t.level))


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
    if case.get("captured"):  # two calls of one capture are two series: name the call
        extras.append(Case.from_dict(case).captured_name)
    return " ".join(parts) + ratio + (" " + " ".join(extras) if extras else "")
