"""Packed (variable-length) cases: the sweep fields, the length generator, stored records."""

from __future__ import annotations

import pytest

from attnbench.errors import SweepError
from attnbench.problem.packing import cu_seqlens, segments
from attnbench.sweep.case import Case, check_case_dict, make_case
from attnbench.sweep.length_mix import expand
from attnbench.sweep.load import parse_sweep
from attnbench.sweep.packed_rules import MAX_SEQUENCES


def sweep(include: str, defaults: str = "{backend: naive}") -> list[Case]:
    text = f"name: t\ndefaults: {defaults}\naxes: {{dtype: [fp32]}}\ninclude:\n  - {include}\n"
    return list(parse_sweep(text, "s.yaml").cases)


def error(include: str, defaults: str = "{backend: naive}") -> str:
    with pytest.raises(SweepError) as info:
        sweep(include, defaults)
    message = str(info.value)
    assert "\n" not in message and message.startswith("s.yaml: ")
    return message


def test_seqlens_q_sets_batch_and_totals():
    case = sweep("{seqlens_q: [4096, 1024, 77, 2999]}")[-1]
    assert case.is_packed and case.batch == 4
    assert case.seqlen_q == case.seqlen_kv == 4096 + 1024 + 77 + 2999
    assert case.seqlens_kv == case.seqlens_q == (4096, 1024, 77, 2999)
    assert case.features.endswith(" packed")


def test_seqlens_kv_differs_per_sequence():
    case = sweep("{seqlens_q: [5, 17], seqlens_kv: [9, 3], mask: causal}")[-1]
    assert (case.seqlen_q, case.seqlen_kv, case.batch) == (22, 12, 2)


def test_seqlens_kv_alone_means_seqlen_q_queries_per_sequence():
    """A KV cache per sequence (decode): seqlen_q queries in each of len(seqlens_kv)."""
    case = sweep("{seqlens_kv: [100, 7, 30], seqlen_q: 2}")[-1]
    assert case.seqlens_q == (2, 2, 2) and case.seqlen_q == 6 and case.seqlen_kv == 137
    assert case.batch == 3


def test_dense_case_id_unchanged_by_the_new_fields():
    """Ids of dense cases are those of earlier versions: resumed runs find their records."""
    case = make_case("x", {"backend": "naive"})
    assert "seqlens_q" not in case.to_dict() and case.id == "09019b0098a08c33"  # as before packing


def test_stored_packed_case_round_trips():
    case = sweep("{seqlens_q: [3, 4], seqlens_kv: [5, 1]}")[-1]
    stored = check_case_dict("rec.case", case.to_dict())
    assert stored == case and stored.id == case.id and hash(stored) == hash(case)
    bad = dict(case.to_dict(), seqlen_q=8)
    with pytest.raises(SweepError, match="rec.case.seqlens_q"):
        check_case_dict("rec.case", bad)


