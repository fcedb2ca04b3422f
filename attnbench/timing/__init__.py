"""How fast: the one timing loop and the timing section of a record.

:mod:`~.loop` times one call (warm-up by time, samples until the spread settles, CUDA events and
L2 flushes on a GPU, a monotonic clock on a CPU); :mod:`~.case` times both directions of a case
and adds FLOP/s, GB/s, percent of peak and peak memory; :mod:`~.bench` is the loop of the
kernel benchmark scripts in ``benchmarks/``.
"""

from attnbench import package_face

__all__, __getattr__ = package_face(__name__, {
    "bench": ("bench_ms",),
    "case": ("time_case",),
    "loop": ("CpuClock", "EventClock", "ProcessClock", "StopRule", "calls_per_sample",
             "make_clock", "measure", "sample_target_ms", "summarize"),
})
