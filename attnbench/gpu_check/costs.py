"""The check's cost model: seconds per case, per process start and per compiled kernel, so the
plan can say what each step should take on a machine before anything runs.

Every constant carries its source. A GPU run writes the measured seconds beside these
estimates (``summary.json``): where they differ by more than 2x, the model is what to fix.
Estimates of timing are upper bounds (the loop's caps); the loop usually stops earlier, once
the spread of its samples settles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnbench.dtypes import BY_NAME, is_fp8
from attnbench.sweep.case import Case
from attnbench.sweep.flops import case_bytes, case_flops
from attnbench.sweep.options import FLOOR_CAP, RunOptions, TimingOptions

# -- the machines ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Machine:
    """What the cost model needs to know about a box."""

    name: str
    cores: int
    """CPU cores: parallel compile processes (one per variant) at most."""
    matmul_tflops: float
    """bf16 dense matmul TFLOP/s this box reaches (fp8: twice, the datasheet's ratio)."""
    bandwidth_gbs: float
    """Device memory GB/s."""
    fp64_tflops: float
    """The fp64 reference's effective rate (a blockwise loop of fp64 matmuls and softmax)."""
    baseline_tflops: float
    """The fused baseline's effective rate (blockwise, the case's dtype, fp32 accumulation)."""
    process_start_s: float
    """A torch process ready to run: interpreter, torch, triton, attnbench, device context."""
    compile_s: float
    """Seconds to compile one kernel config (ptxas included)."""
    interpreted_call_s: float = 0.0
    """CPU only: a Triton kernel call under the interpreter at the CPU sweeps' sizes."""

    @property
    def gpu(self) -> bool:
        return self.interpreted_call_s == 0.0


H200 = Machine(
    name="H200", cores=16,  # the lent H200 node: 16 CPU cores (device README)
    matmul_tflops=790.0,    # bf16, measured on the lent H200 (datasheet dense 989)
    bandwidth_gbs=4800.0,   # HBM3e datasheet (attnbench/hardware/peaks.py)
    fp64_tflops=25.0,       # datasheet fp64 tensor 67; the reference is a Python loop of
    #                         block matmuls plus exp/sum passes in fp64: ~1/3 of it
    baseline_tflops=100.0,  # the same loop in bf16 with fp32 accumulation: ~1/8 of the bf16 peak
    process_start_s=6.0,    # python + torch (~2.5 s) + triton and attnbench (~1.5 s) + a CUDA
    #                         context (~1 s), plus 1 s of slack
    compile_s=3.5,          # issue #24: 2-3.5 s per config under triton 3.6; the upper end
)
CPU = Machine(
    name="CPU", cores=2,    # the CI machine's (and this one's) 2 cores
    matmul_tflops=0.05, bandwidth_gbs=10.0, fp64_tflops=0.02, baseline_tflops=0.05,
    process_start_s=4.0,    # python + torch + the interpreter's triton, measured 2.5-3.5 s here
    compile_s=0.0,          # the interpreter compiles nothing
    interpreted_call_s=0.4,  # measured here: one forward or backward call at the CPU sweeps'
    #                          sizes under TRITON_INTERPRET=1 (0.1-0.6 s)
)

# -- per-case constants ---------------------------------------------------------------------------

EFFICIENCY = {"fwd": 0.5, "bwd": 0.32}
"""Attention TFLOP/s over the matmul peak: kernel_gpu.yaml's goals on H100/H200 (forward >= 400,
backward >= 250 TFLOP/s of the measured ~790)."""
BANDWIDTH_EFFICIENCY = 0.5
"""Decode GB/s over the memory bandwidth: a split-KV kernel reading pages of 16 tokens."""
LAUNCH_S = 20e-6
"""Host time to launch one call (Python, argument checks, a launch or two): the floor of a
call's wall time."""
FLUSH_S = 0.1e-3
"""The timing loop's L2 flush before every call: 256 MiB written at ~2.5 TB/s."""
CASE_OVERHEAD_S = 0.3
"""A case's fixed cost: the pipe round trip, backend set-up, the record, gc and empty_cache."""
UNSUPPORTED_CASE_S = 0.05
"""A case refused before it starts (no CUDA for sdpa_cudnn on a CPU): the round trip."""
DRAW_VALUES_PER_S = 1.4e8
"""Host randn in fp32 (inputs are drawn on the CPU, seeded, so every device sees the same
numbers): 50 M values in 0.36 s measured on this machine."""
HOST_TO_DEVICE_GBS = 10.0
"""Pageable host-to-device copies (PCIe 5: 64 GB/s raw, pageable memory a fraction)."""
CUDNN_PLAN_S = 1.0
"""cuDNN's SDPA builds an execution plan for each new shape at its first call (forward and
backward): about a second, not measured here -- the GPU run's records will say."""
FIRST_TIMED_CASE_S = 1.5
"""A rank's first timed GPU case measures the matmul peak (3 dtypes x 0.3 s, allocations)."""
INTERPRETED_ACCURACY_CALLS = 8
"""CPU only: judging a case costs about this many interpreted calls (the fp64 reference and the
fused baseline are cheap at these sizes; the determinism re-run and the identities are not):
5-15 s per triton case measured here."""
CHILD_START_S = 0.5
"""A step's process that does not import torch (the sweep steps drive a rank pool)."""


def case_values(case: Case) -> int:
    """Values drawn for the case's inputs: q, k, v and dout."""
    b = case.tensor_batch
    q = b * case.heads_q * case.seqlen_q * case.head_dim
    k = b * case.heads_kv * case.seqlen_kv * case.head_dim
    v = b * case.heads_kv * case.seqlen_kv * case.head_dim_v
    out = b * case.heads_q * case.seqlen_q * case.head_dim_v
    return q + k + v + out


def call_seconds(case: Case, machine: Machine) -> tuple[float, float]:
    """(forward, backward) seconds of one call on ``machine`` (backward 0 when forward only)."""
    if not machine.gpu:
        slow = machine.interpreted_call_s if case.backend == "triton" else 0.01
        return slow, slow if case.backward else 0.0
    flops_fwd, flops_bwd = case_flops(case)
    bytes_fwd, bytes_bwd = case_bytes(case)
    rate = machine.matmul_tflops * 1e12 * (2 if is_fp8(case.dtype) else 1)
    bandwidth = machine.bandwidth_gbs * 1e9 * BANDWIDTH_EFFICIENCY
    fwd = max(flops_fwd / (rate * EFFICIENCY["fwd"]), bytes_fwd / bandwidth) + LAUNCH_S
    bwd = max(flops_bwd / (rate * EFFICIENCY["bwd"]), bytes_bwd / bandwidth) + LAUNCH_S
    return fwd, bwd if case.backward else 0.0


def timing_seconds(call_s: float, timing: TimingOptions) -> float:
    """Wall seconds :func:`attnbench.timing.loop.measure` spends on one direction, at most:
    the warm-up (calls and milliseconds), then samples until ``max_seconds`` (the loop's
    cap; it stops sooner once the spread settles) or ``max_samples``, and at least
    ``min_samples`` of them (a floor, capped at ``FLOOR_CAP`` x ``max_seconds``)."""
    if call_s <= 0:
        return 0.0
    wall = call_s + FLUSH_S + LAUNCH_S
    warm = max(timing.warmup * wall, timing.warmup_ms / 1e3)
    calls = max(1, min(1000, math.ceil(timing.min_sample_ms / 1e3 / call_s)))
    sample = calls * wall
    floor = min(timing.min_samples * sample, FLOOR_CAP * timing.max_seconds + sample)
    return warm + min(timing.max_samples * sample, max(timing.max_seconds + sample, floor))


def accuracy_seconds(case: Case, machine: Machine) -> float:
    """The fp64 reference and the fused baseline over both directions, and the fp64 copies."""
    flops = sum(case_flops(case)) if case.backward else case_flops(case)[0]
    copies = case_values(case) * 8 / (machine.bandwidth_gbs * 1e9)
    return flops / (machine.fp64_tflops * 1e12) + flops / (machine.baseline_tflops * 1e12) \
        + copies


def runs_on(case: Case, machine: Machine) -> bool:
    """Whether the case runs at all there (sdpa_cudnn / sdpa_efficient need CUDA)."""
    return machine.gpu or case.backend not in ("sdpa_cudnn", "sdpa_efficient")


def case_seconds(case: Case, options: RunOptions, machine: Machine) -> float:
    """Wall seconds of one case in a warm rank pool, its kernels already compiled."""
    if not runs_on(case, machine):
        return UNSUPPORTED_CASE_S
    fwd, bwd = call_seconds(case, machine)
    itemsize = BY_NAME[case.dtype].bytes
    inputs = (case_values(case) / DRAW_VALUES_PER_S
              + case_values(case) * itemsize / (HOST_TO_DEVICE_GBS * 1e9) * machine.gpu)
    seconds = CASE_OVERHEAD_S + inputs + fwd + bwd
    if case.backend == "sdpa_cudnn" and machine.gpu:
        seconds += CUDNN_PLAN_S
    if options.accuracy:
        seconds += (accuracy_seconds(case, machine) if machine.gpu
                    else INTERPRETED_ACCURACY_CALLS * (fwd + bwd))
    if options.timing.enabled:
        seconds += fwd + bwd  # the peak-memory pass
        seconds += timing_seconds(fwd, options.timing) + timing_seconds(bwd, options.timing)
    return seconds
