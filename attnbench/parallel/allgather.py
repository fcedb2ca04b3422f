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
from typing import Any

import torch

from attnbench.backends.base import Unsupported
from attnbench.parallel.group import Comm
from attnbench.parallel.layout import Shard, offsets
from attnbench.problem import AttnSpec

F32 = torch.float32


@dataclass
class GatherContext:
    backend: Any
    comm: Comm
    shard: Shard
    calls: list
    """(query rows of the local tensor, backend ctx) per query segment."""
    out: torch.Tensor


def _gather_sequence(comm: Comm, shard: Shard, x: torch.Tensor) -> torch.Tensor:
    """The whole sequence of a key-side tensor from every CP rank's local part."""
    parts = comm.all_gather(x, "cp")
    full = torch.empty(*x.shape[:2], shard.case.seqlen_kv, x.shape[-1], dtype=x.dtype,
                       device=x.device)
    for owner, part in enumerate(parts):
        segments = shard.kv_segments_of(owner)
        for seg, at in zip(segments, offsets(segments)):
            full[:, :, seg.start:seg.stop] = part[:, :, at:at + seg.length]
    return full


def forward(backend, comm: Comm, shard: Shard, q: torch.Tensor, k: torch.Tensor,
            v: torch.Tensor, spec: AttnSpec, *, probe: bool = False) -> GatherContext:
    k_full = _gather_sequence(comm, shard, k)
    v_full = _gather_sequence(comm, shard, v)
    outs, calls, failure = [], [], None
    for seg, at in zip(shard.q_segments, offsets(shard.q_segments)):
        rows = slice(at, at + seg.length)
        try:
            fwd = backend.forward(q[:, :, rows].contiguous(), k_full, v_full,
                                  spec.replace(q_start=seg.start, kv_start=0))
        except Unsupported as exc:
            if not probe:
                raise
            failure = exc
            break
        outs.append(fwd.out)
        calls.append((rows, fwd.ctx))
    if probe:
        comm.agree(failure)
    return GatherContext(backend=backend, comm=comm, shard=shard, calls=calls,
                         out=torch.cat(outs, dim=2))


def backward(ctx: GatherContext, dout: torch.Tensor):
    """dq for this rank's queries, dk / dv for its own K/V segments, float32."""
    dq_parts, dk_full, dv_full = [], None, None
    for rows, backend_ctx in ctx.calls:
        dq, dk, dv = ctx.backend.backward(backend_ctx, dout[:, :, rows].contiguous())
        dq_parts.append(dq.to(F32))
        dk_full = dk.to(F32) if dk_full is None else dk_full + dk.to(F32)
        dv_full = dv.to(F32) if dv_full is None else dv_full + dv.to(F32)
    dk_full = ctx.comm.all_reduce_sum(dk_full, "cp")
    dv_full = ctx.comm.all_reduce_sum(dv_full, "cp")
    segs = ctx.shard.kv_segments
    dk = torch.cat([dk_full[:, :, s.start:s.stop] for s in segs], dim=2)
    dv = torch.cat([dv_full[:, :, s.start:s.stop] for s in segs], dim=2)
    return torch.cat(dq_parts, dim=2), dk, dv
