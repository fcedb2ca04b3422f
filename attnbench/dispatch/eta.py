"""The ETA of a run from measured case times, per backend and GPU kind (issue 40, item 4).

The old ETA was ``cases left / (cases done / seconds elapsed)``: the elapsed time holds the
cluster's start and the first cases' compiles, so the first ETAs said 677 s, 1080 s and 4298 s
for runs that took 28 s, 35 s and 362 s. Here each finished case adds its own seconds
(``duration_s``: inside its rank processes, a compile included) to the mean of its
(backend, GPU kind); the work left is each key's cases left times that key's mean (a key not
measured yet: the mean over every case measured), spread over the devices (or over the cases
left, when fewer). Before any case
has finished there is no ETA (``None``: shown as ``?``), rather than a guess.
"""

from __future__ import annotations

import collections
import math
from typing import Iterable, Mapping, Optional

from attnbench.sweep.case import Case


def time_key(case: Mapping | Case) -> tuple[str, str]:
    """(backend, GPU kind): cases that cost alike (a Triton case is not an sdpa case; an H100
    is not a CPU). ``case``: a Case or its dict (a record's ``case``)."""
    if isinstance(case, Case):
        return case.backend, case.gpu
    return str(case.get("backend")), str(case.get("gpu"))


class CaseTimes:
    """Measured seconds per :func:`time_key`, the cases left of each, and the ETA from them."""

    def __init__(self) -> None:
        self.left: collections.Counter = collections.Counter()
        """Cases to run per key (planned, not finished)."""
        self.seconds: dict[tuple[str, str], float] = {}
        self.measured: collections.Counter = collections.Counter()

    def plan(self, cases: Iterable[Case]) -> None:
        self.left.update(time_key(c) for c in cases)

    def finished(self, record: Mapping) -> None:
        """A record arrived: its case is no longer left; its seconds count when it has some
        (a skipped or unsupported case took none and says nothing of the others)."""
        case = record.get("case")
        if not isinstance(case, Mapping):
            return
        key = time_key(case)
        if self.left[key] > 0:
            self.left[key] -= 1
        seconds = record.get("duration_s")
        if isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0:
            self.seconds[key] = self.seconds.get(key, 0.0) + float(seconds)
            self.measured[key] += 1

    def mean_s(self, key: tuple[str, str]) -> Optional[float]:
        """Mean seconds of the key's finished cases; of every finished case when it has none
        yet; None before any case finished."""
        if self.measured[key]:
            return self.seconds[key] / self.measured[key]
        count = sum(self.measured.values())
        return sum(self.seconds.values()) / count if count else None

    def eta_s(self, slots: int) -> Optional[float]:
        """Seconds until the cases left are done on ``slots`` devices at once; None while no
        case has been measured."""
        if not any(self.left.values()):
            return 0.0
        if not self.measured:
            return None
        work = sum(n * self.mean_s(key) for key, n in self.left.items() if n > 0)
        # Fewer cases left than devices: only that many run at once.
        return work / max(1, min(slots, sum(n for n in self.left.values() if n > 0)))