@pytest.mark.parametrize("include, expected", [
    ("{seqlens_q: [5, 17], seqlen_q: 30}", "seqlen_q: got 30, expected 22"),
    ("{seqlens_q: []}", "seqlens_q: got [], expected a non-empty list"),
    ("{seqlens_q: [0, 0]}", "seqlens_q: got [0, 0], expected at least one token in all"),
    ("{seqlens_q: [5, -3]}", "seqlens_q[1]: got -3"),
    ("{seqlens_q: [5, 2.5]}", "seqlens_q[1]: got 2.5"),
    ("{seqlens_q: 5}", "seqlens_q: got 5, expected a non-empty list"),
    ("{seqlens_q: [5, 3], seqlens_kv: [1]}", "seqlens_kv: got 1 lengths, expected 2"),
    ("{seqlens_q: [5, 3], batch: 3}", "batch: got 3, expected 2"),
    ("{seqlens_q: [5, 3], seqlen_kv: 9}", "give seqlens_kv"),
    ("{seqlens_q: [5, 3], seqlens_kv: [1, 4], seqlen_kv: 9}", "seqlen_kv: got 9, expected 5"),
    ("{varlen: {lengths: lognormal, mean: 0, total: 100}}", "varlen.mean: got 0"),
    ("{varlen: {lengths: lognormal, mean: 2, total: 100000}}", "more than 4096 sequences"),
    ("{varlen: {lengths: zipf, mean: 2, total: 100}}", "varlen.lengths: got 'zipf'"),
    ("{varlen: {lengths: uniform, min: 5, max: 3, total: 100}}", "varlen.max: got 3"),
    ("{varlen: {lengths: uniform, min: 5, max: 30}}", "varlen.total: missing"),
    ("{varlen: {lengths: lognormal, mean: .nan, total: 100}}", "varlen.mean: got nan"),
    ("{varlen: {lengths: lognormal, mean: 5, total: 100, sigma: 9}}", "varlen.sigma: got 9"),
    ("{varlen: {lengths: lognormal, mean: 5, total: 0}}", "varlen.total: got 0"),
    ("{varlen: {lengths: lognormal, mean: 5, total: 100, foo: 1}}", "varlen.foo: unknown"),
    ("{varlen: [1, 2]}", "varlen: got [1, 2], expected a mapping"),
])
def test_bad_packed_input_is_one_line(include, expected):
    assert expected in error(include)


def test_too_many_sequences():
    lengths = ", ".join(["1"] * (MAX_SEQUENCES + 1))
    assert f"expected at most {MAX_SEQUENCES}" in error(f"{{seqlens_q: [{lengths}]}}")


def test_seqlen_in_defaults_gives_way_to_the_packs_own_lengths():
    """Issue 27: a pack's own lengths imply its sizes; defaults' seqlen_q is for dense cases
    (tests/sweep/test_packed_defaults.py). Lengths and a size both in defaults must still agree."""
    case = sweep("{seqlens_q: [3, 5]}", "{backend: naive, seqlen_q: 128}")[-1]
    assert case.seqlen_q == 8 and case.batch == 2
    with pytest.raises(SweepError, match="seqlen_q: got 128, expected 8"):
        sweep("{backend: naive}", "{backend: naive, seqlens_q: [3, 5], seqlen_q: 128}")


@pytest.mark.parametrize("spec", [
    {"lengths": "lognormal", "mean": 2048, "max": 16384, "total": 65536, "seed": 0},
    {"lengths": "lognormal", "mean": 50, "sigma": 2.0, "min": 3, "max": 400, "total": 3000},
    {"lengths": "uniform", "min": 16, "max": 300, "total": 1000, "seed": 3},
])
def test_generator_is_reproducible_and_exact(spec):
    lengths = expand("varlen", spec, MAX_SEQUENCES, 2**31 - 1)
    assert lengths == expand("varlen", dict(spec), MAX_SEQUENCES, 2**31 - 1)
    assert sum(lengths) == spec["total"]
    assert all(1 <= n <= spec.get("max", spec["total"]) for n in lengths)
    assert all(n >= spec.get("min", 1) for n in lengths[:-1])  # the tail takes what is left
    other = expand("varlen", dict(spec, seed=spec.get("seed", 0) + 1), MAX_SEQUENCES, 2**31 - 1)
    assert other != lengths


def test_generator_values_are_pinned():
    """The same sweep gives the same lengths (and case ids) on every machine and version."""
    spec = {"lengths": "lognormal", "mean": 64, "max": 256, "total": 600, "seed": 0}
    assert expand("varlen", spec, MAX_SEQUENCES, 2**31 - 1) == PINNED


PINNED = (42, 36, 14, 21, 14, 4, 39, 38, 256, 136)  # changing the algorithm must be deliberate


def test_layout_segments():
    assert cu_seqlens([5, 17, 1]) == (0, 5, 22, 23)
    segs = segments(cu_seqlens([5, 17]), cu_seqlens([9, 3]))
    assert [(s.q0, s.q1, s.k0, s.k1) for s in segs] == [(0, 5, 0, 9), (5, 22, 9, 12)]
