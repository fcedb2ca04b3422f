"""What the sm_90 fp8 tensor cores' accumulator costs a correct kernel, by promotion interval.

An fp8 ``wgmma`` computes D = A·B + C with C and D in fp32 registers, but sums at less than fp32:
measured on Hopper and Ada (SageAttention2, arXiv:2411.10958; DeepSeek-V3's report finds the
same limit), the accumulator keeps 13 of fp32's 23 mantissa bits and truncates the rest (FP22:
1 sign, 8 exponent, 13 mantissa bits). A kernel that hands its running output back to the MMA as
C (our fp8 forward, FA3: ``tl.dot(p, v, acc * alpha)``) has it truncated at every instruction
along the whole key loop; truncation always shrinks the magnitude, so the loss is a bias that
grows with the number of key blocks. Promotion (``fp8_promotion``: tl.dot's
``max_num_imprecise_acc``, CUTLASS's ``mma_promotion_interval``) starts the MMA from zero and adds
its partial sum into an fp32 accumulator by ordinary fp32 adds every N products.

:class:`TensorCoreAccumulation` is the fused fp8 baseline
(:class:`attnbench.accuracy.fused_baseline.FusedBaseline` with ``p_format``) with that
accumulator on P·V: one MMA sums ``mma_k`` = 32 keys (its K) exactly in fp32, then the sum with
C is truncated to ``mantissa_bits``. Q·Kᵀ is left exact: it starts from zero in every block and
its K is the head dim, so for any promotion of at least the head dim (the sweeps' 64 and up)
both settings truncate it alike. :func:`modeled_error` is the figure the record's ``fp8`` section
carries beside the kernel's own (:mod:`attnbench.accuracy.fp8_split`): on a GPU, a kernel whose
error follows this model rather than the fp32 baseline is showing its accumulator. The model is a
model: only a GPU run (``tests/kernels/test_fp8_kernel.py -m gpu``) says how far Hopper follows
it; the interpreter accumulates in fp32 whatever the setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from attnbench.accuracy.fused_baseline import FusedBaseline
from attnbench.dtypes import FP8_WGMMA_K
from attnbench.problem.fp8 import FORMATS, output_dtype

ACCUMULATOR_MANTISSA_BITS = 13
"""Mantissa bits an sm_89/sm_90 fp8 MMA's accumulator keeps (SageAttention2's measurement)."""


def truncate_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """fp32 ``x`` with all but the top ``bits`` of its mantissa zeroed (toward zero)."""
    if bits >= 23:
        return x
    mask = -(1 << (23 - bits))  # ...1110000000000 as an int32
    return (x.contiguous().view(torch.int32) & mask).view(torch.float32)


@dataclass(frozen=True, kw_only=True)
class TensorCoreAccumulation(FusedBaseline):
    """The fused fp8 forward with an MMA accumulator of ``mantissa_bits`` on P·V."""

    promotion: int = 0
    """Products summed in the MMA before its partial sum joins the fp32 accumulator; 0: never
    (the running output is the MMA's C operand across the key loop)."""
    mantissa_bits: int = ACCUMULATOR_MANTISSA_BITS
    mma_k: int = FP8_WGMMA_K

    def pv_step(self, acc, correction, p_op, v, dtype):
        keys = p_op.shape[-1]
        sums = [torch.matmul(p_op[..., c:c + self.mma_k], v[..., c:c + self.mma_k, :])
                for c in range(0, keys, self.mma_k)]
        cut = lambda x: truncate_mantissa(x, self.mantissa_bits)  # noqa: E731
        if not self.promotion:
            running = cut(acc * correction[..., None])
            for s in sums:
                running = cut(running + s)
            return running
        # Promotion every N products, capped at the dot's K (this block): groups of N / mma_k.
        per = max(1, self.promotion // self.mma_k)
        out = acc * correction[..., None]
        for g in range(0, len(sums), per):
            partial = torch.zeros_like(out)
            for s in sums[g:g + per]:
                partial = cut(partial + s)
            out = out + partial
        return out


def modeled_forward(spec, dequantized: Sequence[torch.Tensor], promotion: int,
                    mantissa_bits: int = ACCUMULATOR_MANTISSA_BITS) -> torch.Tensor:
    """The modeled kernel's output on the dequantized q, k, v (fp32 or fp64; fp32 is exact)."""
    model = TensorCoreAccumulation(p_format=FORMATS[spec.fp8_format],
                                   out_dtype=output_dtype(spec.fp8_format),
                                   promotion=promotion, mantissa_bits=mantissa_bits)
    q, k, v = (t.to(torch.float32) for t in dequantized)
    out, _ = model.forward(q, k, v, spec)
    return out
