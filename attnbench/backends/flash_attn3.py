"""``flash_attn3``: FlashAttention-3 (``flash_attn_interface``, Hopper), bf16/fp16 and its fp8
forward.

fp8 cases hand FA3 exactly what it takes: e4m3 q, k, v in (B, S, H, D) and float32
``q_descale / k_descale / v_descale`` of shape (batch, num_heads_k) -- the layout of
:func:`attnbench.problem.fp8.descale_tensors` -- and get bf16 back. FA3's fp8 path has no backward
and no dropout; FA3 has no ALiBi. Its dropout is absent altogether, so nothing is hidden from the
reference.

Not run here (no GPU, package absent): written against ``hopper/flash_attn_interface.py``'s
``flash_attn_func(q, k, v, softmax_scale, causal, qv, q_descale, k_descale, v_descale,
window_size, attention_chunk, softcap, ...)``; versions that return ``(out, lse)`` and those
that return ``out`` alone are both read.
"""

from __future__ import annotations

import torch

from attnbench.backends.adapters import _autograd_backward, _missing
from attnbench.backends.base import Forward
from attnbench.backends.masks import PreparesOnce, call_key
from attnbench.problem.fp8 import descale_tensors


class FlashAttn3Backend(PreparesOnce):
    name = "flash_attn3"
    keep_mask = None
    supports_fp8 = True  # e4m3 with per-(batch, KV head) descales

    def supports(self, case, device):
        if device.type != "cuda":
            return "flash_attn3 runs only on CUDA devices (Hopper)"
        if case.dtype == "fp32":
            return "flash_attn3 supports fp16, bf16 and fp8_e4m3 only"
        if case.dtype == "fp8_e5m2":
            return "flash_attn3's fp8 forward takes e4m3 only"
        if case.bias != "none":
            return "flash_attn3 has no ALiBi"
        if case.dropout:
            return "flash_attn3 has no dropout"
        if case.is_packed or case.decode:
            return "flash_attn3: packed and decode cases are not mapped yet (varlen / kvcache)"
        return _missing("flash_attn_interface")

    def forward(self, q, k, v, spec):
        from flash_attn_interface import flash_attn_func

        def call(q_in, k_in, v_in, descales=(None, None, None)):
            result = flash_attn_func(
                q_in.transpose(1, 2), k_in.transpose(1, 2), v_in.transpose(1, 2),
                softmax_scale=spec.scale, causal=False, q_descale=descales[0],
                k_descale=descales[1], v_descale=descales[2],
                window_size=(spec.window_left, spec.window_right), softcap=spec.softcap)
            return (result[0] if isinstance(result, tuple) else result).transpose(1, 2)

        if spec.fp8_format:  # forward only; the descales are built once per case
            descales = self.prepared.get(
                call_key(spec, q, k, "descale"),
                lambda: descale_tensors(spec, q.shape[0], k.shape[1], q.device))
            return Forward(out=call(q, k, v, descales), lse=None, ctx=None)
        q_in, k_in, v_in = (t.detach().requires_grad_(True) for t in (q, k, v))
        with torch.enable_grad():
            out = call(q_in, k_in, v_in)
        return Forward(out=out.detach(), lse=None, ctx=(out, q_in, k_in, v_in))

    backward = staticmethod(_autograd_backward)
