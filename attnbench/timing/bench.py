"""The timing loop of the kernel benchmark scripts (``benchmarks/bench_*.py``), in one place.

Not the harness's timer (:mod:`attnbench.timing.loop`, with L2 flushes, stop rules and CUDA events
for every case of a sweep): a quick median for scripts that compare kernels on one GPU.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable


def bench_ms(fn: Callable[[], object], device, rep_ms: int) -> float:
    """Median milliseconds of ``fn``; only this is timed. On a GPU triton's ``do_bench`` (25
    warm-up ms, ``rep_ms`` of samples); elsewhere three wall-clock calls (the interpreter: a
    check that the script runs, not a speed)."""
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)
