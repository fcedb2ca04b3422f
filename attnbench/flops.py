"""One FLOP model for every backend, and peak throughput per device.

Forward FLOPs = 2 * B * Hq * visible_pairs * (D + Dv): one multiply-add per element for
Q @ K^T and for P @ V, over the (query, key) pairs the mask lets through (causal, windows and
Sq != Sk counted exactly, not halved). Backward = 2.5 x forward: 2.0 for the four backward
matmuls plus 0.5 for recomputing Q @ K^T (the FlashAttention papers' convention). GQA does not
change the FLOPs (every query head still does its matmuls); it changes the bytes.
"""

from __future__ import annotations

from attnbench.spec import Case

BACKWARD_FACTOR = 2.5  # 2.0 (bwd) + 0.5 (recompute)


def visible_pairs(seqlen_q: int, seqlen_kv: int, window_left: int, window_right: int) -> int:
    """Number of (query, key) pairs visible under a window band (-1 = unbounded), with
    queries aligned bottom-right. Exact, O(Sq) in pure Python arithmetic."""
    if window_left < 0 and window_right < 0:
        return seqlen_q * seqlen_kv
    offset = seqlen_kv - seqlen_q
    total = 0
    for i in range(seqlen_q):
        diag = i + offset
        lo = 0 if window_left < 0 else max(0, diag - window_left)
        hi = seqlen_kv - 1 if window_right < 0 else min(seqlen_kv - 1, diag + window_right)
        if hi >= lo:
            total += hi - lo + 1
    return total


def case_flops(case: Case) -> tuple[float, float]:
    """(forward, backward) FLOPs of one call on the whole (unsplit) case."""
    pairs = visible_pairs(case.seqlen_q, case.seqlen_kv, *case.window_bounds)
    fwd = 2.0 * case.batch * case.heads_q * pairs * (case.head_dim + case.head_dim_v)
    return fwd, BACKWARD_FACTOR * fwd


# Dense tensor-core peak TFLOP/s per SKU (vendor datasheets, no sparsity). Keys are matched as
# substrings of torch.cuda.get_device_name(), longest first; fp32 is the non-tensor-core rate
# (tf32 would be higher, but fp32 cases run IEEE fp32).
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9},
    "H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "fp32": 51.2},
    "H100": {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9},       # SXM
    "H800": {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9},
    "H20": {"bf16": 148.0, "fp16": 148.0, "fp32": 44.0},
    "B200": {"bf16": 2250.0, "fp16": 2250.0, "fp32": 80.0},
    "GB200": {"bf16": 2500.0, "fp16": 2500.0, "fp32": 80.0},
    "A100": {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5},
    "A800": {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5},
    "A10G": {"bf16": 70.0, "fp16": 70.0, "fp32": 31.2},
    "A6000": {"bf16": 154.8, "fp16": 154.8, "fp32": 38.7},
    "L40S": {"bf16": 362.1, "fp16": 362.1, "fp32": 91.6},
    "L4": {"bf16": 121.0, "fp16": 121.0, "fp32": 30.3},
    "V100": {"bf16": 0.0, "fp16": 125.0, "fp32": 15.7},
    "MI300X": {"bf16": 1307.4, "fp16": 1307.4, "fp32": 163.4},
}


def gpu_kind(device_name: str) -> str:
    """Short kind used for routing and comparison ("H100", "A100", ...; "cpu" for CPUs)."""
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if key.lower() in device_name.lower():
            return key.split()[0]
    if device_name.lower() == "cpu":
        return "cpu"
    return device_name.replace("NVIDIA ", "").split()[0] if device_name else "unknown"


def peak_tflops(device_name: str, dtype: str) -> float | None:
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if key.lower() in device_name.lower():
            value = PEAK_TFLOPS[key].get(dtype)
            return value or None
    return None
