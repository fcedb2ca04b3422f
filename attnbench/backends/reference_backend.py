"""The fp64 reference as a backend: its own errors are ~1e-16, a sanity check of the harness."""

from __future__ import annotations

import torch

from attnbench.backends.base import Forward
from attnbench.problem.dropout import hash_keep_mask
from attnbench.problem.fp8 import dequantize_call, output_dtype
from attnbench.problem.reference import reference_backward, reference_forward


class ReferenceBackend:
    name = "reference"
    keep_mask = staticmethod(hash_keep_mask)
    deterministic = True  # checked: repeated backward calls must agree bit for bit
    supports_packed = True  # reference_forward/backward take packed specs
    supports_packed_chunks = True  # packed CP: per sequence through packing.sequence_spec
    supports_fp8 = True  # exact on the dequantized values, rounded once to bf16

    def forward(self, q, k, v, spec):
        out_dtype = q.dtype
        if spec.fp8_format:
            q, k, v = dequantize_call(q, k, v, spec, torch.float64)
            out_dtype = output_dtype(spec.fp8_format)
        out, lse = reference_forward(q, k, v, spec, keep_mask=self.keep_mask)
        ctx = (q, k, v, out, lse, spec)
        return Forward(out=out.to(out_dtype), lse=lse.float(), ctx=ctx)

    def supports(self, case, device):
        return None

    def backward(self, ctx, dout):
        q, k, v, out, lse, spec = ctx
        dq, dk, dv = reference_backward(q, k, v, out, lse, dout, spec, keep_mask=self.keep_mask)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)

    def backward_from_stats(self, q, k, v, out, lse, dout, spec):
        """One block of a larger softmax (ring context parallelism), exact in fp64 from the
        given final ``out`` and ``lse``; returned in float32, which the caller sums blocks in
        (see :mod:`attnbench.backends.capabilities`)."""
        dq, dk, dv = reference_backward(q, k, v, out, lse, dout, spec, keep_mask=self.keep_mask)
        return dq.float(), dk.float(), dv.float()
