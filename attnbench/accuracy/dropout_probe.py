"""Dropout judged for backends that hide their keep mask: recover the mask, or test statistics.

Legend: B = batch, Hq / Hkv = query / key-value heads, Sq / Sk = lengths, Dv = value head dim;
P = softmax probabilities (B, Hq, Sq, Sk) without dropout; keep = the kernel's keep mask;
u = unit roundoff of the case's dtype.

The output is linear in V. With V replaced by identity columns -- V_probe[..., j, c] = 1 iff
j = keys[c] -- output column c is (P * keep / (1 - p))[..., keys[c]]: the kernel's own dropped
probabilities, read through its own forward at the case's shapes (so the same kernel path runs).

Hidden-mask kernels draw their mask from the device's default generator: on CPU torch's generator
(SDPA's math path, ``bernoulli_``); on CUDA the Philox seed and offset that flash-attn, cuDNN,
SDPA's fused kernels and xformers read from ``torch.cuda``'s generator. The mask is a function of
that state and of the shapes (B, H, Sq, Sk) only, not of V's values. So a probe with the same q,
k and shapes, run under the state captured right before the judged forward (:class:`RngState`),
draws the judged forward's mask. That is checked, not assumed: see ``recovered-mask`` below.

:func:`judge_dropout` uses the first method that applies:

``recovered-mask``  with a captured state -- or without one (CP/TP) for a mask that follows
    the spec's ``dropout_seed`` instead of the generator, as a kernel handed a seed draws it --
    B * Hq * Sq * Sk <= PROBE_ENTRY_LIMIT and 2 * ceil(Sk / Dv) <= PROBE_CALL_LIMIT. Probe every
    key in chunks of Dv (the last chunk padded with zero columns), each call under the restored
    state (no state: under two different seeded ones, see :meth:`_Judge.replay_states`); probe
    again with the keys in reverse order (every call then sees other V values). The two masks
    must agree exactly, and the judged output must equal probe @ V to rounding. Then the recovered mask is a
    :data:`KeepMaskFn` for the exact fp64 reference, which judges out, dQ, dK, dV as for a
    backend that exposes its mask; the keep rate, the kept-entry scale and the row-sum variance
    are checked from the probe at no extra cost.
    One more call, an independent draw, must change the mask (``mask_unchanged_by_redraw``).
    Cost: 2 * ceil(Sk / Dv) + 1 forward calls.
    Under CP/TP (``split``) there is no captured state: a mask that follows the seed is
    replayed on one device as above, and must be the one the ranks drew -- else
    ``ranks_mask_replay`` fails ("ranks-mask-mismatch"); the split run's own probe
    (``mask_parts``: every rank probed under its :meth:`RngState.for_call` state) recovers a
    generator-driven mask, or the mismatching one, so the reference still judges.
    Every recovered mask's independence is checked (:mod:`.dropout_independence`).
``statistics``  when the mask is not reproducible or not replayable, or the case is
    larger. Needs no replay: one identity-column probe of Dv keys spread over Sk (keep rate,
    kept-entry scale) and one redraw of it, then UNBIASED_RUNS calls, each under its own
    seeded RNG state *and* its own ``dropout_seed`` (independent draws for both kinds of hidden
    mask), with the case's V whose last column is ones (row-sum variance from that column; the mean output
    against the fp64 no-dropout output). Cost: UNBIASED_RUNS + 2 forward calls, plus fp64 work
    of about three reference forwards; O(S * D) memory at any length.

What each check sees (p = dropout probability):

* keep rate within KEEP_RATE_SIGMAS binomial sigmas of 1 - p: keeping with probability p;
* kept entries / fp64 P = 1 / (1 - p) to rounding: a wrong scale;
* row-sum variance: sum_j (P * keep / (1 - p))_ij varies around 1 with variance
  p / (1 - p) * sum_j P_ij^2 (exact, from fp64 P); a forward that renormalises over the kept keys
  has row sums of exactly 1, to its own rounding (the renormalising mutant: caught 4.5 x in
  bf16 with 65536 keys; a kernel rounding its row sums as coarsely as their dropout spread,
  ~0.33 / sqrt(keys that matter), would hide);
* unbiasedness: the mean of N outputs minus the fp64 no-dropout output, against its standard
  error from fp64 P: a wrong keep rate or scale biases the mean (by 1 - p / (1 - p), 89% of
  |out| at p = 0.1, for keeping with probability p; by p for a scale of 1). Biases below the
  dtype's absolute out bound (bf16 4%, fp16 0.5%) are left to the reference. Also fails a
  kernel whose mask never changes between calls (its mean does not converge), a bug of its
  own.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from attnbench.accuracy.bounds import ABSOLUTE_BOUND, Check
from attnbench.accuracy.dropout_independence import (MaskParts, exposed_keep,
                                                     independence_check)
from attnbench.accuracy.dropout_exact import ExactCall, identity_columns, visible_floor
from attnbench.accuracy.rng import RngState
from attnbench.backends.capabilities import Capabilities
from attnbench.problem.attn_spec import AttnSpec, KeepMaskFn
from attnbench.problem.fp8 import torch_dtype

F64 = torch.float64

PROBE_ENTRY_LIMIT = 1 << 20
"""Largest B * Hq * Sq * Sk probed key by key: the cost grows as Sk^2 (2 Sk / Dv calls, each
as large as the case), statistics' stays at UNBIASED_RUNS + 1 calls. Measured on 2 shared CPU
cores (sdpa fp32, B 1, Hq 4, D = Dv 32): Sq = Sk = 128, 8 calls, 0.3-0.5 s with the fp64 P;
Sq = Sk = 512 (the limit), 32 calls, 2.6 s (statistics: 1.1 s); Sq = Sk = 1024 would take 64
calls and 18 s. Memory at the limit: fp64 P, two probes in the dtype, masks, ~20 MiB. The
limit covers every dropout case of sweeps/standard.yaml (at most 165k entries); it is not
raised on GPUs, so a case gets the same method on every machine."""

PROBE_CALL_LIMIT = 64
"""Most probe calls (2 * ceil(Sk / Dv)): with few queries many keys stay under the entry limit,
but tens of thousands of small calls would not be cheap (Sk <= 32 Dv: 1024 keys at Dv = 32)."""

KEEP_RATE_SIGMAS = 5.0
"""Binomial sigmas around 1 - p: a false alarm once in ~1.7 million correct cases."""

ROW_SUM_SIGMAS = 5.0
"""Sigmas of the row-sum variance ratio (near-Gaussian: a weighted mean over hundreds of rows)."""
BIAS_SIGMAS = 5.0
"""Sigmas of the squared mean bias. The check compares the bias itself, so a correct kernel at
value / bound = r sits at about 5 r^2 sigmas when the dtype allowance is small."""
UNBIASED_RUNS = 8
"""Outputs averaged for unbiasedness. With p = 0.1, 8 runs put the standard error of the mean at
~12% of |out| per row; over a few hundred rows the bias is then resolved to ~2% of |out|."""

KEPT_SCALE_ROUNDINGS = 4.0
"""Kept entries / fp64 P must be 1 / (1 - p) within this many u (ratio of sums over the kept
entries). A correct kernel misses by its P's rounding and by 1 / (1 - p) rounded to the dtype
(naive multiplies by (keep / (1 - p)).to(dtype)). Seen for sdpa and the torch-RNG control
(fp32 / fp16 / bf16, p 0.1 / 0.3, MHA / GQA / MQA, masks, ALiBi, Sq != Sk, normal / large_logits
/ outliers, 2 seeds): at most 1.7 u fp32, 0.9 u bf16, 0.5 u fp16. A scale of 1 instead of
1 / (1 - p) is off by p: 26 u in bf16 at p = 0.1."""

REPLAY_ROUNDINGS = 8.0
"""The judged output must equal probe @ V within this many u (relative L2). Seen for correct
kernels (the same sweep): at most 3.5 u fp32, 0.7 u fp16 and bf16. Another mask instead of the
judged one misses by ~sqrt(2 p / (1 - p)): seen 0.48 at p = 0.1, 0.14 at p = 0.01 (bf16's
8 u = 0.031 is reached near p = 0.0005)."""

SEED_REPLAY_STATES = (0x5EED, 0xD1CE)
"""Generator seeds of the two probe passes when no state was captured: any two different ones
(a mask that still agrees between them does not come from the generator)."""

_DTYPE_NAMES = {torch_dtype(name): name for name in ABSOLUTE_BOUND}


# -- the recovered mask, as the reference wants it -----------------------------------------------


class RecoveredKeepMask:
    """A :data:`KeepMaskFn` over one call's recovered mask ``keep`` (B, Hq, Sq, Sk), indexed by
    global batch / head / query / key positions (``origin`` places the call in the problem).

    Entries whose fp64 P is too small to be seen in the dtype (below :func:`visible_floor`) and
    that came out 0 are unknown and set to kept: each carries under 1e-6 of its row's
    probability in fp16 and under 2e-37 in bf16 / fp32, so all of them together move a row by
    less than Sk * p times that."""

    def __init__(self, keep: torch.Tensor, origin: AttnSpec):
        self.keep = keep
        self.origin = origin

    def __call__(self, spec: AttnSpec, b: torch.Tensor, h: torch.Tensor, i: torch.Tensor,
                 j: torch.Tensor) -> torch.Tensor:
        o, dev = self.origin, self.keep.device
        if o.is_packed:
            return torch.cat([self.document(int(n), h, i, j) for n in b], 0).to(b.device)
        keep = self.keep.index_select(0, (b - o.batch_start).to(dev))
        keep = keep.index_select(1, (h - o.head_start).to(dev))
        keep = keep.index_select(2, (i - o.q_start).to(dev))
        return keep.index_select(3, (j - o.kv_start).to(dev)).to(b.device)

    def document(self, doc: int, h: torch.Tensor, i: torch.Tensor,
                 j: torch.Tensor) -> torch.Tensor:
        """(1, len(h), len(i), len(j)) of a pack's document ``doc`` (its batch index, as
        :func:`attnbench.problem.packing.sequence_spec` numbers it), at positions i, j within
        that document: the pack holds them at rows cu_q[n] + i - seq_q_start[n] of its one
        batch row (keys likewise), n = doc - batch_start."""
        o, dev = self.origin, self.keep.device
        n = doc - o.batch_start
        row0 = o.cu_seqlens_q[n] - (o.seq_q_start[n] if o.seq_q_start else 0)
        col0 = o.cu_seqlens_kv[n] - (o.seq_kv_start[n] if o.seq_kv_start else 0)
        keep = self.keep[:1].index_select(1, (h - o.head_start).to(dev))
        keep = keep.index_select(2, (i + row0).to(dev))
        return keep.index_select(3, (j + col0).to(dev))

    def __repr__(self) -> str:
        return f"RecoveredKeepMask({tuple(self.keep.shape)}, kept {self.keep.float().mean():.4f})"


# -- the judgement -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DropoutJudgement:
    method: str
    """``recovered-mask`` | ``statistics`` | ``exposed-mask`` (independence only) |
    ``none: <why>``."""
    checks: tuple[Check, ...] = ()
    """check="dropout" (and "dropout_independence", "ranks_mask_replay"), tensor="out"; the
    harness appends them to the case's checks."""
    keep_mask: Optional[KeepMaskFn] = None
    """The recovered mask (``recovered-mask`` only): pass it to the fp64 reference."""
    forward_calls: int = 0
    """Extra forward calls made to judge."""
    seconds: float = 0.0
    details: dict = field(default_factory=dict)
    """Measured values (keep rate, replay error, mask agreement) and why recovery was not used."""

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def to_dict(self) -> dict:
        """The record's ``accuracy["dropout"]`` section (JSON: non-finite values become None)."""
        details = {name: None if isinstance(value, float) and not math.isfinite(value) else value
                   for name, value in self.details.items()}
        return {"method": self.method, "forward_calls": self.forward_calls,
                "seconds": round(self.seconds, 4), **details}


