"""The coverage report (issue 26): pairs of feature values, which are meaningful, which a set of
sweeps never puts in one case."""

from __future__ import annotations

import itertools

import pytest

from attnbench.errors import SweepError
from attnbench.sweep.case import make_case
from attnbench.sweep.coverage import (EMPTY_ROW_FEATURES, EMPTY_ROWS, FEATURES, excluded,
                                      has_empty_rows, meaningful_pairs, pair_coverage, values)
from attnbench.sweep.load import load_sweep
from helpers import ROOT

BASE = dict(backend="naive", batch=1, seqlen_q=64, seqlen_kv=64, heads_q=4, heads_kv=2,
            head_dim=32)
SETTERS = {
    ("mask", "causal"): dict(mask="causal"),
    ("mask", "window"): dict(mask="window", window_left=8, window_right=0),
    ("bias", "alibi"): dict(bias="alibi"),
    ("dropout", "on"): dict(dropout=0.1),
    ("heads", "MHA"): dict(heads_kv=4),
    ("heads", "MQA"): dict(heads_kv=1),
    ("packed", "yes"): dict(seqlens_q=[24, 40]),
    ("sq_ne_sk", "yes"): dict(seqlen_kv=96),
    ("decode", "yes"): dict(decode=True, seqlen_q=2),
    ("page", "contiguous"): dict(decode=True, seqlen_q=2),
    ("page", "paged"): dict(decode=True, seqlen_q=2, page_size=16),
    ("fp8_scaling", "tensor"): dict(fp8_scaling="tensor"),
    ("fp8_scaling", "head"): dict(fp8_scaling="head"),
    ("tp", "yes"): dict(tp=2),
    **{("cp_algo", a): dict(cp=2, cp_algo=a) for a in ("ring", "zigzag", "allgather")},
    **{("dtype", d): dict(dtype=d) for d in FEATURES["dtype"]},
    **{("inputs", i): dict(inputs=i) for i in FEATURES["inputs"]},
}


def build(*pair):
    """A case with both values, as a sweep would write it (packed and Sq != Sk together: each
    document's keys longer than its queries)."""
    fields = dict(BASE)
    for value in pair:
        fields.update(SETTERS.get(value, {}))
    if "seqlens_q" in fields and fields["seqlen_kv"] != fields["seqlen_q"]:
        fields.update(seqlens_kv=[40, 56], seqlen_kv=96)
    if fields.get("decode") and "seqlens_q" in fields:  # several caches: packed decode
        fields.update(seqlens_q=[2, 2], seqlens_kv=[30, 50], seqlen_q=4, seqlen_kv=80)
    if "fp8_scaling" in fields and not str(fields.get("dtype", "")).startswith("fp8"):
        fields["dtype"] = "fp8_e4m3"  # scaling is an fp8 case's
    return make_case("coverage", fields)


@pytest.mark.parametrize("feature_a, feature_b", list(itertools.combinations(FEATURES, 2)))
def test_a_pair_is_meaningful_exactly_when_a_valid_case_has_both(feature_a, feature_b):
    for a, b in itertools.product(FEATURES[feature_a], FEATURES[feature_b]):
        pair = ((feature_a, a), (feature_b, b))
        why = excluded(*pair)
        try:
            case = build(*pair)
        except SweepError as exc:
            assert why is not None, f"{pair}: meaningful, but no valid case: {exc}"
            continue
        found = values(case)
        if why is None:
            assert found.get(feature_a) == a and found.get(feature_b) == b, (pair, found)
        else:
            assert found.get(feature_a) != a or found.get(feature_b) != b, (pair, why)


def test_report_lists_the_pairs_never_met():
    bf16 = make_case("t", dict(BASE, dtype="bf16", mask="causal"))
    report = pair_coverage([bf16])
    assert (("mask", "causal"), ("dtype", "bf16")) in report.covered
    assert (("mask", "window"), ("bias", "alibi")) in report.missing
    assert len(report.meaningful) == len(meaningful_pairs()) > 400
    assert report.report().startswith(f"coverage: {len(report.covered)} of ")
    assert "  mask=window x bias=alibi" in report.report().splitlines()


DEFAULT_SWEEPS = ("standard", "cp_tp", "varlen", "decode", "fp8")
"""The sweeps a team runs first (docs/coverage.md): together they must meet every pair."""


def test_the_default_sweeps_meet_every_meaningful_pair():
    """Validation only (no case runs). Fails on 8db527f's sweeps: 449 of 563 (the 35 pairwise
    cases of issue 26 close the gap), and on 71b86a7's: 573 of 607 (shifted_v's 31 pairs; softcap,
    no mask and dropout never beside a row that sees no key)."""
    cases = [c for name in DEFAULT_SWEEPS
             for c in load_sweep(ROOT / "sweeps" / f"{name}.yaml").cases]
    coverage = pair_coverage(cases)
    assert not coverage.missing, coverage.report()


@pytest.mark.parametrize("fields, empty", [
    (dict(seqlen_q=96, seqlen_kv=40, mask="causal"), True),        # the first 56 rows
    (dict(seqlen_q=41, seqlen_kv=40, mask="causal"), True),
    (dict(seqlen_q=40, seqlen_kv=96, mask="causal"), False),
    (dict(seqlen_q=96, seqlen_kv=40), False),                      # no mask: every key
    (dict(seqlen_q=96, seqlen_kv=40, mask="window", window_left=8, window_right=56), False),
    (dict(seqlen_q=96, seqlen_kv=40, mask="window", window_left=8, window_right=55), True),
    (dict(seqlen_q=40, seqlen_kv=40, mask="window", window_left=-1, window_right=-1), False),
    (dict(seqlens_q=[24, 40], seqlens_kv=[30, 0], seqlen_kv=30), True),  # a document of no keys
    (dict(seqlens_q=[24, 0, 40], seqlens_kv=[30, 9, 40], seqlen_kv=79), False),  # no queries
])
def test_rows_that_see_no_key(fields, empty):
    """Bottom-right alignment: row 0 sits at key Sk - Sq and sees up to Sk - Sq + right."""
    assert has_empty_rows(make_case("t", dict(BASE, **fields))) is empty


EMPTY_SETTERS = {("softcap", "on"): dict(softcap=20.0), ("sq_gt_sk", "yes"): {},
                 ("mask", "none"): dict(mask="none", seqlens_q=[56, 40], seqlens_kv=[40, 0],
                                        seqlen_kv=40)}


@pytest.mark.parametrize("value", EMPTY_ROW_FEATURES)
def test_every_empty_row_pair_has_a_valid_case(value):
    """Each value beside rows that see no key (causal, 96 queries on 40 keys, unless the value
    is no mask: then a document of no keys)."""
    fields = dict(BASE, seqlen_q=96, seqlen_kv=40, mask="causal")
    fields.update(EMPTY_SETTERS.get(value, SETTERS.get(value, {})))
    if value == ("mask", "window"):
        fields.update(window_right=0)
    if value == ("packed", "yes"):
        fields.update(seqlens_q=[60, 36], seqlens_kv=[20, 20], seqlen_kv=40)
    case = make_case("t", fields)
    report = pair_coverage([case])
    assert has_empty_rows(case) and (value, EMPTY_ROWS) in report.covered
    assert (value, EMPTY_ROWS) in report.meaningful


def test_rows_that_see_every_key_make_no_empty_row_pair():
    case = make_case("t", dict(BASE, softcap=20.0, seqlen_q=40, seqlen_kv=96, mask="causal"))
    assert not any(EMPTY_ROWS in pair for pair in pair_coverage([case]).covered)
