"""All-gather context parallelism (``cp_algo: allgather``, as in Llama 3's CP): every rank
gathers the whole K/V of its CP group, and its own queries attend to all of it in one backend
call; backward reduces the K/V gradients back to their owners (an all-reduce, then each keeps its
slice: gloo has no reduce-scatter worth relying on, and these tensors are small next to S x S).

Legend: B = batch, Hq / Hkv = this rank's heads, Sq = its local query length, Sk = the global
key length, D / Dv = head dims.

The backend call carries the query segment's global offset (``q_start``) and ``kv_start = 0``,
so masks, ALiBi and dropout are those of the single-device problem, and backward is the
backend's own (its ctx replays its own dropout mask). No log-sum-exp is needed: any backend
runs here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from attnbench.accuracy.contract import check_backward, check_forward
from attnbench.backends.base import Unsupported
from attnbench.parallel.group import Comm
from attnbench.parallel.layout import Shard, block_spec, offsets, padded, put_rows, take_rows
from attnbench.problem.attn_spec import AttnSpec

F32 = torch.float32


@dataclass
class GatherContext:
    backend: Any
    comm: Comm
    shard: Shard
    calls: list
    """(query rows of the local tensor, backend ctx, the call's (q, k, v)) per query segment."""
    out: torch.Tensor
    lse: Optional[torch.Tensor] = None
    """This rank's log-sum-exp, its segments' calls concatenated (None if the backend returns
    none), gathered and judged."""


def _gather_sequence(comm: Comm, shard: Shard, x: torch.Tensor) -> torch.Tensor:
    """The whole sequence of a key-side tensor from every CP rank's local part."""
    parts = comm.all_gather(padded(x, shard.capacity("kv")), "cp")  # uneven packed chunks
    full = torch.empty(*x.shape[:2], shard.case.seqlen_kv, x.shape[-1], dtype=x.dtype,
                       device=x.device)
    for owner, part in enumerate(parts):
        put_rows(full, part, shard.kv_segments_of(owner))  # its padding is never read
    return full


def forward(backend, comm: Comm, shard: Shard, q: torch.Tensor, k: torch.Tensor,
            v: torch.Tensor, spec: AttnSpec, *, probe: bool = False) -> GatherContext:
    k_full = _gather_sequence(comm, shard, k)
    v_full = _gather_sequence(comm, shard, v)
    outs, lses, calls, failure = [], [], [], None
    label = f"CP rank {shard.cp_rank}, TP rank {shard.tp_rank}: "
    for seg, at in zip(shard.q_segments, offsets(shard.q_segments)):
        rows = slice(at, at + seg.length)
        if not seg.length:
            continue  # packed: a slot of empty chunks (every sequence shorter than 2 cp)
        q_seg = q[:, :, rows].contiguous()
        try:
            fwd = backend.forward(q_seg, k_full, v_full, block_spec(spec, seg, shard.whole_kv()))
        except Unsupported as exc:
            if not probe:
                raise
            failure = exc
            break
        check_forward(shard.case, q_seg, k_full, v_full, fwd.out, fwd.lse, call=label)
        outs.append(fwd.out)
        lses.append(fwd.lse)
        calls.append((rows, fwd.ctx, (q_seg, k_full, v_full, label)))
    if probe:
        comm.agree(failure)
    out = torch.cat(outs, dim=2) if outs else \
        q.new_zeros(*q.shape[:3], v.shape[-1])  # this rank holds no query at all
    lse = None
    if lses and all(x is not None for x in lses):
        lse = torch.cat([x.float() for x in lses], dim=2)
    elif not lses:
        lse = torch.full(q.shape[:3], float("-inf"), dtype=F32, device=q.device)
    return GatherContext(backend=backend, comm=comm, shard=shard, calls=calls, out=out, lse=lse)


def backward(ctx: GatherContext, dout: torch.Tensor):
    """dq for this rank's queries, dk / dv for its own K/V segments, float32."""
    case, shard = ctx.shard.case, ctx.shard
    heads_q, heads_kv = shard.heads.q_count, shard.heads.kv_count
    batch = dout.shape[0]
    dq = torch.zeros(batch, heads_q, dout.shape[2], case.head_dim, dtype=F32, device=dout.device)
    dk_full = torch.zeros(batch, heads_kv, case.seqlen_kv, case.head_dim, dtype=F32,
                          device=dout.device)
    dv_full = torch.zeros(batch, heads_kv, case.seqlen_kv, case.head_dim_v, dtype=F32,
                          device=dout.device)
    for rows, backend_ctx, inputs in ctx.calls:
        grads = ctx.backend.backward(backend_ctx, dout[:, :, rows].contiguous())
        q_seg, k_full, v_full, label = inputs
        check_backward(q_seg, k_full, v_full, grads, call=label)
        dq_b, dk, dv = grads
        dq[:, :, rows] = dq_b.to(F32)
        dk_full += dk.to(F32)
        dv_full += dv.to(F32)
    dk_full = ctx.comm.all_reduce_sum(dk_full, "cp")
    dv_full = ctx.comm.all_reduce_sum(dv_full, "cp")
    segs = shard.kv_segments
    return dq, take_rows(dk_full, segs), take_rows(dv_full, segs)