def judge_dropout(backend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttnSpec,
                  out: torch.Tensor, rng: Optional[RngState], *,
                  force_statistics: bool = False, split: bool = False,
                  mask_parts: Optional[MaskParts] = None) -> DropoutJudgement:
    """Judge the forward dropout of ``backend`` on one call: q (B, Hq, Sq, D), k (B, Hkv, Sk, D),
    v (B, Hkv, Sk, Dv) and the judged ``out`` (B, Hq, Sq, Dv), made under ``rng`` (None: no
    replay possible, statistics only).

    ``split``: ``out`` was gathered from a CP/TP run; a mask that replays by seed on one device
    must then be the one its ranks drew (else ``ranks_mask_replay`` fails). ``mask_parts``: the
    split run's own probe (:class:`MaskParts`), recovering its mask where one device cannot."""
    if spec.dropout_p <= 0:
        return DropoutJudgement("none: no dropout")
    if spec.dropout_p >= 1:
        return DropoutJudgement("none: dropout_p >= 1 drops every probability")
    exposed = Capabilities.of(backend).keep_mask
    if exposed is not None:
        return _exposed(exposed, q, k, v, spec, mask_parts)
    return _Judge(backend, q, k, v, spec, out, rng, split, mask_parts).run(force_statistics)


def _exposed(keep_mask, q, k, v, spec: AttnSpec, parts: Optional[MaskParts]) -> DropoutJudgement:
    """An exposed mask: the exact reference judges with it; only its independence is left to
    check (:mod:`.dropout_independence`), where the case is small enough to hold P."""
    batch, heads_q, sq, _ = q.shape
    entries = batch * heads_q * sq * k.shape[2]
    if entries > PROBE_ENTRY_LIMIT:
        return DropoutJudgement("none: the backend exposes its keep mask; the exact reference "
                                f"applies (B*Hq*Sq*Sk = {entries} > PROBE_ENTRY_LIMIT: "
                                "independence not checked)")
    started, details = time.perf_counter(), {}
    p_all = ExactCall(q, k, v, spec).probabilities()
    keep = exposed_keep(keep_mask, spec, p_all.shape, q.device)
    check = independence_check(keep, p_all > 0, spec, k.shape[1], parts=parts, details=details)
    return DropoutJudgement("exposed-mask", (check,), None, 0, time.perf_counter() - started,
                            details)


