"""Ring context parallelism (``cp_algo: ring`` and ``zigzag``): K/V travel, queries stay.

Legend: B = batch, Hq / Hkv = this rank's query / K/V heads, Sq / Sk = this rank's local lengths
(its segments concatenated, see :mod:`attnbench.parallel.layout`), D / Dv = head dims.

Forward. CP rank c holds its queries and, at ring step s, the K/V segments of rank c - s (mod
cp); while it computes, the next K/V block is already on its way (point-to-point send to c + 1,
receive from c - 1). Every (query segment, K/V segment) pair that has a visible position is one
backend call whose :class:`~attnbench.problem.attn_spec.AttnSpec` carries the pair's *global*
offsets, so masks, ALiBi and dropout come out as in the single-device problem. Partial results merge
by log-sum-exp (the lse in float64, the outputs in float32):

    lse = logaddexp(lse_a, lse_b),  out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b

which also holds with dropout, because each block's output is already normalised by its own
softmax denominator and dropout does not enter the denominator.

Backward. K/V go round the ring again, followed by their gradient accumulators: at step s rank c
adds its queries' contribution to the dK/dV of block c - s, then passes the accumulator on; after
``cp`` passes every accumulator is home. Each block's gradients come from the backend's
``backward_from_stats`` with the *merged* output and log-sum-exp.

Dropout (seed 000: a CP backward that did not replay forward's RNG states segfaulted or, worse,
silently used other masks). Forward saves, for every block, the spec it ran with -- seed and
global offsets are this harness's RNG state -- and backward replays exactly that: see
:func:`replay_rng_state`, the one line a seed-000 mutant changes.

``zigzag`` differs only in the layout (two segments per rank); both use this code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from attnbench.accuracy.contract import check_backward, check_forward
from attnbench.backends.base import Unsupported
from attnbench.parallel.group import Comm
from attnbench.parallel.layout import Shard, any_visible, block_spec, offsets, padded
from attnbench.problem.attn_spec import AttnSpec

F32 = torch.float32
LSE_MERGE = torch.float64
"""What the log-sum-exps merge in. A probability recomputed from an lse is off by the lse's
absolute error, |lse| * 6e-8 in float32 after each rounding; an attention sink puts |lse| near
10 and its softmax gradient cancels, so an fp32 merge over cp steps cost the fp64 reference 4e-6
in dQ where one device's once-rounded lse costs 5e-7. One value per query row: fp64 is free."""


@dataclass(frozen=True)
class SavedBlock:
    """One backend call of the forward ring: enough to redo it exactly in backward."""

    step: int
    q_index: int
    """Which of this rank's query segments."""
    kv_owner: int
    """CP rank whose K/V were held at this step."""
    kv_index: int
    """Which of the owner's K/V segments."""
    spec: AttnSpec
    """The spec forward ran with: global offsets and dropout seed (this block's RNG state)."""


@dataclass
class RingContext:
    backend: Any
    comm: Comm
    shard: Shard
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor
    """Merged output, (B, Hq, Sq, Dv) in the input dtype."""
    lse: torch.Tensor
    """Merged log-sum-exp, (B, Hq, Sq) float32."""
    blocks: list[SavedBlock] = field(default_factory=list)


def replay_rng_state(block: SavedBlock) -> AttnSpec:
    """The spec -- and so the dropout mask -- backward must use for ``block``: forward's own.

    Seed 000's bug as a one-line mutant: ``return block.spec.replace(dropout_seed=
    block.spec.dropout_seed + block.step + 1)`` (backward draws from an RNG state that has moved
    on since forward). The records then fail the exact-mask reference and the dv_v identity.
    """
    return block.spec


def _merge(acc_out: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor,
           lse: torch.Tensor) -> None:
    """In place: (acc_out, acc_lse) <- softmax-merge with one more block. acc_out is float32,
    acc_lse :data:`LSE_MERGE`."""
    lse = lse.to(acc_lse.dtype)
    new_lse = torch.logaddexp(acc_lse, lse)
    # Rows that saw no key so far have lse -inf on both sides: keep them at 0 / -inf.
    safe = torch.where(torch.isinf(new_lse), torch.zeros_like(new_lse), new_lse)
    w_acc = torch.exp(acc_lse - safe).to(F32)[..., None]
    w_new = torch.exp(lse - safe).to(F32)[..., None]
    acc_out.mul_(w_acc).add_(out.to(F32) * w_new)
    acc_lse.copy_(new_lse)


