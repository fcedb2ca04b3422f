"""Dropout masks that should be independent are: batch rows, documents of a pack, heads, CP parts.

Legend: B = batch, Hq / Hkv = query / key-value heads, Sq / Sk = lengths; keep = a keep mask
(B, Hq, Sq, Sk) bool, as recovered from a hidden-mask kernel (:mod:`.dropout_probe`) or built
from an exposed one; visible = the entries whose fp64 P can be seen in the dtype (elsewhere the
mask is unknown or does not matter).

Each mask entry is an independent Bernoulli(1 - p) draw. Two masks drawn independently agree
on an entry with probability a = (1 - p)^2 + p^2; over n entries visible in both, the agreeing
fraction has mean a and variance a (1 - a) / n. A kernel that reuses one mask across batch rows
(the Philox offset not advanced per row), across heads (a head index left out of the counter;
or the KV head's used, so a GQA group shares one mask), across the documents of a pack (a
position within the document, no document index), or across CP ranks (each rank keys the mask
by its local positions) agrees on every entry.

Pairs compared (every pair, so a mask shared by two heads of eight shows as much as one shared
by all):

* batch rows b1 < b2, over (head, query, key);
* documents of a pack n1 < n2, over (head, query, key) within the document, aligned at the
  document's first query and key (a kernel keyed by positions within the document, without the
  document's index, repeats exactly there);
* query heads h1 < h2 -- within a GQA group too: heads that share a KV head still draw their
  own masks (the note says which pairs share one);
* CP parts: the blocks (query chunk, key chunk) of the CP layout, aligned at their first entry:
  a rank that draws from local positions repeats another rank's block.

Verdict: a pair fails when its agreement exceeds a by more than a Chernoff bound: the excess t
with n * KL(a + t || a) = ln(1 / FALSE_ALARM), KL the Bernoulli relative entropy, so a correct
kernel fails a given pair with probability below FALSE_ALARM = 1e-10 whatever n is (no normal
approximation). A case compares at most a few hundred pairs (32 heads: 496), so the odds of a
false alarm are under 5e-8 per case and 5e-5 over a sweep of a thousand dropout cases. For
large n the bound is ~6.8 binomial sigmas. Value: the worst pair's excess agreement; bound: its
Chernoff excess (value / bound is the margin). A pair with so few entries that even full
agreement would stay within the bound is not compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import torch

from attnbench.accuracy.bounds import Check
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.packing import per_sequence

FALSE_ALARM = 1e-10
"""Chance that one pair of independent masks fails (Chernoff, exact for any n)."""

_LOG_ODDS = math.log(1.0 / FALSE_ALARM)

Range = tuple[int, int]


@dataclass(frozen=True)
class MaskParts:
    """The keep-mask probe of a CP/TP run, gathered: what its ranks drew, with the layout.

    ``probe``: P * keep / (1 - p) (B, Hq, Sq, Sk) in the dtype, read through the split run
    itself (every rank's identity-column forwards under its own generator state,
    :meth:`attnbench.accuracy.rng.RngState.for_call`), placed at global rows, heads and keys.
    None: the layout alone (an exposed mask, or a case too large to probe).
    ``q_parts`` / ``kv_parts``: the rows (query side) and keys of each CP chunk, each part as
    its ranges in the tensors (dense: one range per chunk; packed CP: one per sequence's chunk).
    """

    probe: Optional[torch.Tensor]
    q_parts: tuple[Range, ...] = ()
    kv_parts: tuple[Range, ...] = ()


def expected_agreement(p: float) -> float:
    """Agreement of two independent Bernoulli(1 - p) masks on one entry."""
    return (1.0 - p) ** 2 + p ** 2


def chernoff_excess(n: int, a: float) -> float:
    """The excess t with n * KL(a + t || a) = ln(1 / FALSE_ALARM); inf when even t = 1 - a
    (every entry agrees) stays below it."""
    if n <= 0 or n * math.log(1.0 / a) < _LOG_ODDS:
        return math.inf
    lo, hi = 0.0, 1.0 - a
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if n * _kl(a + mid, a) < _LOG_ODDS:
            lo = mid
        else:
            hi = mid
    return hi


def _kl(x: float, a: float) -> float:
    """Relative entropy of Bernoulli(x) from Bernoulli(a)."""
    out = x * math.log(x / a) if x > 0 else 0.0
    return out + ((1 - x) * math.log((1 - x) / (1 - a)) if x < 1 else 0.0)


@dataclass(frozen=True)
class _Pair:
    axis: str
    label: str
    n: int
    agree: float
    excess: float
    bound: float

    @property
    def margin(self) -> float:
        return self.excess / self.bound


def independence_check(keep: torch.Tensor, visible: torch.Tensor, spec: AttnSpec,
                       heads_kv: int, *, parts: Optional[MaskParts] = None,
                       documents: bool = True, details: Optional[dict] = None) -> Check:
    """check="dropout_independence": the worst pair of masks that should be independent.
    ``keep`` / ``visible`` (B, Hq, Sq, Sk) bool; ``heads_kv`` names the GQA groups in the note;
    ``parts`` the CP layout (its probe is not read here); ``documents``: the keys are the
    pack's (False: a few probed columns, where documents do not line up)."""
    a = expected_agreement(spec.dropout_p)
    pairs = list(_all_pairs(keep, visible, spec if documents else None, heads_kv, parts, a))
    counts: dict[str, int] = {}
    for pair in pairs:
        counts[pair.axis] = counts.get(pair.axis, 0) + 1
    if details is not None:
        details["independence_pairs"] = counts
    if not pairs:
        return Check("dropout_independence", "out", "excess_agreement", 0.0, 0.0, True,
                     "no two masks that should be independent have enough visible entries")
    worst = max(pairs, key=lambda pair: pair.margin)
    if details is not None:
        details.update(independence_worst=worst.label, independence_agreement=worst.agree,
                       independence_margin=worst.margin)
    compared = ", ".join(f"{n} {axis}" for axis, n in counts.items())
    return Check("dropout_independence", "out", "excess_agreement", worst.excess, worst.bound,
                 worst.excess <= worst.bound,
                 f"masks of {worst.label} agree on {worst.agree:.4f} of {worst.n} visible "
                 f"entries, independent draws on {a:.4f} (pairs compared: {compared})")


def _all_pairs(keep, visible, spec, heads_kv, parts, a) -> Iterator[_Pair]:
    batch, heads_q = keep.shape[:2]
    for b1 in range(batch):
        for b2 in range(b1 + 1, batch):
            yield from _pair("batch rows", f"batch rows {b1} and {b2}", keep[b1], visible[b1],
                             keep[b2], visible[b2], a)
    if spec is not None and spec.is_packed:
        docs = [seg for seg, _ in per_sequence(spec)]
        for x, s in enumerate(docs):
            for t in docs[x + 1:]:
                lq, lk = min(s.len_q, t.len_q), min(s.len_k, t.len_k)
                yield from _pair("documents", f"documents {s.index} and {t.index}",
                                 *_block(keep, visible, (s.q0, s.q0 + lq), (s.k0, s.k0 + lk)),
                                 *_block(keep, visible, (t.q0, t.q0 + lq), (t.k0, t.k0 + lk)), a)
    group = heads_q // heads_kv if heads_kv and heads_q % heads_kv == 0 else 0
    for h1 in range(heads_q):
        for h2 in range(h1 + 1, heads_q):
            shared = " (one GQA group: they share a KV head)" if group and \
                h1 // group == h2 // group and group > 1 else ""
            yield from _pair("heads", f"query heads {h1} and {h2}{shared}", keep[:, h1],
                             visible[:, h1], keep[:, h2], visible[:, h2], a)
    if parts is not None:
        blocks = [(qr, kr) for qr in parts.q_parts for kr in parts.kv_parts]
        for x, (q1, k1) in enumerate(blocks):
            for q2, k2 in blocks[x + 1:]:
                lq = min(q1[1] - q1[0], q2[1] - q2[0])
                lk = min(k1[1] - k1[0], k2[1] - k2[0])
                yield from _pair(
                    "CP parts", f"CP parts rows {q1[0]}.. x keys {k1[0]}.. and rows {q2[0]}.. "
                    f"x keys {k2[0]}..",
                    *_block(keep, visible, (q1[0], q1[0] + lq), (k1[0], k1[0] + lk)),
                    *_block(keep, visible, (q2[0], q2[0] + lq), (k2[0], k2[0] + lk)), a)


def _block(keep, visible, rows: Range, cols: Range):
    return (keep[..., rows[0]:rows[1], cols[0]:cols[1]],
            visible[..., rows[0]:rows[1], cols[0]:cols[1]])


def _pair(axis: str, label: str, keep1, vis1, keep2, vis2, a: float) -> Sequence[_Pair]:
    """The pair's agreement over entries visible in both, or nothing where it has no power."""
    both = vis1 & vis2
    n = int(both.sum())
    bound = chernoff_excess(n, a)
    if not math.isfinite(bound):
        return ()
    agree = int(((keep1 == keep2) & both).sum()) / n
    return (_Pair(axis, label, n, agree, max(0.0, agree - a), bound),)


def cp_parts(segments_q: Sequence[Sequence], segments_kv: Sequence[Sequence]
             ) -> tuple[tuple[Range, ...], tuple[Range, ...]]:
    """The ranges of every CP chunk (per rank, its segments' ``ranges``: dense one range each,
    packed CP one per sequence's chunk), empty ones left out."""
    def flat(per_rank):
        return tuple(r for segs in per_rank for seg in segs for r in seg.ranges if r[1] > r[0])
    return flat(segments_q), flat(segments_kv)


def exposed_keep(keep_mask, spec: AttnSpec, shape: Sequence[int],
                 device: torch.device) -> torch.Tensor:
    """An exposed :data:`~attnbench.problem.attn_spec.KeepMaskFn` as a tensor (B, Hq, Sq, Sk)
    bool in the call's layout (a pack: each document's block at its rows and keys), asked for
    the positions the fp64 reference asks it for."""
    batch, heads_q, sq, sk = shape
    heads = torch.arange(spec.head_start, spec.head_start + heads_q, device=device)
    if not spec.is_packed:
        return keep_mask(spec, torch.arange(spec.batch_start, spec.batch_start + batch,
                                            device=device), heads,
                         torch.arange(spec.q_start, spec.q_start + sq, device=device),
                         torch.arange(spec.kv_start, spec.kv_start + sk, device=device))
    keep = torch.zeros(*shape, dtype=torch.bool, device=device)
    for seg, sub in per_sequence(spec):
        keep[:, :, seg.q0:seg.q1, seg.k0:seg.k1] = keep_mask(
            sub, torch.tensor([sub.batch_start], device=device), heads,
            torch.arange(sub.q_start, sub.q_start + seg.len_q, device=device),
            torch.arange(sub.kv_start, sub.kv_start + seg.len_k, device=device))
    return keep
