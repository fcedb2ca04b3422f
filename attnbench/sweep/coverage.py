"""Which pairs of feature values a set of sweeps never puts in one case (issue 26).

A bug that needs two features together (K and V descaled apart *and* per-tensor fp8; packed
documents with Sq != Sk *and* ALiBi) shows only in a case that has both. So coverage is counted
in pairs: every value of one feature (:data:`FEATURES`) beside every value of another, each pair
covered when some case has both. A pair no valid case can have is not meaningful and not
counted (:func:`excluded` says why, from the rules of :mod:`~.decode_rules` and
:mod:`~.fp8_rules`); a feature that does not apply to a case (fp8 scaling of a bf16 case, the
page layout of a non-decode case) gives it no value, so it makes no pair there.

Rows that see no key (issue 39) are counted beside every feature that touches scores: a kernel
must give such a row zeros and lse -inf whatever it adds to the scores first (softcap, ALiBi --
the score modifiers a FlexAttention ``score_mod`` spells -- a window, Sq > Sk, a document with no
keys), and a bug there (a bias added to a row of -inf, a softcap of -inf, 0/0 in a document of no
keys) needs both. :data:`EMPTY_ROW_FEATURES` lists the values paired with ``empty_rows=yes``.

``attnbench validate --coverage SWEEP...`` prints the count and the missing pairs. Client side:
no torch.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterable, Optional

from attnbench.dtypes import BY_NAME, is_fp8
from attnbench.sweep.case import ATTENTION_KINDS, BIASES, CP_ALGOS, DRAWN_INPUTS, MASKS, Case
from attnbench.sweep.fp8_rules import FP8_SCALINGS

FEATURES: dict[str, tuple[str, ...]] = {
    "mask": MASKS,
    "bias": BIASES,
    "dropout": ("off", "on"),
    "heads": ATTENTION_KINDS,
    "packed": ("no", "yes"),
    "sq_ne_sk": ("no", "yes"),
    "decode": ("no", "yes"),
    "page": ("contiguous", "paged"),  # decode cases only
    "dtype": tuple(BY_NAME),
    "fp8_scaling": FP8_SCALINGS,  # fp8 cases only
    "inputs": DRAWN_INPUTS,  # a captured case's inputs are a user's file: no sweep ships one
    "cp_algo": ("none", *CP_ALGOS),
    "tp": ("no", "yes"),
}
"""Every feature the issue names and its values, in report order."""


EMPTY_ROWS = ("empty_rows", "yes")
"""Some query row of the case sees no key (:func:`has_empty_rows`)."""
EMPTY_ROW_FEATURES: tuple[tuple[str, str], ...] = (
    ("softcap", "on"), ("bias", "alibi"), ("mask", "causal"), ("mask", "window"),
    ("mask", "none"),  # only a document with queries and no keys has such rows unmasked
    ("sq_gt_sk", "yes"), ("packed", "yes"), ("dropout", "on"),
    *(("dtype", d) for d in BY_NAME))
"""The values every one of which some case with :data:`EMPTY_ROWS` must have: those that touch
the scores of such a row (softcap and ALiBi are the score modifiers; a mask or Sq > Sk makes the
row), how it is stored (a pack) and rounded (every dtype), and dropout (a rescale of nothing)."""


def has_empty_rows(case: Case) -> bool:
    """Whether some query row sees no key. With bottom-right alignment row 0 sits at key position
    Sk - Sq and sees keys up to Sk - Sq + right (right = 0 causal, a window's right edge): none
    when Sq - Sk > right. A document with queries and no keys has such rows under any mask."""
    right = case.window_bounds[1]
    lengths = (zip(case.seqlens_q, case.seqlens_kv) if case.is_packed
               else [(case.seqlen_q, case.seqlen_kv)])
    return any(lq > 0 and (lk == 0 or (right >= 0 and lq - lk > right)) for lq, lk in lengths)


def empty_row_values(case: Case) -> set[tuple[str, str]]:
    """The :data:`EMPTY_ROW_FEATURES` values ``case`` has (none unless some row sees no key)."""
    if not has_empty_rows(case):
        return set()
    pairs = zip(case.seqlens_q, case.seqlens_kv) if case.is_packed else [
        (case.seqlen_q, case.seqlen_kv)]
    found = set(values(case).items())
    found |= {("softcap", "on" if case.softcap > 0 else "off"),
              ("sq_gt_sk", "yes" if any(q > k for q, k in pairs) else "no")}
    return found & set(EMPTY_ROW_FEATURES)


def values(case: Case) -> dict[str, str]:
    """The value of every feature that applies to ``case``."""
    if case.is_packed:  # per document: a pack of equal documents is Sq = Sk however it is cut
        uneven = any(q != k for q, k in zip(case.seqlens_q, case.seqlens_kv or case.seqlens_q))
    else:
        uneven = case.seqlen_q != case.seqlen_kv
    found = {
        "mask": case.mask, "bias": case.bias, "dropout": "on" if case.dropout > 0 else "off",
        "heads": case.attention_kind,
        "packed": "yes" if case.is_packed else "no", "sq_ne_sk": "yes" if uneven else "no",
        "decode": "yes" if case.decode else "no", "dtype": case.dtype, "inputs": case.inputs,
        "cp_algo": case.cp_algo if case.cp > 1 else "none", "tp": "yes" if case.tp > 1 else "no",
    }
    if case.inputs not in DRAWN_INPUTS:
        del found["inputs"]
    if case.decode:
        found["page"] = "paged" if case.page_size else "contiguous"
    if is_fp8(case.dtype):
        found["fp8_scaling"] = case.fp8_scaling
    return found


Value = tuple[str, str]
"""(feature, value)."""
Pair = tuple[Value, Value]
"""Two values of different features, in :data:`FEATURES` order."""

_SINGLE_DEVICE = {("dropout", "on"), ("tp", "yes"), *(("cp_algo", algo) for algo in CP_ALGOS)}
"""Values a decode or fp8 case cannot have: they run on one device, without dropout."""


def excluded(a: Value, b: Value) -> Optional[str]:
    """Why no valid case has both ``a`` and ``b`` (None: the pair is meaningful)."""
    for x, y in ((a, b), (b, a)):
        if x[0] == "page" and y == ("decode", "no"):
            return "a page layout is a decode case's (page_size needs decode: true)"
        if x[0] == "fp8_scaling" and y[0] == "dtype" and not is_fp8(y[1]):
            return "fp8 scaling applies to fp8 dtypes only"
        if _decode(x):
            if y in _SINGLE_DEVICE:
                return "decode runs forward only, on one device, without dropout"
            if y == ("sq_ne_sk", "no"):
                return "decode reads a cache longer than its new tokens (Sq < Sk)"
            if _fp8(y):
                return "an fp8 KV cache is not built yet"
        if _fp8(x) and y in _SINGLE_DEVICE:
            return "fp8 runs on one device, without dropout (no fp8 kernel here takes it)"
    return None


def _decode(v: Value) -> bool:
    return v == ("decode", "yes") or v[0] == "page"


def _fp8(v: Value) -> bool:
    return v[0] == "fp8_scaling" or v[0] == "dtype" and is_fp8(v[1])


def meaningful_pairs() -> list[Pair]:
    """Every pair of values of two different features that a valid case may have."""
    values_of = [[(name, v) for v in vals] for name, vals in FEATURES.items()]
    return [(a, b) for fa, fb in itertools.combinations(values_of, 2)
            for a in fa for b in fb if excluded(a, b) is None] + [
        (v, EMPTY_ROWS) for v in EMPTY_ROW_FEATURES]


@dataclass(frozen=True)
class Coverage:
    covered: frozenset[Pair]
    meaningful: tuple[Pair, ...]

    @property
    def missing(self) -> tuple[Pair, ...]:
        return tuple(p for p in self.meaningful if p not in self.covered)

    @property
    def fraction(self) -> float:
        return (len(self.meaningful) - len(self.missing)) / len(self.meaningful)

    def report(self) -> str:
        lines = [f"coverage: {len(self.meaningful) - len(self.missing)} of "
                 f"{len(self.meaningful)} meaningful pairs of feature values "
                 f"({100 * self.fraction:.1f}%); {len(self.missing)} never met"
                 + (":" if self.missing else "")]
        lines += [f"  {a[0]}={a[1]} x {b[0]}={b[1]}" for a, b in self.missing]
        return "\n".join(lines)


def pair_coverage(cases: Iterable[Case]) -> Coverage:
    """Which meaningful pairs ``cases`` exercise."""
    order = {name: i for i, name in enumerate(FEATURES)}
    covered = set()
    for case in cases:
        found = sorted(values(case).items(), key=lambda item: order[item[0]])
        covered.update(itertools.combinations(found, 2))
        covered.update((v, EMPTY_ROWS) for v in empty_row_values(case))
    return Coverage(frozenset(covered), tuple(meaningful_pairs()))
