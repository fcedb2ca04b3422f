"""Process groups of a rank pool, created once per pool and reused by every case it runs.

Rendezvous: rank 0 binds ``TCPStore(host, 0, ...)`` (port 0: the kernel picks a free port, so
pools never collide the way "find a free port, close it, bind later" does) and writes the port
to ``$ATTNBENCH_POOL_DIR/rendezvous-$ATTNBENCH_POOL_START.port``; the other ranks wait for that
file. The pool (:mod:`attnbench.execution.pool`) sets both variables, and a rebuilt pool has a new
start number, so its ranks never read a dead store's port. Ranks started by ``torchrun`` instead
fall back to ``env://`` (MASTER_ADDR / MASTER_PORT).

Backends: gloo on CPU; ``cpu:gloo,cuda:nccl`` when every rank has a GPU of its own (NCCL refuses
two ranks on one GPU); gloo with host staging (tensors copied to the CPU around every
communication) when ranks share a GPU -- correct, but its timings say nothing about throughput,
so :attr:`World.timing_note` flags them.

Timeout: the group's timeout is the case timeout plus :data:`GROUP_TIMEOUT_MARGIN_S`. The pool
kills a hung case at the case timeout itself; the margin makes sure that kill comes first (a
collective that timed out on a waiting rank would otherwise be reported as that rank's error,
not as the hang it is). NCCL's default of 10 minutes is never used. A case with another timeout
re-initialises the group (same store, new prefix): all ranks get the same payload, so they agree.

CP x TP layout: global rank = cp_rank * tp + tp_rank (TP ranks adjacent, as in Megatron).
Sub-groups are created by every rank in one fixed order (``new_group`` hangs otherwise) and
cached per (cp, tp).
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist

from attnbench.backends.base import Unsupported
from attnbench.hardware.device import pick_device
from attnbench.resources import ENV_POOL_DIR, ENV_POOL_START

log = logging.getLogger("attnbench.parallel")

HOST = "127.0.0.1"
"""A pool's ranks always run on one host (the Dask worker's)."""

GROUP_TIMEOUT_MARGIN_S = 15.0
"""Added to the case timeout for the process group's own timeout (see the module docstring)."""
_RENDEZVOUS_POLL_S = 0.005


@dataclass(kw_only=True)
class World:
    """The default process group of this rank process, and how it talks."""

    rank: int
    world_size: int
    device: torch.device
    backend: str
    """``gloo`` or ``cpu:gloo,cuda:nccl``."""
    staging: bool
    """Copy CUDA tensors to the host around every communication (gloo with shared GPUs)."""
    timing_note: str
    """Empty when timings measure throughput; else why they are correctness only."""
    timeout_s: float
    prefix: str
    store: Any = field(repr=False, default=None)
    layouts: dict = field(default_factory=dict, repr=False)


_world: Optional[World] = None
_generation = 0


def get_world(timeout_s: float) -> World:
    """The process group of this rank process, created on first use (once per pool)."""
    global _world
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    wanted = timeout_s + GROUP_TIMEOUT_MARGIN_S
    if _world is not None and _world.world_size == world_size:
        if abs(_world.timeout_s - wanted) < 1e-6:
            return _world
        log.info("re-initialising the process group: timeout %.0f s -> %.0f s",
                 _world.timeout_s, wanted)
        store = _world.store
        dist.destroy_process_group()
        _world = None
    else:
        store = _connect_store(rank, world_size, wanted)
    _world = _init(store, rank, world_size, wanted)
    return _world


def _connect_store(rank: int, world_size: int, timeout_s: float):
    pool_dir, start = os.environ.get(ENV_POOL_DIR), os.environ.get(ENV_POOL_START)
    if not pool_dir or start is None:
        return None  # not in a rank pool: env:// below
    port_file = Path(pool_dir) / f"rendezvous-{start}.port"
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank == 0:
        store = dist.TCPStore(HOST, 0, world_size, is_master=True, wait_for_workers=False,
                              timeout=timeout)
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(str(store.port))
        os.replace(tmp, port_file)  # atomic: a reader never sees half a number
        return store
    deadline = time.monotonic() + timeout_s
    while not port_file.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: no rendezvous file {port_file} after "
                               f"{timeout_s:g} s (rank 0 did not start its store)")
        time.sleep(_RENDEZVOUS_POLL_S)
    return dist.TCPStore(HOST, int(port_file.read_text()), world_size, is_master=False,
                         timeout=timeout)


