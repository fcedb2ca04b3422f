"""Timing one call: warm-up by time, samples until the spread settles -- one loop for every case.

On a GPU the loop is do_bench / nvbench grade:

* **The window holds only the call.** Each call is ``flush L2 -> start event -> call -> end
  event``; the host waits for the last end event only after recording it, so no host wake-up or
  launch latency of a next call is inside a window. The flush (a write of a buffer larger than
  any L2) runs before every start event, so every call starts cold, as inside a model (a decode
  kernel's KV cache is not in L2 either), and the GPU is busy flushing while the host enqueues
  the call.
* **Warm-up by time and by count**: at least ``warmup`` calls and ``warmup_ms`` of measured time
  (clocks ramp up, autotuners and allocators settle).
* **Short kernels get several calls per sample** (``calls_per_sample``, chosen from the fastest
  of the last three warm-up calls so that a sample spans at least ``min_sample_ms`` of calls; a
  sample is their mean), so one sample is not one event pair's resolution and jitter; or --
  ``mode: graph`` -- the call is captured once into a CUDA graph that is replayed, which removes
  the host's launch overhead.
* **Adaptive stop**: ``min_samples`` is a floor (capped by the calls' own time, not the wall
  clock's, which a loaded box stretches); past it, stop once (q3 - q1) / median <=
  ``target_rel_iqr``, or anyway at ``max_samples`` or ``max_seconds``. A result whose spread
  never settled is flagged ``noisy``, so ``attnbench compare`` can call it ambiguous instead of
  a result. Raw samples are kept.

On the CPU the same loop runs with ``time.perf_counter`` and no flush (or, ``cpu_clock: cpu``,
the process's CPU time: :class:`ProcessClock`), and a sample is a block of calls of at least
``cpu_min_sample_ms`` (2 ms), as ``torch.utils.benchmark``'s blocked runs: a single
sub-millisecond call carries the scheduler, the caches and the clock's own cost. Measured by
``benchmarks/speed_gate.py`` at load 8 on 2 cores (sdpa fp32, calls of 0.1-1.4 ms): IQR /
median 20 % median, 52 % p95 at one call a sample; 16 % and 28 % in blocks.

Multi-rank cases run the same loop on every rank with a :class:`Coordinator` that aligns each
sample's start with a barrier, takes the slowest rank's time as the sample, and makes rank 0's
decisions (warm-up done, calls per sample, stop) everyone's -- every rank must make the same
calls, because the calls hold collectives.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Protocol

from attnbench.sweep.options import FLOOR_CAP, FLOOR_WALL_CAP, TimingOptions

L2_FLUSH_BYTES = 256 << 20
"""H100/H200 have 50 MiB of L2, B200 126 MiB: 256 MiB evicts every current part's."""
MAX_CALLS_PER_SAMPLE = 1000


@dataclass(frozen=True)
class TimingStats:
    """One direction (forward or backward) of one case; times are per call."""

    median_ms: float
    q1_ms: float
    q3_ms: float
    min_ms: float
    n: int
    samples_ms: list[float] = field(repr=False)
    calls_per_sample: int = 1
    warmup_calls: int = 0
    warmup_ms: float = 0.0
    noisy: bool = False
    """The spread never reached ``target_rel_iqr`` (or too few samples fit the time cap)."""

    @property
    def rel_iqr(self) -> float:
        return (self.q3_ms - self.q1_ms) / self.median_ms if self.median_ms > 0 else 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(samples_ms: list[float], **extra: Any) -> TimingStats:
    ordered = sorted(samples_ms)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return TimingStats(median_ms=statistics.median(ordered), q1_ms=q1, q3_ms=q3,
                       min_ms=ordered[0], n=len(ordered), samples_ms=list(samples_ms), **extra)


class StopRule:
    """When sampling ends, and whether the result is noisy -- the one copy of this rule."""

    def __init__(self, options: TimingOptions):
        self.options = options

    def settled(self, samples: list[float]) -> bool:
        return (len(samples) >= self.options.min_samples
                and summarize(samples).rel_iqr <= self.options.target_rel_iqr)

    def should_stop(self, samples: list[float], elapsed_s: float,
                    measured_s: Optional[float] = None) -> bool:
        """``elapsed_s``: wall seconds of sampling; ``measured_s``: what the clock measured of
        them (the calls' own time; None: the wall time)."""
        o = self.options
        n = len(samples)
        if n >= o.max_samples:
            return True
        if n < o.min_samples:  # the floor: max_seconds does not cut it short (issue 40)
            measured_s = elapsed_s if measured_s is None else measured_s
            return (measured_s >= FLOOR_CAP * o.max_seconds
                    or elapsed_s >= FLOOR_WALL_CAP * o.max_seconds)
        return self.settled(samples) or elapsed_s >= o.max_seconds

    def noisy(self, samples: list[float]) -> bool:
        return not self.settled(samples)


# -- clocks: one sample of ``calls`` calls, in ms per call --------------------------------------


class Clock(Protocol):
    name: str

    def sample(self, fn: Callable[[], object], calls: int) -> float: ...


class CpuClock:
    name = "perf_counter"
    cpu = True  # samples are blocks of cpu_min_sample_ms, not min_sample_ms

    def sample(self, fn: Callable[[], object], calls: int = 1) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) * 1e3 / calls


