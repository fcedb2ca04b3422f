"""``flash_attn3``: FlashAttention-3 (``flash_attn_interface``, Hopper), bf16/fp16 and its fp8
forward.

fp8 cases hand FA3 exactly what it takes: e4m3 q, k, v in (B, S, H, D) and float32
``q_descale / k_descale / v_descale`` of shape (batch, num_heads_k) -- the layout of
:func:`attnbench.problem.fp8.descale_tensors` -- and get bf16 back. FA3's fp8 path has no backward
and no dropout; FA3 has no ALiBi. Its dropout is absent altogether, so nothing is hidden from the
reference.

What FA3 rejects is refused in ``supports()`` (hopper/flash_api.cpp ``mha_fwd``): a head dim
that is not a multiple of 8 (16 in fp8), over 256, or a V head dim other than Q/K's outside the
pairs it has kernels for. Releases before the 2025-01 rewrite name the descales ``descale_q``
and take one value per tensor (shape (1,)): refused, with the installed version. Masks go
through :func:`attnbench.backends.call_window.local_window` (global offsets) and pass plain
causal as ``causal=True``, as for flash-attn 2.

Not run here (no GPU, package absent): written against ``hopper/flash_attn_interface.py``'s
``flash_attn_func(q, k, v, softmax_scale, causal, qv, q_descale, k_descale, v_descale,
window_size, attention_chunk, softcap, ...)``; versions that return ``(out, lse)`` and those
that return ``out`` alone are both read.
"""

from __future__ import annotations

from typing import Optional

import torch

from attnbench.backends.adapters import _autograd_backward, plan_call
from attnbench.backends.base import Forward
from attnbench.backends.call_window import local_window
from attnbench.backends.masks import PreparesOnce, call_key
from attnbench.backends.upstream import first_taken, lacking, unavailable, version_of
from attnbench.dtypes import is_fp8
from attnbench.problem.fp8 import descale_tensors

FA3 = "flash_attn_interface"
DESCALES = ("q_descale", "k_descale", "v_descale")
"""FA3's descale keywords since the 2025-01 rewrite (commit 7a80279): (batch, num_heads_k)."""
OLD_DESCALES = ("descale_q", "descale_k", "descale_v")
"""Before it: one value per tensor, CHECK_SHAPE(descale_q, 1)."""
FA3_MAX_HEAD_DIM = 256
"""``get_max_headdim()`` of a full build (hopper/flash_api.cpp): Q/K forward, both in backward;
V up to 512 forward in fp16/bf16 with Q/K <= 64."""


def fa3_limits(case) -> Optional[str]:
    """What FA3 rejects whatever its release (hopper/flash_api.cpp): ``mha_fwd`` for every
    case, ``mha_bwd`` (both head dims at most 256) for one with a backward."""
    d, dv = case.head_dim, case.head_dim_v
    alignment = 16 if is_fp8(case.dtype) else 8  # "head_size should be a multiple of 16|8"
    in_fp8 = " in fp8" if is_fp8(case.dtype) else ""
    for name, dim in {"head_dim": d, "head_dim_v": dv}.items():
        if dim % alignment:
            return (f"flash_attn3 takes a {name} that is a multiple of {alignment}{in_fp8}, "
                    f"not {dim}")
    if d > FA3_MAX_HEAD_DIM or (dv > FA3_MAX_HEAD_DIM and case.backward):
        return (f"flash_attn3 takes head dims of at most {FA3_MAX_HEAD_DIM} "
                f"({'backward' if d <= FA3_MAX_HEAD_DIM else 'Q/K'}), not {d}/{dv}")
    if dv > FA3_MAX_HEAD_DIM and is_fp8(case.dtype):
        return f"flash_attn3 takes head_dim_v > {FA3_MAX_HEAD_DIM} in fp16 and bf16 only"
    if dv != d and not (128 < d <= 192 and 96 < dv <= 128 or d <= 64 and dv <= 512):
        return (f"flash_attn3 has kernels for a V head dim other than Q/K's only with Q/K in "
                f"(128, 192] and V in (96, 128], or Q/K <= 64 and V <= 512 (Hopper only), "
                f"not {d}/{dv}")
    return None


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
        if case.fp8_promotion:
            return ("flash_attn3's fp8 forward has no promotion setting (fp8_promotion: 0 runs "
                    "it as it is built)")
        return fa3_limits(case) or unavailable(FA3) or fa3_release(case)

    def forward(self, q, k, v, spec):
        from flash_attn_interface import flash_attn_func

        def build():
            plan = plan_call(FA3, flash_attn_func, spec, q,
                             local_window(spec, q.shape[2], k.shape[2], library="flash_attn3"))
            if not spec.fp8_format:
                return plan, plan.kwargs
            descales = descale_tensors(spec, q.shape[0], k.shape[1], q.device)
            return plan, {**plan.kwargs, **dict(zip(DESCALES, descales))}

        plan, kwargs = self.prepared.get(call_key(spec, q, k), build)

        def call(q_in, k_in, v_in):
            result = flash_attn_func(q_in.transpose(1, 2), plan.keys(k_in).transpose(1, 2),
                                     plan.keys(v_in).transpose(1, 2), **kwargs)
            return (result[0] if isinstance(result, tuple) else result).transpose(1, 2)

        if spec.fp8_format:  # forward only
            return Forward(out=call(q, k, v), lse=None, ctx=None)
        q_in, k_in, v_in = (t.detach().requires_grad_(True) for t in (q, k, v))
        with torch.enable_grad():
            out = call(q_in, k_in, v_in)
        return Forward(out=out.detach(), lse=None, ctx=(out, q_in, k_in, v_in))

    backward = staticmethod(_autograd_backward)


def fa3_release(case) -> Optional[str]:
    """Why the installed FA3 cannot take what ``case`` needs (its version in the reason)."""
    from flash_attn_interface import flash_attn_func

    if is_fp8(case.dtype):
        found = first_taken(flash_attn_func, DESCALES, OLD_DESCALES)
        if found == OLD_DESCALES:
            return (f"{version_of(FA3)}: flash_attn_func takes descale_q/k/v, one value per "
                    "tensor (FA3 before its 2025-01 rewrite), not q_descale/k_descale/v_descale "
                    "per (batch, KV head): not mapped")
        if found is None:
            return lacking(FA3, flash_attn_func, DESCALES, why="fp8 descales")
    names = (["window_size"] if case.mask == "window" else []) + \
        (["softcap"] if case.softcap else [])
    return lacking(FA3, flash_attn_func, names)
