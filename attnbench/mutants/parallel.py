"""Context- and tensor-parallel bugs: one edit each of attnbench's own CP/TP algorithms
(:mod:`attnbench.parallel`), or a backend whose single-device results are right but whose
log-sum-exp breaks the ring's merge.

A backend brings its own split through ``parallel_algorithm(case)`` (see
:func:`attnbench.execution.multi.algorithm`); the mutants below return a mutated copy of the
ring or TP algorithm for the cases they target and None otherwise. Legend: B = batch,
Hq / Hkv = this rank's query / key-value heads, S = lengths, D = head dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from attnbench.backends.base import Forward, Unsupported
from attnbench.backends.naive import NaiveBackend
from attnbench.mutants.base import RecomputingNaive
from attnbench.mutants.patch import mutated, rebound
from attnbench.parallel import allgather, layout, ring

F32 = torch.float32


def _ring_cases(case) -> bool:
    return case.ring_split


# -- 1. seed 000: a CP backward that draws a fresh dropout mask ---------------------------------

_fresh_rng_state = mutated(
    ring.replay_rng_state, "return block.spec\n",
    "return block.spec.replace(dropout_seed=block.spec.dropout_seed + block.step + 1)"
    "  # BUG: the RNG state moved on since forward\n")
_FRESH_DROPOUT_RING = SimpleNamespace(
    forward=ring.forward, backward=rebound(ring.backward, replay_rng_state=_fresh_rng_state))


class CpFreshDropout(NaiveBackend):
    """Catalogue 1 -- ring/zigzag CP backward that does not replay forward's dropout RNG state
    (seed 000: TransformerEngine's CP backward missed the rng_state argument of
    flash_attn_backward: a segfault or, worse, other masks). Each block's backward draws its mask
    from a seed that moved on. The mask is hidden, as flash-attn's is: only the reference-free
    identities can see it."""

    name = "mutant.cp_fresh_dropout"
    keep_mask = None

    def parallel_algorithm(self, case):
        return _FRESH_DROPOUT_RING if _ring_cases(case) else None


# -- 4. ring backward that keeps step 0's K/V ---------------------------------------------------

_STALE_KV_RING = SimpleNamespace(
    forward=ring.forward,
    backward=mutated(ring.backward, "held_k, held_v = pending.wait()",
                     "pending.wait()  # BUG: the received K/V are dropped; step 0's are reused"))


class CpStaleKv(NaiveBackend):
    """Catalogue 4 -- ring/zigzag CP backward that reuses the first step's K/V at every step
    (huggingface/diffusers#14265: the ring backward read K/V from ctx.saved_tensors, saved once
    at ring iteration 0, so every step recomputed gradients against the local chunk). The K/V
    gradient accumulators still travel, so every shape is right and nothing fails loudly."""

    name = "mutant.cp_stale_kv"

    def parallel_algorithm(self, case):
        return _STALE_KV_RING if _ring_cases(case) else None


# -- 8. log-sum-exp merge without the running max -----------------------------------------------


def _merge_without_max(acc_out: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor) -> None:
    """ring._merge as first written: softmax denominators exp(lse) summed directly, in the
    activations' dtype. Right for small logits; exp(lse) overflows fp16 once lse > 11 (and
    fp32 once lse > 88), and inf / inf is NaN."""
    dtype = out.dtype
    sum_acc = torch.exp(acc_lse.to(dtype))  # BUG: no running max subtracted before exp
    sum_new = torch.exp(lse.to(dtype))
    total = sum_acc + sum_new
    total = torch.where(total == 0, torch.ones_like(total), total)  # rows that saw no key yet
    acc_out.mul_((sum_acc / total).to(F32)[..., None]).add_(
        out.to(F32) * (sum_new / total).to(F32)[..., None])
    acc_lse.copy_(torch.where(sum_acc + sum_new == 0, torch.full_like(acc_lse, float("-inf")),
                              torch.log(total.to(F32))))


_NO_MAX_RING = SimpleNamespace(
    forward=rebound(ring.forward,
                    _forward_step=rebound(ring._forward_step, _merge=_merge_without_max)),
    backward=ring.backward)


class CpLseNoMax(NaiveBackend):
    """Catalogue 8 -- the ring's merge of partial outputs exponentiates raw log-sum-exps, without
    the running max (the correct merge, ring._merge, uses logaddexp; SHI-Labs/NATTEN#202 fixed
    the same overflow in merge_attentions). Merging in fp16, it overflows with large logits."""

    name = "mutant.cp_lse_no_max"

    def parallel_algorithm(self, case):
        return _NO_MAX_RING if _ring_cases(case) else None


# -- extra: a backend whose log-sum-exp is in base 2 -------------------------------------------

LOG2_E = 1.4426950408889634


class LseLog2(RecomputingNaive):
    """Extra -- a kernel that returns its log-sum-exp in base 2 (Triton kernels keep
    m * log2(e) + log2(l) to use exp2) while callers merge in natural log
    (sgl-project/sglang#35045 and flashinfer-ai/flashinfer#4547: flashinfer's base-2 LSE fed to a
    base-e merge; meta-pytorch/attention-gym#200 needed lse / ln 2 for its Triton backward). The
    kernel's own forward and backward agree with each other, so a single device's out and
    gradients are right (its returned lse is not: the lse check sees it there); a ring merges
    blocks with wrong weights."""

    name = "mutant.lse_log2"

    def forward(self, q, k, v, spec):
        fwd = super().forward(q, k, v, spec)
        lse2 = fwd.lse * LOG2_E  # the kernel's own statistic, base 2
        return Forward(out=fwd.out, lse=lse2,  # BUG: exported as is; callers expect natural log
                       ctx=(q, k, v, fwd.out, lse2, spec))

    def backward_from_stats(self, q, k, v, out, lse, dout, spec):
        """Takes its statistic in base 2, like its forward gives it."""
        return super().backward_from_stats(q, k, v, out, lse / LOG2_E, dout, spec)


# -- 6. GQA groups of a TP rank picked interleaved ----------------------------------------------


@dataclass
class _GatherSelectContext:
    backend: Any
    comm: Any
    shard: Any
    ctx: Any
    picked: torch.Tensor
    heads_kv: int
    out: torch.Tensor


def _tp_gather_select_forward(backend, comm, shard, q, k, v, spec, *, probe=False):
    """TP attention that all-gathers the K/V heads of the TP group and picks the ones of this
    rank's query heads (Megatron's path when K/V heads must be regrouped across TP ranks).
    q (B, Hq/tp, S, D) contiguous query heads; k / v (B, Hkv/tp, S, *) this rank's K/V heads."""
    lay = comm.layout
    k_all = torch.cat(comm.all_gather(k, "tp"), dim=1)  # (B, Hkv, S, D), TP order = head order
    v_all = torch.cat(comm.all_gather(v, "tp"), dim=1)
    per_rank = k.shape[1]
    # correct: torch.arange(lay.tp_rank * per_rank, (lay.tp_rank + 1) * per_rank)
    picked = torch.arange(lay.tp_rank, k_all.shape[1], lay.tp)  # BUG: interleaved groups
    assert len(picked) == per_rank
    failure, fwd = None, None
    try:
        fwd = backend.forward(q, k_all[:, picked].contiguous(), v_all[:, picked].contiguous(), spec)
    except Unsupported as exc:
        if not probe:
            raise
        failure = exc
    if probe:
        comm.agree(failure)
    return _GatherSelectContext(backend=backend, comm=comm, shard=shard, ctx=fwd.ctx,
                                picked=picked, heads_kv=k_all.shape[1], out=fwd.out)