class ProcessClock:
    """CPU time of this process (all its threads): the work a call did, however many other
    processes shared the cores meanwhile (timing option ``cpu_clock: cpu``). On a box with more
    runnable processes than cores, wall-clock samples of one call spread 4x (measured: 2.4-8.5
    ms for a 2.4 ms forward at load 9 on 2 cores), its CPU time 1.4x."""

    name = "process_time"
    cpu = True

    def sample(self, fn: Callable[[], object], calls: int = 1) -> float:
        start = time.process_time()
        for _ in range(calls):
            fn()
        return (time.process_time() - start) * 1e3 / calls


class EventClock:
    """Device events around each call, an L2 flush before each start event. ``new_event`` makes
    an object with ``record()``, ``synchronize()`` and ``elapsed_time(other)`` (ms), as
    ``torch.cuda.Event(enable_timing=True)``; ``flush`` evicts the L2. Both injectable, so the
    order of calls can be checked without a GPU."""

    name = "cuda_events"

    def __init__(self, new_event: Callable[[], Any], flush: Callable[[], None]):
        self.new_event, self.flush = new_event, flush

    def sample(self, fn: Callable[[], object], calls: int = 1) -> float:
        windows = []
        for _ in range(calls):
            start, end = self.new_event(), self.new_event()
            self.flush()             # outside the window
            start.record()
            fn()
            end.record()
            windows.append((start, end))
        windows[-1][1].synchronize()  # the host waits only once every window is recorded
        return sum(start.elapsed_time(end) for start, end in windows) / calls


def make_clock(device, cpu_clock: str = "wall") -> Clock:
    """perf_counter on the CPU (``cpu_clock`` ``cpu``: the process's CPU time); CUDA events
    with an L2 flush on a GPU."""
    if getattr(device, "type", str(device)) != "cuda":
        return ProcessClock() if cpu_clock == "cpu" else CpuClock()
    import torch

    buffer = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)
    return EventClock(lambda: torch.cuda.Event(enable_timing=True), buffer.zero_)


# -- coordination of ranks -------------------------------------------------------------------------


class Coordinator(Protocol):
    def align(self) -> None:
        """Called before every sample: a barrier across ranks (aligned starts)."""

    def slowest(self, ms: float) -> float:
        """The largest of every rank's value: the case takes as long as its slowest rank."""

    def decide(self, value: int) -> int:
        """Rank 0's ``value`` on every rank."""


class SingleRank:
    def align(self) -> None:
        pass

    def slowest(self, ms: float) -> float:
        return ms

    def decide(self, value: int) -> int:
        return int(value)


# -- the loop ---------------------------------------------------------------------------------------


def measure(fn: Callable[[], object], clock: Clock, options: TimingOptions,
            ranks: Optional[Coordinator] = None) -> TimingStats:
    """Time ``fn`` (the whole call; its result is discarded). See the module docstring."""
    ranks = ranks or SingleRank()
    rule = StopRule(options)
    # Warm-up: single calls (each sample flushes and syncs, which is fine here) until both the
    # call count and the measured time are reached.
    warm_calls, warm_ms, last_ms = 0, 0.0, []
    while True:
        if ranks.decide(warm_calls >= options.warmup and warm_ms >= options.warmup_ms):
            break
        ranks.align()
        ms = ranks.slowest(clock.sample(fn, 1))
        warm_calls += 1
        warm_ms += ms
        last_ms = (last_ms + [ms])[-3:]
        if warm_calls >= 10_000:  # a no-op call and a large warmup_ms: enough
            break
    estimate = min(last_ms) if last_ms else None
    calls = ranks.decide(calls_per_sample(estimate, sample_target_ms(clock, options)))
    samples: list[float] = []
    start = time.perf_counter()
    while True:
        ranks.align()
        samples.append(ranks.slowest(clock.sample(fn, calls)))
        measured_s = sum(samples) * calls / 1e3
        if ranks.decide(rule.should_stop(samples, time.perf_counter() - start, measured_s)):
            break
    return summarize(samples, calls_per_sample=calls, warmup_calls=warm_calls,
                     warmup_ms=warm_ms, noisy=rule.noisy(samples))


def sample_target_ms(clock: Clock, options: TimingOptions) -> float:
    """How long one sample's block of calls should last: ``cpu_min_sample_ms`` on a CPU clock,
    ``min_sample_ms`` on the device's events (whose windows are one call each, flushed)."""
    return options.cpu_min_sample_ms if getattr(clock, "cpu", False) else options.min_sample_ms


def calls_per_sample(estimate_ms: Optional[float], min_sample_ms: float) -> int:
    """Calls per sample so that one sample lasts at least ``min_sample_ms`` (at most 1000);
    ``estimate_ms``: the fastest of the last warm-up calls (a slow one, preempted, would make
    the blocks too short)."""
    if not estimate_ms or estimate_ms <= 0 or min_sample_ms <= 0:
        return 1
    return max(1, min(MAX_CALLS_PER_SAMPLE, math.ceil(min_sample_ms / estimate_ms)))


# -- CUDA graph mode -------------------------------------------------------------------------------


def graph_replay(fn: Callable[[], object], device) -> tuple[Callable[[], object], str]:
    """(replay, note): ``fn`` captured once into a CUDA graph and a function replaying it; or
    ``fn`` itself and why it could not be captured (a host sync or a CPU op inside the call)."""
    if getattr(device, "type", str(device)) != "cuda":
        return fn, "graph mode needs a CUDA device; timed eagerly"
    import torch

    try:
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(3):  # warm-up on a side stream, as torch.cuda.graphs requires
                fn()
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    except Exception as exc:  # the backend is not capturable: say so and time it eagerly
        torch.cuda.synchronize(device)
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        return fn, f"graph capture failed ({type(exc).__name__}: {first}); timed eagerly"
    return graph.replay, ""