class _Judge:
    """One judgement: recovery where it applies and validates, else statistics. Counts the
    extra forward calls; leaves the device's generator as it found it."""

    def __init__(self, backend, q, k, v, spec, out, rng, split=False, parts=None):
        self.backend, self.q, self.k, self.v, self.spec, self.out = backend, q, k, v, spec, out
        self.rng, self.split, self.parts = rng, split, parts
        self.p = spec.dropout_p
        self.u = torch.finfo(q.dtype).eps / 2
        self.calls = 0
        self.details: dict[str, Any] = {}

    def run(self, force_statistics: bool) -> DropoutJudgement:
        started = time.perf_counter()
        batch, heads_q, sq, _ = self.q.shape
        entries = batch * heads_q * sq * self.k.shape[2]
        calls = 2 * -(-self.k.shape[2] // self.v.shape[-1])
        if force_statistics:
            why = "statistics forced"
        elif entries > PROBE_ENTRY_LIMIT:
            why = f"B*Hq*Sq*Sk = {entries} > PROBE_ENTRY_LIMIT = {PROBE_ENTRY_LIMIT}"
        elif calls > PROBE_CALL_LIMIT:
            why = f"2 * ceil(Sk / Dv) = {calls} probe calls > PROBE_CALL_LIMIT = {PROBE_CALL_LIMIT}"
        else:
            why = None
        checks = []
        if why is None:
            keep, checks, why = self.recover()
            if keep is not None:
                return DropoutJudgement("recovered-mask", tuple(checks),
                                        RecoveredKeepMask(keep, self.spec), self.calls,
                                        time.perf_counter() - started, self.details)
        self.details["why_not_recovered"] = why
        checks = [*checks, *self.statistics()]  # a ranks_mask_replay failure stays
        return DropoutJudgement("statistics", tuple(checks), None, self.calls,
                                time.perf_counter() - started, self.details)

    # -- calls ---------------------------------------------------------------------------------
    def forward(self, v_probe: torch.Tensor, state: Optional[RngState],
                spec: Optional[AttnSpec] = None) -> torch.Tensor:
        self.calls += 1
        with state.replayed() if state is not None else contextlib.nullcontext():
            return self.backend.forward(self.q, self.k, v_probe, spec or self.spec).out

    def state(self, seed: int) -> Optional[RngState]:
        """The generator state ``manual_seed(seed)`` gives (None where the device has no
        generator this module knows: the calls then draw whatever comes)."""
        try:
            return RngState.seeded(self.q.device, seed)
        except NotImplementedError:
            return None

    def draw(self, n: int) -> tuple[Optional[RngState], AttnSpec]:
        """Statistics call ``n``: an independent draw for either kind of hidden mask -- its own
        generator state (torch-RNG kernels) and its own ``dropout_seed`` (kernels that take the
        seed they are handed), both derived from the case's seed, so a rerun draws the same
        masks. The harness owns the seed (:mod:`attnbench.backends.base`)."""
        seed = (self.spec.dropout_seed + 7919 * (n + 1)) & 0x7FFFFFFF
        return self.state(seed), self.spec.replace(dropout_seed=seed)

    def probe_pass(self, order: torch.Tensor, state: Optional[RngState]) -> torch.Tensor:
        """P * keep / (1 - p) as the kernel computes it, (B, Hq, Sq, Sk) in the dtype, from
        ceil(Sk / Dv) calls under ``state`` and the judged spec, keys in ``order``."""
        dv = self.v.shape[-1]
        found = self.out.new_zeros(*self.out.shape[:3], self.k.shape[2])
        for start in range(0, len(order), dv):
            keys = order[start:start + dv]
            found[..., keys] = self.forward(identity_columns(self.v, keys), state)[
                ..., :len(keys)]
        return found

    # -- recovered-mask ------------------------------------------------------------------------
    def replay_states(self, keys: torch.Tensor) -> tuple[tuple, str]:
        """The generator states of the two probe passes, or ((), why there is no replay).

        With a state captured before the judged forward, both passes run under it: a
        torch-RNG kernel draws the judged mask again, a seeded kernel draws it from the spec.
        Without one (a CP/TP case: its ranks drew from their own generators), only a mask that
        follows the spec's seed can be replayed: the passes run under two *different* states,
        so their agreement proves the mask ignores the generator. One call of the first keys
        under each state first: a generator-driven mask differs there, and statistics take
        over after 2 calls instead of 2 * ceil(Sk / Dv)."""
        if self.rng is not None:
            self.details["replayed_by"] = "rng-state"
            return (self.rng, self.rng), ""
        states = (self.state(SEED_REPLAY_STATES[0]), self.state(SEED_REPLAY_STATES[1]))
        head = keys[:self.v.shape[-1]]
        a, b = (self.forward(identity_columns(self.v, head), s) != 0 for s in states)
        if not torch.equal(a, b):
            return (), ("no RNG state captured before the judged forward, and the mask follows "
                        "the generator's state, not the spec's dropout_seed")
        self.details["replayed_by"] = "seed"
        return states, ""

    def recover(self) -> tuple[Optional[torch.Tensor], list[Check], str]:
        """(keep mask, checks, "") when the mask is recovered and validated, else
        (None, checks that failed on the way -- ``ranks_mask_replay`` --, why not)."""
        sk = self.k.shape[2]
        keys = torch.arange(sk, device=self.q.device)
        p_all = ExactCall(self.q, self.k, self.v, self.spec).probabilities()
        visible = p_all >= visible_floor(self.q.dtype)
        self.details.update(probe_entries=int(visible.numel()), probe_visible=int(visible.sum()))
        first, why, failed = self.replay_one_device(keys, visible)
        if first is None and self.parts is not None and self.parts.probe is not None:
            first, why_parts = self.replay_parts()
            why = f"{why}; {why_parts}" if why and why_parts else why or why_parts
        if first is None:
            return None, failed, why
        keep = (first != 0) | ~visible
        checks = failed + _entry_checks(first, p_all, self.p, self.u, self.details)
        row_p2, row_p4 = (p_all * p_all).sum(-1), (p_all ** 4).sum(-1)
        checks.append(_row_sum_check(first.to(F64).sum(-1)[None], row_p2, row_p4, self.p,
                                     self.details))
        checks.append(independence_check(first != 0, visible, self.spec, self.k.shape[1],
                                         parts=self.parts, details=self.details))
        spread = self.spread_keys()  # the first keys may be hidden (a window's far end)
        checks.append(self.redraw_check(spread, first[..., spread], p_all[..., spread]))
        return keep, checks, ""

    def replay_one_device(self, keys: torch.Tensor, visible: torch.Tensor
                          ) -> tuple[Optional[torch.Tensor], str, list[Check]]:
        """(the judged forward's probe, "", []) from single-device probes, else (None, why,
        failed checks). A split run whose mask replays by seed on one device but whose output
        is not that mask @ V drew other masks on its ranks: ``ranks_mask_replay`` fails (a
        correct kernel keyed by global positions draws the single-device mask on every rank)."""
        states, why = self.replay_states(keys)
        if not states:
            return None, why, []
        first = self.probe_pass(keys, states[0])
        second = self.probe_pass(keys.flip(0), states[1])
        differ = int(((first != 0) != (second != 0))[visible].sum())
        self.details.update(probe_mask_mismatches=differ)
        if differ:
            return None, (f"not reproducible: {differ} of {int(visible.sum())} mask entries "
                          f"differ between two probes under the same RNG state"), []
        replay = _rel_l2(self.out, _apply(first, self.v))
        bound = REPLAY_ROUNDINGS * self.u
        self.details.update(replay_rel_l2=replay, replay_bound=bound)
        if replay <= bound:
            return first, "", []
        if self.split and self.details.get("replayed_by") == "seed":
            check = Check("ranks_mask_replay", "out", "rel_l2", replay, bound, False,
                          f"ranks-mask-mismatch: the mask replays by dropout_seed on one "
                          f"device, but the CP/TP output is not that mask @ V: its ranks drew "
                          f"other masks (positions not global, or a rank's own seed)")
            return None, "ranks-mask-mismatch", [check]
        return None, (f"the judged output is not probe @ V (rel. L2 {replay:.3g} > "
                      f"{bound:.3g}): the judged forward drew another mask"), []

    def replay_parts(self) -> tuple[Optional[torch.Tensor], str]:
        """The split run's own probe (:class:`MaskParts`: its ranks under the states they drew
        the judged forward with), if the judged output is that probe @ V."""
        probe = self.parts.probe
        replay = _rel_l2(self.out, _apply(probe, self.v))
        bound = REPLAY_ROUNDINGS * self.u
        self.details.update(parts_replay_rel_l2=replay)
        if not replay <= bound:
            return None, (f"the split run's output is not its ranks' probe @ V (rel. L2 "
                          f"{replay:.3g} > {bound:.3g}): not reproducible under its ranks' "
                          "generator states")
        self.details["replayed_by"] = "rank-states"
        return probe, ""

    def spread_keys(self) -> torch.Tensor:
        """Up to Dv keys spread evenly over Sk (one identity-column call reads them all)."""
        sk, dv = self.k.shape[2], self.v.shape[-1]
        keys = torch.linspace(0, sk - 1, min(dv, sk), device=self.q.device).round().long()
        return keys.unique()

    def redraw_check(self, keys: torch.Tensor, probe: torch.Tensor,
                     p_cols: torch.Tensor) -> Check:
        """One more identity-column call of ``keys`` as an independent draw (another generator
        state and another ``dropout_seed``, :meth:`draw`): its mask must differ from
        ``probe``'s (B, Hq, Sq, len(keys); fp64 P of those columns ``p_cols``) as two
        independent masks do. They agree on a visible entry with probability
        a = p^2 + (1 - p)^2; a mask that ignores both (a seed read from the wrong place,
        xformers#173; a seed taken from a pointer, vllm#55009: the same mask at every step)
        agrees everywhere. Value: agreement in excess of a; bound: KEEP_RATE_SIGMAS binomial
        sigmas. One mask alone is a fine draw: without this a recovered mask passes that bug,
        and statistics see it only as a mean that converges slowly (1.07 x its bound)."""
        other = self.forward(identity_columns(self.v, keys), *self.draw(UNBIASED_RUNS + 1))
        visible = p_cols >= visible_floor(self.q.dtype)
        same = ((other[..., :len(keys)] != 0) == (probe != 0))[visible]
        n, expected = same.numel(), self.p ** 2 + (1 - self.p) ** 2
        if not n:
            return _check("mask_unchanged_by_redraw", 0.0, 0.0, "no visible entry to compare")
        agree = same.double().mean().item()
        sigma = math.sqrt(expected * (1 - expected) / n)
        self.details.update(redraw_agreement=agree)
        return _check("mask_unchanged_by_redraw", max(0.0, agree - expected),
                      KEEP_RATE_SIGMAS * sigma,
                      f"an independent draw (another seed and generator state) kept the same "
                      f"{agree:.4f} of {n} visible entries, expected {expected:.4f} "
                      f"+- {KEEP_RATE_SIGMAS:g} sigma")

    # -- statistics ----------------------------------------------------------------------------
    def statistics(self) -> list[Check]:
        keys = self.spread_keys()
        # The case's V with its last column replaced by ones: every run then also gives the
        # row sums of P * keep / (1 - p), and the fp64 quantities are those of this V.
        v_runs = self.v.clone()
        v_runs[..., -1] = 1
        exact = ExactCall(self.q, self.k, v_runs, self.spec)
        probe = self.forward(identity_columns(self.v, keys), *self.draw(0))[..., :len(keys)]
        p_cols = exact.columns(keys)
        checks = _entry_checks(probe, p_cols, self.p, self.u, self.details)
        checks.append(self.redraw_check(keys, probe, p_cols))
        # the probed columns of every batch row and head: enough to see a mask they share
        visible = p_cols >= visible_floor(self.q.dtype)
        checks.append(independence_check(probe != 0, visible, self.spec, self.k.shape[1],
                                         documents=False, details=self.details))
        row_p2, row_p4, p2v2 = exact.moments()
        runs = [self.forward(v_runs, *self.draw(1 + n)) for n in range(UNBIASED_RUNS)]
        row_sums = torch.stack([run[..., -1] for run in runs]).to(F64)
        checks.append(_row_sum_check(row_sums, row_p2, row_p4, self.p, self.details))
        checks.append(_bias_check(runs, exact.solution[0], p2v2, self.p, self.q.dtype,
                                  self.details))
        return checks


def _apply(probs: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """probs (B, Hq, Sq, Sk) @ v (B, Hkv, Sk, Dv) in fp64, GQA groups contiguous."""
    batch, heads_q, sq, sk = probs.shape
    heads_kv = v.shape[1]
    out = torch.matmul(probs.to(F64).view(batch, heads_kv, heads_q // heads_kv, sq, sk),
                       v.to(F64).unsqueeze(2))
    return out.view(batch, heads_q, sq, -1)


def _rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    ref_norm = ref.norm().item()
    err = (x.to(F64) - ref).norm().item()
    return err / ref_norm if ref_norm > 0 else err


# -- checks --------------------------------------------------------------------------------------


def _check(metric: str, value: float, bound: float, note: str) -> Check:
    passed = math.isfinite(value) and value <= bound
    return Check("dropout", "out", metric, value, bound, passed, note)


def _entry_checks(probe: torch.Tensor, p_exact: torch.Tensor, p: float, u: float,
                  details: dict) -> list[Check]:
    """Keep rate, kept-entry scale and masked keys from probed entries (B, Hq, Sq, n) of
    P * keep / (1 - p) and their fp64 P."""
    visible = p_exact >= visible_floor(probe.dtype)
    kept = probe != 0
    kept_visible = kept & visible
    n, n_kept = int(visible.sum()), int(kept_visible.sum())
    checks = []
    if n:
        rate = n_kept / n
        sigma = math.sqrt(p * (1 - p) / n)
        checks.append(_check("keep_rate_deviation", abs(rate - (1 - p)), KEEP_RATE_SIGMAS * sigma,
                             f"kept {n_kept} of {n} visible entries = {rate:.4f}, expected "
                             f"1 - p = {1 - p:.4f} +- {KEEP_RATE_SIGMAS:g} sigma"))
        details.update(keep_rate=rate, keep_rate_entries=n)
    if n_kept:
        scale = (probe.to(F64)[kept_visible].sum() / p_exact[kept_visible].sum()).item()
        checks.append(_check("kept_scale_deviation", abs(scale * (1 - p) - 1),
                             KEPT_SCALE_ROUNDINGS * u,
                             f"kept entries / fp64 P = {scale:.6g}, expected 1 / (1 - p) = "
                             f"{1 / (1 - p):.6g}"))
        details.update(kept_scale=scale)
    leaked = int((kept & (p_exact == 0)).sum())
    checks.append(_check("masked_keys_kept", float(leaked), 0.0,
                         "probe entries nonzero where the fp64 P is exactly 0 (masked keys)"))
    return checks


def _row_sum_check(row_sums: torch.Tensor, row_p2: torch.Tensor, row_p4: torch.Tensor,
                   p: float, details: dict) -> Check:
    """Row sums R_i of P * keep / (1 - p) from N independent runs (N, B, Hq, Sq), fp64.

    For a correct dropout R_i - 1 = sum_j P_ij e_j with e_j = keep_j / (1 - p) - 1 independent,
    E e = 0, E e^2 = var = p / (1 - p), E e^4 = m4 = p^4 / (1 - p)^3 + p. So r_i =
    (R_i - 1)^2 / (var * sum_j P_ij^2) has mean 1 and variance
    V_i = 2 + sum_j P^4 (m4 - 3 var^2) / (var * sum_j P^2)^2: 2 for diffuse rows, up to ~1/p
    for rows dominated by one key (r is then 0.11 or 9 at p = 0.1). A forward that renormalises
    over the kept keys has R_i = 1 exactly unless every key of the row is dropped: r_i ~ 0.
    Rows weighted by 1 / V_i and runs averaged: D = sum_i (mean_n r_in / V_i) / sum_i (1 / V_i)
    is 1 for a correct dropout, with sigma 1 / sqrt(N sum_i 1 / V_i). Value: the missing
    fraction 1 - D; rounding only adds variance, so a correct kernel sits at or below 0."""
    var = p / (1 - p)
    m4 = p ** 4 / (1 - p) ** 3 + p
    expected = var * row_p2
    rows = expected > 0  # rows that see at least one key
    if not bool(rows.any()):
        return _check("row_sum_variance_deficit", 0.0, 0.0, "no row sees a key")
    expected, row_p4 = expected[rows], row_p4[rows]
    ratio = ((row_sums[:, rows] - 1) ** 2).mean(0) / expected
    weight = 1.0 / (2.0 + row_p4 * (m4 - 3 * var ** 2) / expected ** 2)
    total = weight.sum().item()
    found = (weight * ratio).sum().item() / total
    sigma = 1.0 / math.sqrt(row_sums.shape[0] * total)
    details.update(row_sum_variance_ratio=found)
    return _check("row_sum_variance_deficit", max(0.0, 1.0 - found), ROW_SUM_SIGMAS * sigma,
                  f"row sums of P * keep / (1 - p) vary {found:.3g} x as much as a correct "
                  f"dropout's ({int(rows.sum())} rows x {row_sums.shape[0]} runs; 0: "
                  f"renormalised over kept keys)")


def _bias_check(runs: list[torch.Tensor], exact_out: torch.Tensor, p2v2: torch.Tensor, p: float,
                dtype: torch.dtype, details: dict) -> Check:
    """Mean of N outputs (B, Hq, Sq, Dv) under different RNG states against the fp64 no-dropout
    output. Per row i, A_i = |mean - exact|^2 has expectation E_i = p / (1 - p) *
    sum_j P^2 V^2 / N for a correct dropout, plus |bias_i|^2 for a biased one. Rows are
    independent (the columns of a row share its mask), so (sum A - sum E) / sum |exact|^2
    estimates the squared relative bias, with sigma ~ sqrt(sum (A_i - E_i)^2) / sum |exact|^2.
    Value: that relative bias (0 when the estimate is negative); bound: the dtype's absolute out
    bound (a correct kernel's own error, accuracy.ABSOLUTE_BOUND: smaller biases are the
    reference's business) plus BIAS_SIGMAS sigmas, added in squares."""
    n = len(runs)
    mean = torch.stack([r.to(F64) for r in runs]).mean(0)
    a = ((mean - exact_out) ** 2).sum(-1).flatten()
    e = (p / (1 - p) * p2v2.sum(-1) / n).flatten()
    scale = (exact_out ** 2).sum().item()
    if not scale:
        return _check("mean_bias", 0.0, 0.0, "no row sees a key")
    name = _DTYPE_NAMES.get(dtype)
    allowance = ABSOLUTE_BOUND[name]["out"] if name else 0.0
    bias_sq = (a.sum() - e.sum()).item() / scale
    sigma = math.sqrt(((a - e) ** 2).sum().item()) / scale
    bias = math.sqrt(max(bias_sq, 0.0))
    details.update(mean_bias=bias, mean_bias_runs=n,
                   mean_error_ratio=(a.sum() / e.sum()).item() if e.sum() > 0 else None)
    return _check("mean_bias", bias, math.sqrt(allowance ** 2 + BIAS_SIGMAS * sigma),
                  f"mean of {n} outputs vs fp64 no-dropout output, relative to |out|; squared "
                  f"error {details['mean_error_ratio'] or 0:.3g} x a correct dropout's "
                  f"({a.numel()} rows)")
