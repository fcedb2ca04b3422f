"""One CP/TP case, run on every rank of a pool: shard -> parallel fwd/bwd -> gather -> checks.

Called by :func:`attnbench.execution.case_runner.run_case` for ``cp * tp > 1``; every rank of a
``world_size = cp * tp`` pool runs it with the same case, and rank 0's record is the pool's answer.

Phases, and what a failure in each becomes:

1. Checks that need no communication (heads or lengths that do not split, then the backend's
   :func:`~attnbench.backends.capabilities.refusal` for this ``World``: its ``supports``,
   packed CP chunks, ``backward_from_stats`` for ring/zigzag, ...): identical on every rank,
   so every rank returns the same ``unsupported`` record and no rank waits for another.
2. The process group (once per pool, :mod:`attnbench.parallel.group`), full inputs on every rank
   from the case seed (same seed, same tensors), this rank's shard.
3. The first forward step, then an agreement (:meth:`Comm.agree`): a backend that raises
   ``Unsupported`` or returns no log-sum-exp there is ``unsupported`` on every rank.
4. The rest of forward, backward (not for a forward-only case, ``backward: false``), gathering
   out/dq/dk/dv to rank 0 and timing: any exception escapes, so the pool records ``error`` (or
   ``oom``) naming the rank and rebuilds the group -- collectives may be half done. The
   backend's own exception escapes as a :class:`~attnbench.errors.BackendError` naming its
   frame (its ``error``), any other is a harness error (:mod:`attnbench.execution.blame`).
   Crashes and hangs are the pool's as for any case.
   A hidden dropout mask: every rank draws under its own generator state
   (:meth:`~attnbench.accuracy.rng.RngState.for_call`: the case's seed and the rank), and where
   the case is small enough to probe, the ranks read the split run's mask back together
   (:func:`_mask_parts`: identity columns as V, Dv keys a call), gathered for rank 0.
5. Rank 0 alone: accuracy of the gathered full tensors against fp64 (the usual checks,
   :func:`attnbench.accuracy.evaluate.evaluate`) and parity against the same backend at CP = 1,
   TP = 1 on the same inputs (:mod:`attnbench.parallel.parity`).

Timing: the one loop of :mod:`attnbench.timing.loop` on every rank, the :class:`Comm` as its
coordinator: barrier-aligned samples, each one CUDA events (perf_counter on CPU) around the whole
parallel forward or backward with an L2 flush before, the slowest rank's time as the sample, and
rank 0's decisions (warm-up done, calls per sample, stop) for all -- every rank makes the same
calls. Timings of CPU ranks and of ranks sharing a GPU are correctness only: ``timing.note`` says
so and ``tflops`` / ``pct_peak`` are null.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any, Optional

import torch

from attnbench.accuracy import bounds as acc
from attnbench.accuracy.dropout_exact import identity_columns
from attnbench.accuracy.dropout_independence import MaskParts, cp_parts
from attnbench.accuracy.dropout_probe import PROBE_CALL_LIMIT, PROBE_ENTRY_LIMIT
from attnbench.accuracy.evaluate import Judgement, evaluate, timed_only
from attnbench.accuracy.rng import RngState
from attnbench.backends import Capabilities, Unsupported, World, get_backend, refusal
from attnbench.backends.masks import release_prepared
from attnbench.errors import BackendError, is_oom
from attnbench.execution.blame import blame
from attnbench.hardware.device import (backend_env, device_env, device_peaks, interpreter_on_gpu,
                                       pick_device, release_memory, sync)
from attnbench.parallel import allgather, layout, ring, tp
from attnbench.parallel.group import Comm, PeerFailed, get_world, rank_layout
from attnbench.parallel.layout import Shard
from attnbench.parallel.parity import parity, reference_roundings, summed_partials
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.inputs import make_inputs
from attnbench.problem.reference import reference_backward, reference_forward
from attnbench.results.records import TENSORS, RecordMaker, handled_crash
from attnbench.sweep.case import Case
from attnbench.sweep.options import RunOptions
from attnbench.timing.case import time_case

def algorithm(case: Case, backend: Any = None) -> ModuleType:
    """The module (``forward``, ``backward``) that runs this case's split: the backend's own
    when it brings one (``backend.parallel_algorithm(case)`` not None -- a library with its own
    CP, or a selftest mutant of ours), else ours."""
    own = Capabilities.of(backend).parallel_algorithm if backend is not None else None
    chosen = own(case) if own is not None else None
    if chosen is not None:
        return chosen
    if case.cp == 1:
        return tp
    if case.ring_split:
        return ring
    if case.cp_algo == "allgather":
        return allgather
    raise NotImplementedError(f"cp_algo {case.cp_algo!r} is not implemented")


def _own(algo: ModuleType) -> tuple[ModuleType, ...]:
    """The split module when the backend brought it (its frames are then the backend's)."""
    return () if algo in (ring, allgather, tp) else (algo,)


def run_parallel_case(case: Case, options: RunOptions) -> Optional[dict]:
    """Run ``case`` on this rank; rank 0 returns the record, the other ranks None."""
    rank = int(os.environ.get("RANK", "0"))
    pool_size = int(os.environ.get("WORLD_SIZE", "1"))
    device = pick_device(int(os.environ.get("LOCAL_RANK", rank)))
    make = RecordMaker(case, device_env(device))

    def record(verdict: str, reason: str = "", **fields) -> Optional[dict]:
        return make(verdict, reason, **fields) if rank == 0 else None

    # 1. decided alike on every rank, before any communication
    if pool_size != case.world_size or "RANK" not in os.environ:
        return record("error", f"cp={case.cp} x tp={case.tp} needs a rank pool of "
                               f"{case.world_size} processes; this one has {pool_size}")
    refused = interpreter_on_gpu(device)
    if refused:
        return record("error", refused)
    reason = layout.unsupported_reason(case)  # before loading: whatever the backend
    if reason:
        return record("unsupported", reason)
    try:
        backend = get_backend(case.backend)
    except Exception as exc:
        return make.exception("error", exc, f"cannot load backend {case.backend!r}: ") \
            if rank == 0 else None
    make.env["backend"] = backend_env(case.backend, backend)
    algo = algorithm(case, backend)
    reason = refusal(backend, case, device, World(cp=case.cp, tp=case.tp, ring=algo is ring))
    if reason:
        return record("unsupported", reason)
    try:
        return _run(case, options, device, backend, algo, rank, record, make)
    except Exception as exc:
        # It escapes (the pool rebuilds the group: collectives may be half done), named: the
        # backend's own exception is its error, anything else a harness error.
        mine, reason = blame(exc, backend, _own(algo))
        if not mine or is_oom(exc):
            raise
        raise BackendError(reason) from exc
    finally:
        release_prepared(backend)
        release_memory(device)


def _run(case: Case, options: RunOptions, device: torch.device, backend, algo, rank: int,
         record, make: RecordMaker) -> Optional[dict]:
    # 2. group, inputs, shard
    world = get_world(options.timeout_s)
    comm = Comm(world, rank_layout(world, case.cp, case.tp))
    shard = Shard.of(case, comm.layout.cp_rank, comm.layout.tp_rank)
    make.env["process_group"] = {"backend": world.backend, "host_staging": world.staging,
                                 "created": world.prefix}
    spec = AttnSpec.from_case(case).replace(head_start=shard.heads.q_start)
    q, k, v, dout = make_inputs(case, device)
    local = (shard.slice_q(q), shard.slice_kv(k), shard.slice_kv(v))
    local_dout = shard.slice_q(dout)

    def run_forward(probe: bool = False):
        return algo.forward(backend, comm, shard, *local, spec, probe=probe)

    def run_backward(ctx):
        dq, dk, dv = algo.backward(ctx, local_dout)
        dk, dv = tp.reduce_replicated_kv(comm, shard, dk, dv)
        return dq, dk, dv

    # A hidden mask drawn from the generator: each rank from its own state (the case's seed and
    # its rank), so ranks draw independent masks and the probes below can replay them.
    rank_rng = _rank_rng(case, backend, device, spec, rank)

    # 3. first step, agreed; 4. the rest (exceptions escape: the pool rebuilds the group)
    try:
        if rank_rng is not None:
            rank_rng.restore()
        ctx = run_forward(probe=True)
    except Unsupported as exc:
        return record("unsupported", str(exc))
    except PeerFailed as exc:
        return record("error", str(exc))
    # A forward-only case (``backward: false``) asks for no gradient: none is computed,
    # gathered, judged or timed, and a forward-only backend is never asked for one.
    grads = run_backward(ctx) if case.backward else None
    sync(device)
    full = _gather(comm, case, shard, ctx.out, grads)
    if options.accuracy:  # the lse every rank's calls returned, judged whole (check "lse")
        lse = _gather_lse(comm, case, shard, getattr(ctx, "lse", None))
        if full is not None and lse is not None:
            full["lse"] = lse
    parts = None
    if rank_rng is not None and options.accuracy and _probe_fits(case):
        parts = _mask_parts(case, comm, shard, algo, backend, local, spec, v, rank_rng)
    timing = None
    if options.timing.enabled:
        timing = time_case(case, device, run_forward,
                           (lambda: run_backward(ctx)) if case.backward else None, options.timing,
                           peaks=device_peaks(device, case.dtype), ranks=comm,
                           world_size=case.world_size, note=world.timing_note)
    if rank != 0:
        return None

    # 5. rank 0: accuracy and parity of the whole result
    if not options.accuracy:
        judgement = timed_only(full["out"], [full[t] for t in ("dq", "dk", "dv")]
                               if case.backward else None)
        return record(judgement.verdict, judgement.reason, timing=timing,
                      **judgement.record_fields())
    try:
        judgement = evaluate_parallel(case, backend, q, k, v, dout, full, parts)
    except Exception as exc:  # the checks' own failure (say, OOM in the single-device run)
        if is_oom(exc):
            return make.exception("error", exc, "evaluating the gathered result: ",
                                  timing=timing)
        _, reason = blame(exc, backend, _own(algo))
        return make("error", "evaluating the gathered result: " + reason, timing=timing,
                    crash=handled_crash())
    return record(judgement.verdict, judgement.reason, timing=timing,
                  **judgement.record_fields())


# -- gathering -----------------------------------------------------------------------------------


def _gather(comm: Comm, case: Case, shard: Shard, out: torch.Tensor, grads) -> Optional[dict]:
    """Full out/dq/dk/dv on rank 0 (None elsewhere), in the case's dtype, from every rank's
    local parts: one flat message per rank. ``grads`` None (forward only): out alone."""
    dtype = out.dtype
    parts = [out, *(g.to(dtype) for g in grads or ())]
    # Uneven packed chunks: every rank's message padded to the largest one's size.
    size = max(sum(s.numel() for s in
                   _local_shapes(case, Shard.of(case, *divmod(r, case.tp)))[:len(parts)])
               for r in range(case.world_size))
    flat = torch.cat([p.reshape(-1) for p in parts])
    gathered = comm.gather_to_first(torch.cat([flat, flat.new_zeros(size - flat.numel())]))
    if gathered is None:
        return None
    b, sq, sk = case.tensor_batch, case.seqlen_q, case.seqlen_kv  # a pack is one buffer
    full = {
        "out": out.new_empty(b, case.heads_q, sq, case.head_dim_v),
        "dq": out.new_empty(b, case.heads_q, sq, case.head_dim),
        "dk": out.new_empty(b, case.heads_kv, sk, case.head_dim),
        "dv": out.new_empty(b, case.heads_kv, sk, case.head_dim_v),
    }
    if grads is None:
        full = {"out": full["out"]}
    for r, flat in enumerate(gathered):
        cp_rank, tp_rank = divmod(r, case.tp)
        theirs = Shard.of(case, cp_rank, tp_rank)
        pieces, at = [], 0
        for shape in _local_shapes(case, theirs)[:len(parts)]:
            n = shape.numel()
            pieces.append(flat[at:at + n].view(shape))
            at += n
        theirs.place_q(full["out"], pieces[0])
        if grads is not None:
            theirs.place_q(full["dq"], pieces[1])
            theirs.place_kv(full["dk"], pieces[2])  # MQA: every TP rank holds the same sum
            theirs.place_kv(full["dv"], pieces[3])
    return full


def _gather_lse(comm: Comm, case: Case, shard: Shard,
                lse: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The whole log-sum-exp (B, Hq, Sq) float32 on rank 0 when every rank's calls returned
    one (None elsewhere, or when one did not): a flag, then the local rows, padded to the
    largest rank's (uneven packed chunks) -- every rank sends, so none waits on another's
    choice."""
    def rows(theirs: Shard) -> int:
        return case.tensor_batch * theirs.heads.q_count * theirs.local_length("q")

    size = 1 + max(rows(Shard.of(case, *divmod(r, case.tp))) for r in range(case.world_size))
    message = torch.zeros(size, dtype=torch.float32, device=comm.device)
    if lse is not None:
        message[0] = 1.0
        message[1:1 + lse.numel()] = lse.detach().float().reshape(-1)
    gathered = comm.gather_to_first(message)
    if gathered is None or not all(m[0].item() == 1.0 for m in gathered):
        return None
    b, sq = case.tensor_batch, case.seqlen_q
    full = gathered[0].new_empty(b, case.heads_q, sq, 1)
    for r, flat in enumerate(gathered):
        theirs = Shard.of(case, *divmod(r, case.tp))
        local = flat[1:1 + rows(theirs)].view(b, theirs.heads.q_count,
                                              theirs.local_length("q"), 1)
        theirs.place_q(full, local)
    return full[..., 0]


def _local_shapes(case: Case, shard: Shard) -> list[torch.Size]:
    """Shapes of a rank's local out, dq, dk, dv."""
    b, h = case.tensor_batch, shard.heads
    sq, sk = shard.local_length("q"), shard.local_length("kv")
    return [torch.Size(s) for s in ((b, h.q_count, sq, case.head_dim_v),
                                    (b, h.q_count, sq, case.head_dim),
                                    (b, h.kv_count, sk, case.head_dim),
                                    (b, h.kv_count, sk, case.head_dim_v))]


# -- a hidden mask, probed on the ranks ---------------------------------------------------------


def _rank_rng(case: Case, backend, device, spec: AttnSpec, rank: int) -> Optional[RngState]:
    """This rank's generator state for a hidden-mask dropout case (None otherwise, or where the
    device has no generator :mod:`attnbench.accuracy.rng` knows)."""
    if spec.dropout_p <= 0 or Capabilities.of(backend).keep_mask is not None:
        return None
    try:
        return RngState.for_call(device, spec.dropout_seed, rank)
    except NotImplementedError:
        return None


def _probe_fits(case: Case) -> bool:
    """The single-device probe's limits (decided alike on every rank)."""
    entries = case.tensor_batch * case.heads_q * case.seqlen_q * case.seqlen_kv
    calls = -(-case.seqlen_kv // case.head_dim_v)
    return entries <= PROBE_ENTRY_LIMIT and 2 * calls <= PROBE_CALL_LIMIT


def _mask_parts(case: Case, comm: Comm, shard: Shard, algo, backend, local, spec: AttnSpec,
                v: torch.Tensor, rank_rng: RngState) -> Optional[MaskParts]:
    """The split run's P * keep / (1 - p), read through the split itself: V replaced by
    identity columns (:func:`attnbench.accuracy.dropout_exact.identity_columns`), Dv keys a
    call, every rank under the state it drew the judged forward with; gathered on rank 0
    (None elsewhere). Every rank makes the same calls. Cost: ceil(Sk / Dv) split forwards."""
    dv, sk = case.head_dim_v, case.seqlen_kv
    found = None
    for start in range(0, sk, dv):
        keys = torch.arange(start, min(sk, start + dv), device=v.device)
        rank_rng.restore()
        out = algo.forward(backend, comm, shard, local[0], local[1],
                           shard.slice_kv(identity_columns(v, keys)), spec).out
        full = _gather(comm, case, shard, out, None)
        if full is not None:
            if found is None:
                found = full["out"].new_zeros(*full["out"].shape[:3], sk)
            found[..., keys] = full["out"][..., :len(keys)]
    return MaskParts(found, *_cp_layout(case)) if found is not None else None


def _cp_layout(case: Case):
    """The CP chunks of a case (every rank's query and key segments) as ``MaskParts`` ranges."""
    shards = [Shard.of(case, c, 0) for c in range(case.cp)]
    return cp_parts([s.q_segments for s in shards], [s.kv_segments for s in shards])


# -- checks (rank 0) -----------------------------------------------------------------------------


def _single_backward(case: Case, backend, fwd, q, k, v, dout, spec: AttnSpec):
    """The single-device gradients parity compares with: the same backend running the same
    backward as the split. A ring (ours, a selftest mutant's) computes each block's gradients
    with the backend's ``backward_from_stats`` (flash-style: the softmax gradient from the
    final output and log-sum-exp, D = rowsum(dO * O)), whose rounding is not its
    ``backward``'s: with an attention sink, naive's bf16 dQ is 0.0134 from fp64 through
    autograd and 0.0417 through its stats on one device, so a correct ring missed a bound
    built from the first."""
    stats = Capabilities.of(backend).backward_from_stats
    if case.ring_split and stats is not None and fwd.lse is not None:
        return stats(q, k, v, fwd.out, fwd.lse, dout, spec)
    return backend.backward(fwd.ctx, dout)


def evaluate_parallel(case: Case, backend, q, k, v, dout, full: dict,
                      mask_parts: Optional[MaskParts] = None) -> Judgement:
    """The usual accuracy checks on the gathered tensors, plus parity against the same backend
    at CP = 1, TP = 1 on the same inputs. ``mask_parts``: the split run's hidden keep mask as
    its ranks probed it (:func:`_mask_parts`)."""
    spec = AttnSpec.from_case(case)
    tensors = TENSORS if case.backward else ("out",)
    grads = tuple(full[t] for t in tensors[1:]) if case.backward else None
    judged_as = case
    if case.backend == "reference" and algorithm(case) is ring:
        # "fp64 rounded once" no longer describes a ring of the reference: its blocks' outputs
        # merge in float32 (fp32: ~1e-7 against a bound of 6e-8). Judge it like a
        # fused kernel instead, against the baseline.
        judged_as = case.replace(backend="reference (ring)")
    keep_mask = Capabilities.of(backend).keep_mask
    ref = None
    if spec.dropout_p == 0 or keep_mask is not None:
        out64, lse64 = reference_forward(q, k, v, spec, keep_mask=keep_mask)
        ref = dict(zip(tensors, (out64, *(reference_backward(
            q, k, v, out64, lse64, dout, spec, keep_mask=keep_mask) if case.backward else ()))))
    roundings = None
    if case.backend == "reference" and judged_as is case and case.backward:
        # Each rank rounds its partial dK/dV before the sum: not "rounded once" (a packed TP
        # case showed it first; dense MQA TP sat at 0.6 of that bound).
        roundings = reference_roundings(case, q, k, v, dout, out64, lse64, spec, keep_mask, ref,
                                        summed_partials(case, algorithm(case) is allgather))
    judgement = evaluate(judged_as, backend, spec, q, k, v, dout, full["out"], grads,
                         reference_roundings=roundings, lse=full.get("lse"),
                         mask_parts=mask_parts or MaskParts(None, *_cp_layout(case)))
    fwd = backend.forward(q, k, v, spec)
    single = dict(zip(tensors, (fwd.out, *(_single_backward(case, backend, fwd, q, k, v, dout,
                                                            spec) if case.backward else ()))))
    if ref is None:
        _, table = parity(full, single, None, case.dtype)
        return judgement.merged([], parity=table, parity_note=(
            "not judged: the backend does not expose its dropout mask, so the split run's "
            "masks need not be the single run's"))
    single_errors = {t: acc.tensor_errors(single[t], ref[t])["rel_l2"] for t in tensors}
    checks, table = parity(full, single, single_errors, case.dtype)
    return judgement.merged(checks, "parity: ", parity=table)
