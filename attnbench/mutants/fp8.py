"""fp8 bugs: descales applied wrongly. Each edits the fp8 path of the correct fused model
(:class:`attnbench.mutants.fused.FusedModel`, FA3's roundings), where the descales turn the fp8
values a kernel multiplies back into the real numbers
(:func:`attnbench.problem.fp8.dequantize_call`). Both are forward bugs of forward-only cases: the
fp64 reference on the dequantized inputs sees them; the quantization error alone (what
TransformerEngine's RMSE-against-fp16 test measures) would hide a small one.
"""

from __future__ import annotations

import dataclasses

import torch

from attnbench.mutants.fused import FusedModel
from attnbench.mutants.patch import mutated
from attnbench.problem.fp8 import dequantize_call, descale_tensors


class Fp8DescaleVTwice(FusedModel):
    """O multiplied by descale_v twice: in the kernel's epilogue and again by a caller that
    also "undoes the scaling". The class of NVIDIA/cudnn-frontend#520 (fp8 SDPA engines drop
    descale_s / scale_s: the result is wrong by that factor, silently, whenever it is not 1):
    a descale applied a wrong number of times scales O by a power of two."""

    name = "mutant.fp8_descale_v_twice"
    dequantized = mutated(FusedModel.dequantized,
                          "return dequantize_call(q, k, v, spec, torch.float32)",
                          "q, k, v = dequantize_call(q, k, v, spec, torch.float32)\n"
                          "        dv = descale_tensors(spec, v.shape[0], v.shape[1], v.device)[2]\n"
                          "        return q, k, v * dv[..., None, None]  # BUG: descale_v again",
                          descale_tensors=descale_tensors)


def descale_k_by_query_head(q, k, v, spec, dtype):
    """dequantize_call with the bug: query head h's scores use descale_k[b, h] -- indexed by
    the query head -- instead of descale_k[b, h // G] of its KV head (the (B, Hkv) array read
    with the (B, Hq) index; clamped at its end). Per-tensor scaling hides it (one value), as
    do per-head scales that happen to be equal: only differing heads (``inputs: loud_heads``)
    with GQA/MQA show it."""
    q, k, v = dequantize_call(q, k, v, spec, torch.float32)
    batch, heads_q = q.shape[:2]
    heads_kv = k.shape[1]
    flat = torch.tensor(spec.descales[1], dtype=torch.float32, device=q.device)
    if flat.numel() > 1:
        right = descale_tensors(spec, batch, heads_kv, q.device)[1]
        right = right.repeat_interleave(heads_q // heads_kv, dim=1)          # (B, Hq)
        index = (torch.arange(batch, device=q.device)[:, None] * heads_kv
                 + torch.arange(heads_q, device=q.device)[None, :])         # BUG: h, not h // G
        wrong = flat[index.clamp(max=flat.numel() - 1)]
        q = q * (wrong / right)[..., None, None]  # scores of head h scaled by the wrong factor
    return q.to(dtype), k.to(dtype), v.to(dtype)


class Fp8DescaleKByQueryHead(FusedModel):
    """Per-head fp8 scaling with GQA: the K descale read with the query head's index
    (FA3's descale_k is (batch, num_heads_k)). ROCm/aiter#3894: an fp8 paged-attention kernel
    computed the wrong flat index into the per-head KV scale buffer; the review of
    sgl-project/sgl-kernel-xpu#252: a per-(batch, kv_head) scale read as one scalar."""

    name = "mutant.fp8_descale_k_by_query_head"

    def dequantized(self, q, k, v, spec):
        return descale_k_by_query_head(q, k, v, spec, torch.float32)


class Fp8PNoPrescale(FusedModel):
    """P cast to fp8 straight from (0, 1], without the 2^8 pre-scale: probabilities under
    e4m3's 2^-10 become 0 in P·V while the normaliser still counts them, so a row whose mass is
    spread over many keys beside a hot one loses that mass from the output only; random inputs
    barely show it, an attention sink does (flashinfer-ai/flashinfer#5020, SM120 fp8 prefill;
    ROCm/FlyDSL#1020: rows kept 64 % of their weight)."""

    name = "mutant.fp8_p_no_prescale"
    model = dataclasses.replace(FusedModel.model, p_prescale=1.0)  # BUG: P not pre-scaled


def descales_kv_swapped(q, k, v, spec, dtype):
    """dequantize_call with the bug: K dequantized with V's descale and V with K's (the two
    arguments passed in each other's place)."""
    swapped = spec.replace(descales=(spec.descales[0], spec.descales[2], spec.descales[1]))
    return dequantize_call(q, k, v, swapped, dtype)  # BUG: descale_k <-> descale_v


class Fp8DescaleKvSwapped(FusedModel):
    """fp8: descale_k and descale_v swapped. Right by luck whenever K and V draw the same
    power-of-two scale -- as N(0, 1) inputs of one shape almost always do -- so only inputs
    whose K and V magnitudes differ show it (``inputs: kv_apart`` by design; large_logits and
    outliers by side effect; per-head scales of N(0, 1) draws by chance). vllm-project/vllm#51363:
    FA4 dropped the per-head Q/K/V descales; its regression test needed non-unity descales
    that differ to see it."""

    name = "mutant.fp8_descale_kv_swapped"

    def dequantized(self, q, k, v, spec):
        return descales_kv_swapped(q, k, v, spec, torch.float32)