def _init(store, rank: int, world_size: int, timeout_s: float) -> World:
    global _generation
    _generation += 1
    prefix = f"attnbench/{_generation}"
    device = pick_device(int(os.environ.get("LOCAL_RANK", rank)))
    timeout = datetime.timedelta(seconds=timeout_s)
    backend, staging, note = "gloo", False, "correctness only: CPU ranks over gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
        backend, staging, note = _cuda_backend(store, prefix, rank, world_size, device)
    if device.type == "cpu":
        # Ranks share the host's cores: more torch threads than cores only adds contention.
        torch.set_num_threads(max(1, torch.get_num_threads() // world_size))
    if store is None:
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
    else:
        dist.init_process_group(backend, store=dist.PrefixStore(prefix, store), rank=rank,
                                world_size=world_size, timeout=timeout)
    if rank == 0 and os.environ.get(ENV_POOL_DIR):
        # Every rank has connected once init returns; the port file has served its purpose.
        (Path(os.environ[ENV_POOL_DIR]) / f"rendezvous-{os.environ[ENV_POOL_START]}.port") \
            .unlink(missing_ok=True)
    log.info("process group: rank %d/%d on %s, %s%s", rank, world_size, device, backend,
             " (host staging)" if staging else "")
    return World(rank=rank, world_size=world_size, device=device, backend=backend,
                 staging=staging, timing_note=note, timeout_s=timeout_s, prefix=prefix,
                 store=store)


def _cuda_backend(store, prefix: str, rank: int, world_size: int, device: torch.device):
    """NCCL when every rank has a GPU of its own (compared by UUID through the store, which also
    covers pools whose ranks each see a different CUDA_VISIBLE_DEVICES), else gloo + staging."""
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    if store is None:
        return "cpu:gloo,cuda:nccl", False, ""
    store.set(f"{prefix}/device/{rank}", uuid)
    uuids = [store.get(f"{prefix}/device/{r}").decode() for r in range(world_size)]
    if len(set(uuids)) == world_size:
        return "cpu:gloo,cuda:nccl", False, ""
    return "gloo", True, "correctness only: ranks share a GPU (gloo with host staging)"


# -- CP x TP layout ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    cp: int
    tp: int
    cp_rank: int
    tp_rank: int
    cp_peers: tuple[int, ...]
    """Global ranks of this rank's CP group, in CP order (the ring)."""
    tp_peers: tuple[int, ...]
    cp_group: Any = None
    """None: the default group (tp == 1)."""
    tp_group: Any = None
    """None: the default group (cp == 1)."""


def rank_layout(world: World, cp: int, tp: int) -> Layout:
    if cp * tp != world.world_size:
        raise ValueError(f"cp={cp} x tp={tp} != world size {world.world_size}")
    key = (cp, tp)
    if key not in world.layouts:
        cp_rank, tp_rank = divmod(world.rank, tp)
        groups_cp = [tuple(c * tp + t for c in range(cp)) for t in range(tp)]
        groups_tp = [tuple(c * tp + t for t in range(tp)) for c in range(cp)]
        cp_group = tp_group = None
        # Same calls, same order, on every rank (members or not): new_group hangs otherwise.
        if cp > 1 and tp > 1:
            made_cp = [dist.new_group(list(ranks)) for ranks in groups_cp]
            made_tp = [dist.new_group(list(ranks)) for ranks in groups_tp]
            cp_group, tp_group = made_cp[tp_rank], made_tp[cp_rank]
        world.layouts[key] = Layout(cp=cp, tp=tp, cp_rank=cp_rank, tp_rank=tp_rank,
                                    cp_peers=groups_cp[tp_rank], tp_peers=groups_tp[cp_rank],
                                    cp_group=cp_group, tp_group=tp_group)
    return world.layouts[key]


# -- communication -------------------------------------------------------------------------------


class PeerFailed(RuntimeError):
    """Another rank failed in a phase all ranks agreed on (see :meth:`Comm.agree`)."""


class _Pending:
    def __init__(self, works, received: list[torch.Tensor], comm: "Comm"):
        self.works, self.received, self.comm = works, received, comm

    def wait(self) -> list[torch.Tensor]:
        for work in self.works:
            work.wait()
        return [self.comm._from_wire(t) for t in self.received]


class _Done:
    def __init__(self, tensors: Sequence[torch.Tensor]):
        self.tensors = list(tensors)

    def wait(self) -> list[torch.Tensor]:
        return self.tensors


class Comm:
    """The few operations the algorithms use, over a :class:`Layout`, with host staging where
    the world needs it. Control messages (flags) always travel as CPU tensors (gloo)."""

    def __init__(self, world: World, lay: Layout):
        self.world, self.layout = world, lay
        self.rank, self.device = world.rank, world.device

    # tensors on the wire
    def _to_wire(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().to("cpu").contiguous() if self.world.staging else t.contiguous()

    def _from_wire(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device) if self.world.staging else t

    def _empty_like_wire(self, t: torch.Tensor) -> torch.Tensor:
        return torch.empty(t.shape, dtype=t.dtype,
                           device="cpu" if self.world.staging else t.device)

    def ring_shift(self, tensors: Sequence[torch.Tensor]):
        """Send ``tensors`` to the next rank of the CP ring and receive the previous rank's
        (same shapes). Returns a handle whose ``wait()`` gives the received tensors."""
        lay = self.layout
        if lay.cp == 1:
            return _Done(tensors)
        nxt = lay.cp_peers[(lay.cp_rank + 1) % lay.cp]
        prv = lay.cp_peers[(lay.cp_rank - 1) % lay.cp]
        ops, received = [], []
        for t in tensors:
            ops.append(dist.P2POp(dist.isend, self._to_wire(t), nxt))
        for t in tensors:
            buf = self._empty_like_wire(t)
            received.append(buf)
            ops.append(dist.P2POp(dist.irecv, buf, prv))
        return _Pending(dist.batch_isend_irecv(ops), received, self)

    def all_gather(self, tensor: torch.Tensor, group: str) -> list[torch.Tensor]:
        """Every member's ``tensor`` (same shape), in group order; ``group`` is "cp" or "tp"."""
        peers, handle = self._group(group)
        if len(peers) == 1:
            return [tensor]
        wire = self._to_wire(tensor)
        out = [torch.empty_like(wire) for _ in peers]
        dist.all_gather(out, wire, group=handle)
        return [self._from_wire(t) for t in out]

    def all_reduce_sum(self, tensor: torch.Tensor, group: str) -> torch.Tensor:
        peers, handle = self._group(group)
        if len(peers) == 1:
            return tensor
        wire = self._to_wire(tensor)
        dist.all_reduce(wire, group=handle)
        return self._from_wire(wire)

    def gather_to_first(self, tensor: torch.Tensor) -> Optional[list[torch.Tensor]]:
        """Every rank's ``tensor`` (same shape) on global rank 0, in rank order; None elsewhere."""
        wire = self._to_wire(tensor)
        if self.world.world_size == 1:
            return [tensor]
        out = [torch.empty_like(wire) for _ in range(self.world.world_size)] \
            if self.rank == 0 else None
        dist.gather(wire, out, dst=0)
        return [self._from_wire(t) for t in out] if out is not None else None

    def barrier(self) -> None:
        # An all-reduce of one CPU int: works on every backend without device guessing.
        dist.all_reduce(torch.zeros(1, dtype=torch.int32))

    def decide(self, value: int) -> int:
        """Rank 0's ``value`` on every rank (e.g. "stop sampling", calls per sample)."""
        flag = torch.tensor([int(value) if self.rank == 0 else 0], dtype=torch.int64)
        dist.all_reduce(flag)
        return int(flag.item())

    def slowest(self, value: float) -> float:
        """The largest of every rank's ``value`` (a sample's time: the slowest rank's)."""
        cell = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(cell, op=dist.ReduceOp.MAX)
        return float(cell.item())

    def align(self) -> None:
        """Before a timing sample: every rank starts together (the timing Coordinator)."""
        self.barrier()

    def agree(self, failure: Optional[BaseException]) -> None:
        """All ranks learn whether any rank failed a local phase; if one did, every rank raises
        the same exception (:class:`Unsupported` when every failure was one, else
        :class:`PeerFailed`), so no rank is left waiting in a collective the others skipped."""
        flag = torch.tensor([0 if failure is None else 1], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if not flag.item():
            return
        mine = None if failure is None else (isinstance(failure, Unsupported),
                                             f"{type(failure).__name__}: {failure}")
        every: list = [None] * self.world.world_size
        dist.all_gather_object(every, mine)
        failed = [(r, f) for r, f in enumerate(every) if f is not None]
        first_rank, (_, text) = failed[0]
        if all(unsupported for _, (unsupported, _) in failed):
            raise Unsupported(text.split(": ", 1)[1])
        raise PeerFailed(f"rank {first_rank}: {text}")

    def _group(self, name: str):
        lay = self.layout
        if name == "cp":
            return lay.cp_peers, lay.cp_group
        if name == "tp":
            return lay.tp_peers, lay.tp_group
        raise ValueError(f"group: got {name!r}, expected 'cp' or 'tp'")
