"""Timing one call: warm-up, then samples until the spread is small or the time cap is hit.

On CUDA each sample is bracketed by CUDA events after an L2 flush (writing a buffer larger than
any L2 so the timed call starts cold, as it does inside a model); on CPU a monotonic clock.
Median and quartiles are kept with the raw samples, so a report can show the spread.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from attnbench.spec import TimingOptions

# H100/H200 have 50 MiB of L2, B200 126 MiB: 256 MiB covers every current part.
_L2_FLUSH_BYTES = 256 << 20


@dataclass
class TimingStats:
    median_ms: float
    q1_ms: float
    q3_ms: float
    min_ms: float
    n: int
    samples_ms: list[float] = field(repr=False)

    @property
    def rel_iqr(self) -> float:
        return (self.q3_ms - self.q1_ms) / self.median_ms if self.median_ms > 0 else 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(samples_ms: list[float]) -> TimingStats:
    ordered = sorted(samples_ms)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return TimingStats(median_ms=statistics.median(ordered), q1_ms=q1, q3_ms=q3,
                       min_ms=ordered[0], n=len(ordered), samples_ms=list(samples_ms))


class _CpuClock:
    name = "perf_counter"

    def sample(self, fn: Callable[[], object]) -> float:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3


class _CudaClock:
    name = "cuda_events"

    def __init__(self, device):
        import torch

        self.torch = torch
        self.flush = torch.empty(_L2_FLUSH_BYTES, dtype=torch.uint8, device=device)

    def sample(self, fn: Callable[[], object]) -> float:
        torch = self.torch
        self.flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)


def make_clock(device):
    return _CudaClock(device) if getattr(device, "type", str(device)) == "cuda" else _CpuClock()


def measure(fn: Callable[[], object], clock, options: TimingOptions) -> TimingStats:
    """Time ``fn`` adaptively. ``fn`` must do the whole call (its result is discarded)."""
    for _ in range(options.warmup):
        fn()
    samples: list[float] = []
    deadline = time.perf_counter() + options.max_seconds
    while True:
        samples.append(clock.sample(fn))
        n = len(samples)
        if n >= options.max_samples:
            break
        if n >= options.min_samples:
            if summarize(samples).rel_iqr <= options.target_rel_iqr:
                break
            if time.perf_counter() >= deadline:
                break
        elif time.perf_counter() >= deadline + options.max_seconds:
            break  # a very slow call: even min_samples would take more than twice the cap
    return summarize(samples)