def forward(backend, comm: Comm, shard: Shard, q: torch.Tensor, k: torch.Tensor,
            v: torch.Tensor, spec: AttnSpec, *, probe: bool = False) -> RingContext:
    """Ring attention over this rank's CP group. q (B, Hq, Sq, D), k / v (B, Hkv, Sk, *): this
    rank's local tensors; ``spec`` is the global problem's with this rank's ``head_start``.

    ``probe``: compute step 0 before the first send and let all ranks agree that it worked
    (a backend without a log-sum-exp, or raising Unsupported, becomes ``unsupported`` on every
    rank, not a hang); used for the first, checked run of a case.
    """
    lay = comm.layout
    cp, me = lay.cp, lay.cp_rank
    q_off = offsets(shard.q_segments)
    batch, heads_q, seqlen_q, _ = q.shape
    acc_out = torch.zeros(batch, heads_q, seqlen_q, v.shape[-1], dtype=F32, device=q.device)
    acc_lse = torch.full((batch, heads_q, seqlen_q), float("-inf"), dtype=LSE_MERGE,
                         device=q.device)
    # Uneven packed chunks: K/V travel padded to the longest rank's (rows past a segment's end
    # are never read); a no-op for dense cases.
    k, v = padded(k, shard.capacity("kv")), padded(v, shard.capacity("kv"))
    ctx = RingContext(backend=backend, comm=comm, shard=shard, q=q, k=k, v=v, out=acc_out,
                      lse=acc_lse)
    held_k, held_v = k, v
    for step in range(cp):
        owner = (me - step) % cp
        pending = None
        if step + 1 < cp and not (probe and step == 0):
            pending = comm.ring_shift([held_k, held_v])  # next block travels while we compute
        failure = None
        try:
            _forward_step(ctx, step, owner, held_k, held_v, spec, q_off, acc_out, acc_lse)
        except Unsupported as exc:
            if not (probe and step == 0):
                raise
            failure = exc
        if probe and step == 0:
            comm.agree(failure)
            if step + 1 < cp:
                pending = comm.ring_shift([held_k, held_v])
        if pending is not None:
            held_k, held_v = pending.wait()
    ctx.out = acc_out.to(q.dtype)
    ctx.lse = acc_lse.to(F32)  # rounded once, as a single call's
    return ctx


def _forward_step(ctx: RingContext, step: int, owner: int, held_k, held_v, spec: AttnSpec,
                  q_off: list[int], acc_out, acc_lse) -> None:
    shard = ctx.shard
    kv_segments = shard.kv_segments_of(owner)
    kv_off = offsets(kv_segments)
    for qi, (q_seg, qa) in enumerate(zip(shard.q_segments, q_off)):
        rows = slice(qa, qa + q_seg.length)
        for kj, (kv_seg, ka) in enumerate(zip(kv_segments, kv_off)):
            if not any_visible(spec, q_seg, kv_seg):
                continue  # wholly masked: the causal half that zigzag balances
            this_spec = block_spec(spec, q_seg, kv_seg)
            cols = slice(ka, ka + kv_seg.length)
            block = (ctx.q[:, :, rows].contiguous(), held_k[:, :, cols].contiguous(),
                     held_v[:, :, cols].contiguous())
            fwd = ctx.backend.forward(*block, this_spec)
            check_forward(shard.case, *block, fwd.out, fwd.lse, call=_label(shard, step))
            if fwd.lse is None:
                raise Unsupported(f"ring/zigzag CP: backend {ctx.backend.name!r} returns no "
                                  "log-sum-exp (Forward.lse is None), which merging partial "
                                  "outputs needs; cp_algo: allgather does not")
            _merge(acc_out[:, :, rows], acc_lse[:, :, rows], fwd.out, fwd.lse)
            ctx.blocks.append(SavedBlock(step=step, q_index=qi, kv_owner=owner, kv_index=kj,
                                         spec=this_spec))


def _label(shard: Shard, step: int) -> str:
    """How a contract breach names the call that broke it."""
    return f"CP rank {shard.cp_rank}, TP rank {shard.tp_rank}, ring step {step}: "


def backward(ctx: RingContext, dout: torch.Tensor):
    """dq (B, Hq, Sq, D) for this rank's queries, dk / dv (B, Hkv, Sk, *) for its own K/V, all
    float32. Does not change ``ctx`` (the timer calls it repeatedly)."""
    comm, shard = ctx.comm, ctx.shard
    cp = comm.layout.cp
    q_off = offsets(shard.q_segments)
    dq = torch.zeros(ctx.q.shape, dtype=F32, device=ctx.q.device)
    held_k, held_v = ctx.k, ctx.v
    dk_acc = torch.zeros(ctx.k.shape, dtype=F32, device=ctx.k.device)
    dv_acc = torch.zeros(ctx.v.shape, dtype=F32, device=ctx.v.device)
    by_step: dict[int, list[SavedBlock]] = {}
    for block in ctx.blocks:
        by_step.setdefault(block.step, []).append(block)
    for step in range(cp):
        pending = comm.ring_shift([held_k, held_v]) if step + 1 < cp else None
        for block in by_step.get(step, ()):
            spec = replay_rng_state(block)
            q_seg = shard.q_segments[block.q_index]
            rows = slice(q_off[block.q_index], q_off[block.q_index] + q_seg.length)
            kv_segments = shard.kv_segments_of(block.kv_owner)
            ka = offsets(kv_segments)[block.kv_index]
            cols = slice(ka, ka + kv_segments[block.kv_index].length)
            block = (ctx.q[:, :, rows].contiguous(), held_k[:, :, cols].contiguous(),
                     held_v[:, :, cols].contiguous())
            grads = ctx.backend.backward_from_stats(
                *block, ctx.out[:, :, rows].contiguous(), ctx.lse[:, :, rows].contiguous(),
                dout[:, :, rows].contiguous(), spec)
            check_backward(*block, grads, call=_label(shard, step))
            dq_b, dk_b, dv_b = grads
            dq[:, :, rows] += dq_b.to(F32)
            dk_acc[:, :, cols] += dk_b.to(F32)
            dv_acc[:, :, cols] += dv_b.to(F32)
        if pending is not None:
            held_k, held_v = pending.wait()
        # The accumulators follow their K/V block; after cp passes each is back with its owner.
        dk_acc, dv_acc = comm.ring_shift([dk_acc, dv_acc]).wait()
    own = shard.local_length("kv")  # without the padding K/V travelled with
    return dq, dk_acc[:, :, :own], dv_acc[:, :, :own]

