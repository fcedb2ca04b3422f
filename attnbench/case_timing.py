"""The ``timing`` section of a record: both directions of one case timed by the one loop of
:mod:`attnbench.timing`, with FLOP/s, GB/s, percent of peak and peak memory.

Both case runners call :func:`time_case`; a multi-rank case passes a coordinator (every rank
runs the same calls, the slowest rank's time counts) and its world size (percent of peak is of
``world_size`` devices). Everything a backend derives from the case was built before (the
accuracy run or the warm-up), so the timed callables hold only the backend's calls.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from attnbench.device import peak_memory
from attnbench.flops import case_bytes, case_flops
from attnbench.spec import Case, TimingOptions
from attnbench.timing import L2_FLUSH_BYTES, Coordinator, TimingStats, graph_replay, make_clock, \
    measure


def time_case(case: Case, device, forward: Callable[[], object], backward: Callable[[], object],
              options: TimingOptions, *, peaks: Optional[dict[str, Any]] = None,
              ranks: Optional[Coordinator] = None, world_size: int = 1,
              note: str = "") -> dict[str, Any]:
    """``peaks``: {"datasheet": TFLOP/s or None, "measured": TFLOP/s or None} of one device in
    the case's dtype. ``note``: why the times say nothing about throughput (CPU ranks, shared
    GPUs): FLOP/s and percentages are then null."""
    clock = make_clock(device)
    notes = [note] if note else []
    memory = {}
    for name, fn in (("fwd", forward), ("bwd", backward)):
        used = peak_memory(device, fn)
        memory[name] = ranks.slowest(used) if (ranks and used is not None) else used
    if options.mode == "graph":
        forward, fwd_note = graph_replay(forward, device)
        backward, bwd_note = graph_replay(backward, device)
        notes += sorted({n for n in (fwd_note, bwd_note) if n})
    stats = {"fwd": measure(forward, clock, options, ranks),
             "bwd": measure(backward, clock, options, ranks)}
    flops = dict(zip(("fwd", "bwd"), case_flops(case)))
    traffic = dict(zip(("fwd", "bwd"), case_bytes(case)))
    peaks = peaks or {}
    timing: dict[str, Any] = {
        "clock": clock.name, "mode": options.mode, "world_size": world_size,
        "l2_flush_bytes": L2_FLUSH_BYTES if clock.name == "cuda_events" else 0,
        "flops_fwd": flops["fwd"], "flops_bwd": flops["bwd"],
        "bytes_fwd": traffic["fwd"], "bytes_bwd": traffic["bwd"],
        "peak_tflops": peaks.get("datasheet"), "measured_peak_tflops": peaks.get("measured"),
    }
    for name in ("fwd", "bwd"):
        timing[name] = _direction(stats[name], flops[name], traffic[name], memory[name], peaks,
                                  world_size, throughput=not note)
    if notes:
        timing["note"] = "; ".join(notes)
    return timing


def _direction(stats: TimingStats, flops: float, traffic: float, memory: Optional[int],
               peaks: dict, world_size: int, throughput: bool) -> dict[str, Any]:
    seconds = stats.median_ms * 1e-3
    tflops = flops / seconds / 1e12 if throughput and seconds > 0 else None

    def pct(peak: Optional[float]) -> Optional[float]:
        return 100.0 * tflops / (peak * world_size) if tflops and peak else None

    return {**stats.to_dict(), "tflops": tflops, "pct_peak": pct(peaks.get("datasheet")),
            "pct_measured_peak": pct(peaks.get("measured")),
            "gbps": traffic / seconds / 1e9 if throughput and seconds > 0 else None,
            "peak_memory_bytes": memory}
