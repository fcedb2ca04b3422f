"""The ``timing`` section of a record: both directions of one case timed by the one loop of
:mod:`attnbench.timing.loop`, with FLOP/s, GB/s, percent of peak and peak memory.

Both case runners call :func:`time_case`; a multi-rank case passes a coordinator (every rank
runs the same calls, the slowest rank's time counts) and its world size (percent of peak is of
``world_size`` devices). Everything a backend derives from the case was built before (the
accuracy run or the warm-up), so the timed callables hold only the backend's calls.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from attnbench.hardware.clock_watch import watch_for
from attnbench.hardware.device import peak_memory
from attnbench.sweep.case import Case
from attnbench.sweep.flops import case_bytes, case_flops
from attnbench.sweep.options import TimingOptions
from attnbench.timing.loop import (L2_FLUSH_BYTES, Coordinator, TimingStats, graph_replay,
                                   make_clock, measure)


def time_case(case: Case, device, forward: Callable[[], object],
              backward: Optional[Callable[[], object]],
              options: TimingOptions, *, peaks: Optional[dict[str, Any]] = None,
              ranks: Optional[Coordinator] = None, world_size: int = 1,
              note: str = "") -> dict[str, Any]:
    """``peaks``: {"datasheet": TFLOP/s, "measured": TFLOP/s, "bandwidth_gbs": GB/s, each or
    None} of one device in the case's dtype. ``backward`` None: a forward-only case (decode),
    whose ``bwd`` section and backward figures are null. ``note``: why the times say nothing
    about throughput (CPU ranks, shared GPUs): FLOP/s and percentages are then null."""
    clock = make_clock(device, options.cpu_clock)
    notes = [note] if note else []
    memory = {}
    directions = (("fwd", forward),) + ((("bwd", backward),) if backward else ())
    for name, fn in directions:
        used = peak_memory(device, fn)
        memory[name] = ranks.slowest(used) if (ranks and used is not None) else used
    timed_as = {name: "eager" for name, _ in directions}
    if options.mode == "graph":
        replayed = {name: graph_replay(fn, device) for name, fn in directions}
        directions = tuple((name, fn) for name, (fn, _) in replayed.items())
        # Per direction: an autograd backward often cannot be captured, and its eager time
        # must not read as a graph time.
        for name, (_, why) in replayed.items():
            timed_as[name] = "eager" if why else "graph"
            notes += [f"{name}: {why}"] if why else []
    watch = watch_for(device)
    stats, clocks = {}, {}
    for name, fn in directions:
        before = watch.read() if watch else {}
        stats[name] = measure(fn, clock, options, ranks)
        clocks[name] = watch.window(before, watch.read()) if watch else None
    flops = dict(zip(("fwd", "bwd"), case_flops(case)))
    traffic = dict(zip(("fwd", "bwd"), case_bytes(case)))
    if backward is None:
        flops["bwd"] = traffic["bwd"] = None
    peaks = peaks or {}
    timing: dict[str, Any] = {
        "clock": clock.name, "mode": options.mode, "world_size": world_size,
        "l2_flush_bytes": L2_FLUSH_BYTES if clock.name == "cuda_events" else 0,
        "flops_fwd": flops["fwd"], "flops_bwd": flops["bwd"],
        "bytes_fwd": traffic["fwd"], "bytes_bwd": traffic["bwd"],
        "peak_tflops": peaks.get("datasheet"), "measured_peak_tflops": peaks.get("measured"),
        "peak_bandwidth_gbs": peaks.get("bandwidth_gbs"),
    }
    for name in ("fwd", "bwd"):
        timing[name] = _direction(stats[name], flops[name], traffic[name], memory[name], peaks,
                                  world_size, throughput=not note,
                                  timed_as=timed_as[name]) if name in stats else None
        if timing[name] is not None and clocks.get(name):
            timing[f"clocks_{name}"] = clocks[name]
    if notes:
        timing["note"] = "; ".join(notes)
    return timing


def _direction(stats: TimingStats, flops: float, traffic: float, memory: Optional[int],
               peaks: dict, world_size: int, throughput: bool,
               timed_as: str = "eager") -> dict[str, Any]:
    seconds = stats.median_ms * 1e-3
    tflops = flops / seconds / 1e12 if throughput and seconds > 0 else None
    gbps = traffic / seconds / 1e9 if throughput and seconds > 0 else None

    def pct(value: Optional[float], peak: Optional[float]) -> Optional[float]:
        return 100.0 * value / (peak * world_size) if value and peak else None

    return {**stats.to_dict(), "tflops": tflops, "pct_peak": pct(tflops, peaks.get("datasheet")),
            "pct_measured_peak": pct(tflops, peaks.get("measured")), "gbps": gbps,
            # Memory-bound calls (decode): achieved GB/s over the datasheet bandwidth.
            "pct_peak_bandwidth": pct(gbps, peaks.get("bandwidth_gbs")),
            "peak_memory_bytes": memory, "timed_as": timed_as}
