"""Tensor parallelism: heads split across ranks (Megatron's attention layout).

Legend: B = batch, Hq / Hkv = this rank's query / K/V heads, S = lengths, D = head dim.

Each TP rank holds ``Hq / tp`` query heads and the K/V heads of their GQA groups (see
:mod:`attnbench.parallel.layout`); its backend calls carry ``head_start`` = its first global query
head, so ALiBi slopes (indexed by global head, seed 004's bug was slopes repeated in the wrong
order) and dropout masks are those of the single-device problem. Attention never mixes heads, so
with CP = 1 a TP rank runs one plain backend call; the only communication is MQA's: its single
K/V head is replicated on every TP rank, and the backward of a replication is a sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from attnbench.accuracy.contract import check_backward, check_forward
from attnbench.backends.base import Unsupported
from attnbench.parallel.group import Comm
from attnbench.parallel.layout import Shard
from attnbench.problem.attn_spec import AttnSpec

F32 = torch.float32


@dataclass
class LocalContext:
    backend: Any
    ctx: Any
    out: torch.Tensor
    lse: Optional[torch.Tensor] = None
    """The call's log-sum-exp (None if the backend returns none), gathered and judged."""
    inputs: tuple = ()
    """This rank's (q, k, v, its label): what the backward's gradients must be shaped like."""


def rank_label(shard: Shard) -> str:
    """How a contract breach names the rank whose call broke it."""
    return f"CP rank {shard.cp_rank}, TP rank {shard.tp_rank}: "


def forward(backend, comm: Comm, shard: Shard, q: torch.Tensor, k: torch.Tensor,
            v: torch.Tensor, spec: AttnSpec, *, probe: bool = False) -> LocalContext:
    """CP = 1: this rank's heads, the whole sequence, one backend call."""
    failure, fwd = None, None
    try:
        fwd = backend.forward(q, k, v, spec)
    except Unsupported as exc:
        if not probe:
            raise
        failure = exc
    if probe:
        comm.agree(failure)
    check_forward(shard.case, q, k, v, fwd.out, fwd.lse, call=rank_label(shard))
    return LocalContext(backend=backend, ctx=fwd.ctx, out=fwd.out, lse=fwd.lse,
                        inputs=(q, k, v, rank_label(shard)))


def backward(ctx: LocalContext, dout: torch.Tensor):
    grads = ctx.backend.backward(ctx.ctx, dout)
    q, k, v, label = ctx.inputs
    check_backward(q, k, v, grads, call=label)
    dq, dk, dv = grads
    return dq.to(F32), dk.to(F32), dv.to(F32)


def reduce_replicated_kv(comm: Comm, shard: Shard, dk: torch.Tensor, dv: torch.Tensor):
    """Sum dK/dV over the TP group where K/V were replicated (MQA); identity otherwise."""
    if not shard.heads.kv_replicated:
        return dk, dv
    return comm.all_reduce_sum(dk, "tp"), comm.all_reduce_sum(dv, "tp")
