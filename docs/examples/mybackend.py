"""A third-party backend for attnbench, in one file: docs/backends.md walks through it.

Legend: B = batch, Hq / Hkv = query / key-value heads, Sq / Sk = lengths, D / Dv = head dims.
q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv); out (B, Hq, Sq, Dv), lse (B, Hq, Sq).

The math of a fused kernel in plain torch: scores, softmax and P @ V accumulated in fp32, the
output rounded once to the input dtype. Causal and sliding windows, ALiBi, softcap and GQA come
from the spec; dropout is refused with its reason. Run it from anywhere::

    PYTHONPATH=/path/to/this/folder attnbench run /path/to/this/folder/mybackend.yaml
"""

from __future__ import annotations

import torch

from attnbench.backends import Forward, PreparesOnce, dense_masks


class MyBackend(PreparesOnce):  # PreparesOnce: self.prepared, emptied when each case ends
    name = "mine"
    keep_mask = None  # no dropout here; a kernel with a mask it can rebuild would give it
    deterministic = True  # the harness checks it: two backward calls, bit-identical gradients

    def supports(self, case, device):
        if case.dropout > 0:
            return "MyBackend has no dropout"
        return None  # packed, paged and fp8 cases are refused for us: none is declared

    def forward(self, q, k, v, spec):
        # The mask and bias derive from the case, not from the kernel: built on the first
        # (untimed, accuracy) call and reused by every timed one.
        key = (spec, tuple(q.shape), tuple(k.shape), q.dtype, str(q.device))
        bias, visible, _ = self.prepared.get(key, lambda: dense_masks(
            spec, q.shape[0], q.shape[1], q.shape[2], k.shape[2], torch.float32, q.device,
            keep=False))
        q32, k32, v32 = (t.detach().float().requires_grad_(not spec.decode) for t in (q, k, v))
        with torch.set_grad_enabled(not spec.decode):  # decode: forward only, no graph kept
            group = q.shape[1] // k.shape[1]  # GQA: query head h reads K/V head h // group
            k_rep = k32.repeat_interleave(group, dim=1)
            v_rep = v32.repeat_interleave(group, dim=1)
            scores = q32 @ k_rep.transpose(-1, -2) * spec.scale
            if spec.softcap > 0:
                scores = spec.softcap * torch.tanh(scores / spec.softcap)
            if bias is not None:
                scores = scores + bias
            if visible is not None:
                scores = scores.masked_fill(~visible, float("-inf"))
            lse = torch.logsumexp(scores, dim=-1)  # -inf for a row that sees no key
            probs = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)
            out = (probs @ v_rep).to(q.dtype)
        return Forward(out=out.detach(), lse=lse.detach(), ctx=(out, q32, k32, v32, q.dtype))

    def backward(self, ctx, dout):
        out, q32, k32, v32, dtype = ctx
        grads = torch.autograd.grad(out, (q32, k32, v32), dout, retain_graph=True)
        return tuple(g.to(dtype) for g in grads)
