"""The fields of a packed (variable-length) case and how they fit together.

``seqlens_q`` / ``seqlens_kv`` list each sequence's length; ``varlen`` (a sweep-only field,
:mod:`attnbench.sweep.length_mix`) generates ``seqlens_q``. :func:`resolve_packing` derives
``batch``, ``seqlen_q`` and ``seqlen_kv`` from the lists when a case is made, refusing values that
disagree. Pure Python: reading a sweep imports no torch.
"""

from __future__ import annotations

from typing import Any

from attnbench.errors import SweepError
from attnbench.validation import fail

MAX_SEQUENCES = 4096
"""Sequences in one packed case: every record carries the list (~6 bytes each), and the fp64
reference and the naive baseline loop over sequences in Python. 64k tokens of 16-token
documents is 4096."""


def defaults_for(defaults: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """The defaults a case with its ``own`` values (an include, an axes combination) takes. A
    case that gives its own lengths does not inherit the sizes its lengths imply: with
    ``seqlens_q`` (or ``varlen``, which becomes it), not the defaults' batch, seqlen_q and
    seqlen_kv; with ``seqlens_kv`` alone, not batch and seqlen_kv (seqlen_q stays: the queries
    of every sequence). Otherwise ``defaults: {seqlen_q: 128}`` refused every pack of another
    total, naming a value the user never wrote there (issue 27)."""
    if own.get("seqlens_q"):
        implied = ("batch", "seqlen_q", "seqlen_kv")
    elif own.get("seqlens_kv"):
        implied = ("batch", "seqlen_kv")
    else:
        return defaults
    return {k: v for k, v in defaults.items() if k not in implied}


def resolve_packing(where: str, v: dict[str, Any], default_seqlen_q: int,
                    max_tokens: int) -> None:
    """A packed case's lengths against the fields they imply: batch = the number of sequences,
    seqlen_q / seqlen_kv = their sums (a value given for them must agree; batch 1, one pack,
    is accepted too). Given only
    seqlens_kv (a KV cache per sequence), every sequence has seqlen_q queries: seqlens_q is
    seqlen_q repeated and seqlen_q becomes the total. Given only seqlens_q, keys = queries."""
    lens_q, lens_kv = v.get("seqlens_q", ()), v.get("seqlens_kv", ())
    if lens_q and lens_kv and len(lens_q) != len(lens_kv):
        raise SweepError(f"{where}: seqlens_kv: got {len(lens_kv)} lengths, expected "
                         f"{len(lens_q)} (one per sequence of seqlens_q)")
    if not lens_q:  # keys per sequence only (a KV cache): seqlen_q queries in each sequence
        lens_q = (v.get("seqlen_q", default_seqlen_q),) * len(lens_kv)
        v.pop("seqlen_q", None)
    elif not lens_kv and v.get("seqlen_kv", sum(lens_q)) != sum(lens_q):
        raise SweepError(f"{where}: seqlen_kv: got {v['seqlen_kv']} with seqlens_q and no "
                         "seqlens_kv; give seqlens_kv (one key length per sequence)")
    lens_kv = lens_kv or lens_q
    if v.get("batch") == 1:  # one pack: what a sweep's defaults often spell out
        v.pop("batch")
    for name, total in (("batch", len(lens_q)), ("seqlen_q", sum(lens_q)),
                        ("seqlen_kv", sum(lens_kv))):
        if v.get(name, total) != total:
            what = "the number of sequences" if name == "batch" else "the sum of the lengths"
            raise SweepError(f"{where}: {name}: got {v[name]}, expected {total} ({what} in "
                             f"{'seqlens_kv' if name == 'seqlen_kv' else 'seqlens_q'}; or "
                             "leave it out)")
        v[name] = total
    if sum(lens_q) > max_tokens:
        raise fail(f"{where}.seqlen_q", sum(lens_q), f"at most {max_tokens} tokens in all")
    v["seqlens_q"], v["seqlens_kv"] = tuple(lens_q), tuple(lens_kv)


def check_stored_lengths(where: str, case) -> None:
    """A stored packed case (a record from elsewhere) must be consistent: as many lengths as
    ``batch`` in both lists, summing to ``seqlen_q`` and ``seqlen_kv``."""
    if not (case.seqlens_q or case.seqlens_kv):
        return
    if (len(case.seqlens_q) != case.batch or len(case.seqlens_kv) != case.batch
            or sum(case.seqlens_q) != case.seqlen_q or sum(case.seqlens_kv) != case.seqlen_kv):
        raise fail(f"{where}.seqlens_q", list(case.seqlens_q), "batch lengths summing to "
                   "seqlen_q, and as many seqlens_kv summing to seqlen_kv")