def _tp_gather_select_backward(ctx: _GatherSelectContext, dout):
    """dK/dV scattered back to the gathered heads, summed over TP, this rank's slice kept."""
    dq, dk, dv = ctx.backend.backward(ctx.ctx, dout)
    full_k = dk.new_zeros(dk.shape[0], ctx.heads_kv, *dk.shape[2:], dtype=F32)
    full_v = dv.new_zeros(dv.shape[0], ctx.heads_kv, *dv.shape[2:], dtype=F32)
    full_k[:, ctx.picked] = dk.to(F32)
    full_v[:, ctx.picked] = dv.to(F32)
    full_k = ctx.comm.all_reduce_sum(full_k, "tp")
    full_v = ctx.comm.all_reduce_sum(full_v, "tp")
    heads = ctx.shard.heads
    mine = slice(heads.kv_start, heads.kv_start + heads.kv_count)
    return dq.to(F32), full_k[:, mine], full_v[:, mine]


_GATHER_SELECT_TP = SimpleNamespace(forward=_tp_gather_select_forward,
                                    backward=_tp_gather_select_backward)


class TpGqaInterleaved(NaiveBackend):
    """Catalogue 6 -- GQA under TP: a rank's K/V heads picked interleaved (heads r, r + tp, ...)
    where its query heads need the contiguous groups h // (Hq / Hkv) (alibaba/ChatLearn#277 "fix
    qkv ordering of GQA when tp > 1"; HazyResearch/HipKittens#22 fixed a GQA head mapping that
    was only right when the group size equalled the K/V head count). Invisible with one K/V head
    per rank, and at TP = 1."""

    name = "mutant.tp_gqa_interleaved"

    def parallel_algorithm(self, case):
        if case.cp == 1 and case.tp > 1 and case.heads_kv > 1:
            return _GATHER_SELECT_TP
        return None


# -- 22. packed CP: each chunk placed in the pack, not in its sequence ----------------------------

_pack_positions_spec = mutated(
    layout.block_spec, "seq_q_start=q_seg.starts,\n                        seq_kv_start=kv_seg.starts,",
    "seq_q_start=tuple(a for a, _ in q_seg.ranges),  # BUG: rows of the pack\n"
    "                        seq_kv_start=tuple(a for a, _ in kv_seg.ranges),")
_PACK_POSITIONS_RING = SimpleNamespace(
    forward=rebound(ring.forward,
                    _forward_step=rebound(ring._forward_step, block_spec=_pack_positions_spec)),
    backward=ring.backward)
_PACK_POSITIONS_ALLGATHER = SimpleNamespace(
    forward=rebound(allgather.forward, block_spec=_pack_positions_spec),
    backward=allgather.backward)


class CpPackPositions(NaiveBackend):
    """Catalogue 22 -- packed CP that places each chunk by its row in the pack, not its position
    in its own sequence: position ids that run on across documents, the way a packed batch is
    sharded when the split does not reset them per sequence (NVIDIA/TransformerEngine#1930,
    axolotl-ai-cloud/axolotl#3608: packing and CP together broke what each alone got right).
    Self-attention with the same shift on both sides keeps causal masks and ALiBi (they see
    j - i only), so it shows where sequence b's queries and keys start at different rows
    (seqlens_kv != seqlens_q: causal rows off for every sequence after the first) or where
    positions key the dropout mask."""

    name = "mutant.cp_pack_positions"

    def parallel_algorithm(self, case):
        if not (case.is_packed and case.cp > 1):
            return None
        return _PACK_POSITIONS_ALLGATHER if case.cp_algo == "allgather" else _PACK_POSITIONS_RING
