"""Single-device backward bugs: one edit each of a correct recomputing backward.

Legend: B = batch, Hq / Hkv = query / key-value heads, Sq / Sk = lengths, D = head dim.
Every class here is :class:`~attnbench.mutants.base.RecomputingNaive` (correct, ``mutant.base``)
with one edit, written out as ``mutated(correct_function, OLD, NEW)`` (see
:mod:`attnbench.mutants.patch`) or as a few lines marked ``# BUG:``.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from attnbench.backends.base import Forward
from attnbench.backends.naive import NaiveBackend
from attnbench.mutants.base import RecomputingNaive
from attnbench.mutants.patch import mutated

_correct = NaiveBackend.backward_from_stats


class DqLog2Scale(RecomputingNaive):
    """Catalogue 2a -- dQ with the wrong scale while dK and dV are right (seed 001's class: TE's
    dQ off by 0.5-1.1 relative, dK/dV fine).

    Modeled on the Triton fused-attention tutorial, which folds log2(e) into the softmax scale
    so it can use exp2, and multiplies dQ by ln(2) at the end to undo it: this backward forgets
    that last ``dq *= LN2``, so dQ is 1/ln(2) = 1.4427 times too large.
    """

    name = "mutant.dq_log2_scale"
    backward_from_stats = mutated(
        _correct, "dq = torch.matmul(ds, k_rep)",
        "dq = torch.matmul(ds, k_rep) * 1.4426950408889634  # BUG: lost `dq *= LN2`")


class DqStaleDelta(RecomputingNaive):
    """Catalogue 2b -- dQ from stale softmax statistics while dK and dV are right.

    Flash backward kernels precompute delta = rowsum(dO * O) in a separate pass; here the dQ
    pass reads a delta buffer that was never written (zeros), so dQ = (P * dP) K instead of
    (P * (dP - delta)) K (the picotron ring-attention report, huggingface/picotron#37, is the
    same statistic taken from the wrong tensors). dK and dV use the right delta.
    """

    name = "mutant.dq_stale_delta"
    backward_from_stats = mutated(
        _correct, "dq = torch.matmul(ds, k_rep)",
        "dq = torch.matmul((probs * dp * spec.scale).to(dtype), k_rep)"
        "  # BUG: delta buffer still zero")


class DropoutNoRescale(RecomputingNaive):
    """Catalogue 10 -- backward applies forward's dropout mask but not its 1/(1-p) rescale
    (NVIDIA/apex#816 fixed the same scale in apex's multihead-attention backward).

    The mask is hidden (``keep_mask = None``), as in flash-attn and cuDNN: no exact reference
    exists, so the reference-free identities must catch it.
    """

    name = "mutant.dropout_no_rescale"
    keep_mask = None
    backward_from_stats = mutated(
        _correct, "drop = keep.to(wide) / (1.0 - spec.dropout_p)",
        "drop = keep.to(wide)  # BUG: 1 / (1 - p) dropped")


class SoftcapNoTanhGrad(RecomputingNaive):
    """Extra -- softcap's derivative missing from backward: dS is not multiplied by
    1 - tanh^2 (the term flash-attn's softcap backward, Dao-AILab/flash-attention#1033, stores
    as dtanh; FA4 shipped softcap without a backward, #2402)."""

    name = "mutant.softcap_no_tanh_grad"
    backward_from_stats = mutated(
        _correct, "ds = ds * (1.0 - tanh.to(wide) ** 2)",
        "pass  # BUG: softcap's d tanh dropped")


class GqaDkvMean(RecomputingNaive):
    """Extra -- GQA/MQA: the K/V gradient of a head group averaged instead of summed over the
    query heads that share it (a broadcast whose backward is a sum: marin-community/levanter#449
    fixed dK/dV of GQA flash attention that did not reduce over the group)."""

    name = "mutant.gqa_dkv_mean"
    backward_from_stats = mutated(
        mutated(_correct, "dk = dk.view(batch, heads_kv, group, sk, k.shape[-1]).sum(2)",
                "dk = dk.view(batch, heads_kv, group, sk, k.shape[-1]).mean(2)  # BUG: mean"),
        "dv = dv.view(batch, heads_kv, group, sk, v.shape[-1]).sum(2)",
        "dv = dv.view(batch, heads_kv, group, sk, v.shape[-1]).mean(2)  # BUG: mean")


class KvLayoutSwap(RecomputingNaive):
    """Catalogue 5 -- K/V transposed once too often in backward.

    Forward saves K and V in the (B, S, H, D) layout flash-attn kernels take; backward hands
    them to a (B, H, S, D) kernel without transposing back (huggingface/diffusers#14338, fixed in
    #14341: the templated attention backward transposed K/V twice). When H == S the shapes match
    and the gradients are silently wrong; otherwise the kernel fails on the shapes.
    """

    name = "mutant.kv_layout_swap"

    def forward(self, q, k, v, spec):
        fwd = super().forward(q, k, v, spec)
        k_bshd, v_bshd = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
        return Forward(out=fwd.out, lse=fwd.lse, ctx=(q, k_bshd, v_bshd, fwd.out, fwd.lse, spec))

    def backward(self, ctx, dout):
        q, k_bshd, v_bshd, out, lse, spec = ctx
        k, v = k_bshd, v_bshd  # BUG: should be k_bshd.transpose(1, 2), v_bshd.transpose(1, 2)
        if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
            raise ValueError(f"kernel: {q.shape[1]} query heads cannot share {k.shape[1]} "
                             "key/value heads")
        dq, dk, dv = self.backward_from_stats(q, k, v, out, lse, dout, spec)
        return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype)


class NanTailBlock(RecomputingNaive):
    """Catalogue 12 -- NaN in backward when Sq is not a multiple of the query tile.

    A tiled backward pads the last query tile to BLOCK_M rows and loads the tail's log-sum-exp
    with the masked-load default -inf. Its kernel zeroes P for rows that see no key (as a kernel
    does from its running max), but the padded rows do see keys, so they get
    P = exp(s + inf) = inf, and inf * 0 (their dO is zero) = NaN in dK and dV -- the class of
    pytorch/pytorch#153799 (NaN in FlexAttention backward unless seqlen % 128 == 0) and
    NVIDIA/cudnn-frontend#160. With ``lse_padding = 0.0`` the same code is correct (the control
    in the tests).
    """

    name = "mutant.nan_tail_block"
    BLOCK_M = 64
    lse_padding = float("-inf")  # BUG: the padded rows need a finite value (0.0)
    backward_from_stats = mutated(
        _correct,
        "lse_safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse).to(wide)",
        "lse_safe = (lse if visible is None else lse.masked_fill(~visible.any(-1), 0.0)).to(wide)")

    def backward(self, ctx, dout):
        q, k, v, out, lse, spec = ctx
        sq = q.shape[2]
        pad = -sq % self.BLOCK_M
        q_t, out_t, dout_t = (F.pad(t, (0, 0, 0, pad)) for t in (q, out, dout))
        lse_t = F.pad(lse, (0, pad), value=self.lse_padding)
        dq, dk, dv = self.backward_from_stats(q_t, k, v, out_t, lse_t, dout_t, spec)
        return dq[:, :, :sq].to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class NondeterministicDq(RecomputingNaive):
    """Catalogue 11 -- non-deterministic dQ accumulation from a backend that says it is
    deterministic.

    A flash backward parallel over key blocks adds each block's dQ contribution into one fp32
    accumulator with atomics, in whatever order the blocks finish (Dao-AILab/flash-attention#414:
    dq differs run to run, dk and dv do not; #1766: the deterministic flag was dropped in a
    launch template). On a CPU there are no atomics, so the arrival order is drawn at random on
    every call; float addition is not associative, so dQ differs in its last bits. Every result
    is as accurate as the correct code's: only the determinism check can see it.
    """

    name = "mutant.nondeterministic_dq"
    deterministic = True  # BUG: the claim the backward does not keep
    BLOCK_N = 16
    backward_from_stats = mutated(
        _correct, "dq = torch.matmul(ds, k_rep)",
        "dq = torch.matmul(ds.to(wide), k_rep.to(wide))  # fp32 partials, as a kernel's")

    def backward(self, ctx, dout):
        q, k, v, out, lse, spec = ctx
        sk = k.shape[2]
        blocks = [slice(start, min(start + self.BLOCK_N, sk))
                  for start in range(0, sk, self.BLOCK_N)]
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        order = list(range(len(blocks)))
        random.SystemRandom().shuffle(order)  # BUG: blocks arrive in any order
        for index in order:
            cols = blocks[index]
            dq_b, dk_b, dv_b = self.backward_from_stats(
                q, k[:, :, cols], v[:, :, cols], out, lse, dout,
                spec.replace(kv_start=spec.kv_start + cols.start))
            dq += dq_b.float()  # atomicAdd into the fp32 dQ accumulator
            dk[:, :, cols] = dk_b.to(k.dtype)
            dv[:, :, cols] = dv_b.to(v.dtype)
        return dq.to(q.dtype), dk, dv
