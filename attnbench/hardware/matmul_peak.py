"""The worker's own matmul peak: what this GPU, at its clocks and power limit, actually reaches.

A datasheet peak assumes boost clocks the card may not hold (the lent H200 reaches ~790 of 989
bf16 TFLOP/s), so "% of measured peak" beside "% of datasheet peak" says how close a kernel is
to what is reachable here. Measured once per worker (the caller keeps the result), never on
import. On CPU it returns {} at once: CPU timings are for correctness runs, and a CPU's matmul
rate depends on threads and BLAS, so a percentage of it would compare nothing.

Method: square ``size`` x ``size`` matmuls into a preallocated output (no allocation in the timed
region), inputs from randn (zeros draw less power and boost higher than real data), warm-up by
time to steady clocks, then samples of several back-to-back calls between two CUDA events with
no host sync inside; the best sample wins (a peak, not a typical rate). fp32 is IEEE fp32 (TF32
off, as fp32 cases run); ``tf32`` may be asked for separately.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Iterable

from attnbench.dtypes import DTYPES

log = logging.getLogger("attnbench.hardware")

MATMUL_SIZE = 8192  # 1.1 TFLOP a call (~1.4 ms at the H200's measured ~790 bf16 TFLOP/s): launch
#                    and wave-tail effects are small; operands 3 x 128 MiB in bf16, past any L2
WARMUP_FRACTION = 0.3  # of each dtype's budget: 0.3 s by default, 12x do_bench's 25 ms warm-up
MIN_WARMUP_CALLS = 3
SAMPLE_S = 0.02  # one timed sample; CUDA documents event timing resolution as ~0.5 us
MIN_SAMPLES = 3
_TORCH_DTYPES = {**{d.name: d.torch_name for d in DTYPES if not d.is_fp8}, "tf32": "float32"}
"""The dtypes measured (torch.matmul has no fp8) -> torch's name; tf32 is fp32 with TF32 on."""


def measure_matmul_peak(device: Any = "cuda", dtypes: Iterable[str] = ("bf16", "fp16", "fp32"),
                        seconds: float = 1.0, size: int = MATMUL_SIZE) -> dict[str, float]:
    """Best dense matmul TFLOP/s per dtype on ``device`` ({} on CPU); ``seconds`` per dtype."""
    import torch

    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return {}
    unknown = [d for d in dtypes if d not in _TORCH_DTYPES]
    if unknown:
        raise ValueError(f"dtypes: got {unknown}, expected some of {sorted(_TORCH_DTYPES)}")
    results = {}
    with torch.cuda.device(device):
        for dtype in dtypes:
            with _tf32(torch, dtype == "tf32"):
                results[dtype] = _best_tflops(torch, device, getattr(torch, _TORCH_DTYPES[dtype]),
                                              size, seconds)
            log.info("matmul peak %s on %s: %.1f TFLOP/s", dtype, device, results[dtype])
    return results


def _best_tflops(torch: Any, device: Any, dtype: Any, size: int, seconds: float) -> float:
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    flops = 2.0 * size ** 3

    started, calls = time.perf_counter(), 0
    while calls < MIN_WARMUP_CALLS or time.perf_counter() - started < seconds * WARMUP_FRACTION:
        torch.matmul(a, b, out=out)
        calls += 1
        torch.cuda.synchronize()  # keep the queue short so the loop's clock means GPU time
    per_call_s = (time.perf_counter() - started) / calls
    calls_per_sample = max(1, round(SAMPLE_S / per_call_s))

    best_s, samples = float("inf"), 0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    deadline = started + seconds
    while samples < MIN_SAMPLES or time.perf_counter() < deadline:
        start.record()
        for _ in range(calls_per_sample):
            torch.matmul(a, b, out=out)
        end.record()
        end.synchronize()
        best_s = min(best_s, start.elapsed_time(end) / 1e3 / calls_per_sample)
        samples += 1
    del a, b, out
    torch.cuda.empty_cache()
    return round(flops / best_s / 1e12, 2)


@contextlib.contextmanager
def _tf32(torch: Any, allow: bool):
    """TF32 on or off for the block, restored after (the worker's setting is not ours). torch
    >= 2.9 has ``fp32_precision`` and may refuse a mix of it and the older ``allow_tf32``."""
    matmul = torch.backends.cuda.matmul
    name, value = (("fp32_precision", "tf32" if allow else "ieee")
                   if hasattr(matmul, "fp32_precision") else ("allow_tf32", allow))
    saved = getattr(matmul, name)
    setattr(matmul, name, value)
    try:
        yield
    finally:
        setattr(matmul, name, saved)
