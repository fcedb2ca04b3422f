"""Accumulation bugs of fused kernels: one edit each of the fused-precision model.

:class:`FusedModel` is :mod:`attnbench.accuracy.fused_baseline` as a backend (its dropout mask is
the hash mask, exposed): a correct fused kernel, registered as ``mutant.fused_base`` and run by
``attnbench selftest`` among the controls. The mutants keep one accumulator in the input dtype
where a correct kernel keeps it in fp32. Their error is small at short lengths -- every case of
a 128-token sweep passes -- and grows with the number of key blocks summed, the shape of seed
001's dQ report: only long cases (``sweeps/standard.yaml``'s length ladder) and the error trend
across lengths (:mod:`attnbench.report.read.trends`) expose them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from attnbench.accuracy.fused_baseline import FusedBaseline
from attnbench.backends.base import Forward
from attnbench.problem.dropout import hash_keep_mask
from attnbench.problem.fp8 import FORMATS, dequantize_call, output_dtype


class FusedModel:
    """The fused-precision model as a backend (correct; ``mutant.fused_base``)."""

    name = "mutant.fused_base"
    keep_mask = staticmethod(hash_keep_mask)
    model = FusedBaseline()
    supports_fp8 = True  # FA3's fp8 roundings (FusedBaseline.p_format) on dequantized inputs

    def supports(self, case, device):
        return None

    def dequantized(self, q, k, v, spec):
        """fp8 q, k, v as the real numbers the kernel computes with (fp32, exact): what a
        kernel's descales do to S = Q·Kᵀ and to O."""
        return dequantize_call(q, k, v, spec, torch.float32)

    def forward(self, q, k, v, spec):
        if spec.fp8_format:  # forward only: no context is kept
            model = dataclasses.replace(self.model, p_format=FORMATS[spec.fp8_format],
                                        out_dtype=output_dtype(spec.fp8_format))
            out, lse = model.forward(*self.dequantized(q, k, v, spec), spec)
            return Forward(out=out, lse=lse, ctx=None)
        out, lse = self.model.forward(q, k, v, spec, keep_mask=hash_keep_mask)
        return Forward(out=out, lse=lse, ctx=(q, k, v, out, lse, spec))

    def backward(self, ctx, dout):
        q, k, v, out, lse, spec = ctx
        return self.model.backward(q, k, v, out, lse, dout, spec, keep_mask=hash_keep_mask)


@dataclass(frozen=True)
class _Bf16PvAccumulator(FusedBaseline):
    def accumulate_pv(self, acc, correction, pv, dtype):
        # BUG: the P·V accumulator lives in the input dtype between key blocks.
        return (acc * correction[..., None] + pv).to(dtype).to(torch.float32)


@dataclass(frozen=True)
class _Bf16DqAccumulator(FusedBaseline):
    def accumulate_dq(self, dq, contribution, dtype):
        # BUG: dQ is summed across key blocks in the input dtype.
        return (dq + contribution).to(dtype).to(torch.float32)


@dataclass(frozen=True)
class _DkvAccumulatorInDtype(FusedBaseline):
    def accumulate_dkv(self, acc, contribution, dtype):
        # BUG: dK/dV live in the input dtype; each query head of a group is added in turn.
        for head in contribution.unbind(2):
            acc = (acc + head).to(dtype).to(torch.float32)
        return acc


class PvAccumulatorInDtype(FusedModel):
    """Forward's P·V accumulator kept in bf16/fp16 across key blocks: the class of
    Dao-AILab/flash-attention#2250 (Hopper's FP8 tensor-core accumulator is not full fp32:
    accuracy drops on long contexts) and of fp16 accumulators in ports
    (philipturner/metal-flash-attention#13)."""

    name = "mutant.pv_accumulator_in_dtype"
    model = _Bf16PvAccumulator()


class DqAccumulatorInDtype(FusedModel):
    """Backward's dQ summed across key blocks in bf16/fp16 (seed 001's dQ, wrong by a growing
    amount; dK/dV right: their accumulators are per key block)."""

    name = "mutant.dq_accumulator_in_dtype"
    model = _Bf16DqAccumulator()


class DeclaredDkvInDtype(FusedModel):
    """dK/dV added into buffers of the input dtype, a GQA group's heads one after another (what
    PyTorch 2.13's CPU flash backward does, docs/findings.md) -- and declared: the backend says
    its gradients are computed in the input dtype (``input_precision``), so they are judged
    against naive, within whose bound it stays. A declaration must not hide it: the tensors still
    carry their ratio to the fused baseline, and over 2x that is a finding."""

    name = "mutant.declared_dkv_in_dtype"
    # a step of 32 query rows (step_elems 1: one block_q a step), each step's dK/dV added in
    # the input dtype, as PyTorch's CPU kernel adds each query block's
    model = _DkvAccumulatorInDtype(block_q=32, step_elems=1)

    def input_precision(self, case, device):
        return ("dq", "dk", "dv") if case.dtype in ("fp16", "bf16") else ()
