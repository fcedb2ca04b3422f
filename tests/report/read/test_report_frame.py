"""The report's frame is stored compactly (issue 29: ``report`` under 1 GiB at 10^6 records):
text columns of a few values as categories, a chunk's all-NaN number column as its length, a
panel's rows as only the columns it reads. None of that may change a value or an order: the
frame read in chunks must hold what one DataFrame of every record holds
(:func:`attnbench.report.read.data.frame`, what ``export`` writes), and sort and group the same."""

import numpy as np
import pandas as pd
import pytest

import attnbench.report.read.reader as reading
from attnbench.report.read.data import frame, load_records, load_manifest
from attnbench.report.read.reader import CATEGORICAL, MATCH_KEY, PARALLEL_KEY, UNREAD, read_run

CHUNK_ROWS = 7
"""Rows per chunk here: chunks of different categories (a GPU kind, a backend, a reason absent
from some), and number columns NaN in some chunks and not in others."""


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(reading, "CHUNK_ROWS", CHUNK_ROWS)


def _both(run_dir):
    run = read_run(run_dir)
    records = load_records(run_dir)
    plain = frame(records, str(load_manifest(run_dir).get("run_id")))
    return run.frame, plain.drop(columns=[c for c in UNREAD if c in plain])


@pytest.mark.parametrize("name", ["h100", "mixed", "sxm-timed"])
def test_chunked_frame_holds_the_values_of_one_frame(synthetic, small_chunks, name):
    got, want = _both(synthetic[name])
    assert len(got) > 3 * CHUNK_ROWS
    # the columns of one frame, in its order (mutant: the kept columns typed in another order)
    assert list(got.columns) == [*want.columns, MATCH_KEY, PARALLEL_KEY]
    for col in want.columns:
        a, b = got[col], want[col]
        if col in CATEGORICAL and isinstance(a.dtype, pd.CategoricalDtype):
            assert list(a.cat.categories) == sorted(a.cat.categories), col  # code order = text
            a = a.astype(object)
        if b.dtype == np.float64:
            assert a.dtype == np.float64, col
            np.testing.assert_array_equal(a.to_numpy(), b.to_numpy(), err_msg=col)
        else:
            assert [None if pd.isna(v) else v for v in a.astype(object)] == \
                [None if pd.isna(v) else v for v in b.astype(object)], col
    assert any(isinstance(got[c].dtype, pd.CategoricalDtype) for c in CATEGORICAL)


@pytest.mark.parametrize("name", ["h100", "mixed"])
def test_categories_sort_and_group_as_the_text(synthetic, small_chunks, name):
    """Sorting (the failures table, the heatmap's order) and grouping (every facet) read a
    categorical column as its text would be read."""
    got, want = _both(synthetic[name])
    by = ["backend", "features", "label"]
    assert list(got.sort_values(by, kind="stable").id) == \
        list(want.sort_values(by, kind="stable").id)
    facets = ["gpu_kind", "dtype", "features"]
    keys_got = [k for k, _ in got.groupby(facets, dropna=False, sort=True)]
    keys_want = [k for k, _ in want.groupby(facets, dropna=False, sort=True)]
    assert [tuple(map(str, k)) for k in keys_got] == [tuple(map(str, k)) for k in keys_want]


def _bound_run(tmp_path, rows: int = 3 * CHUNK_ROWS):
    """A journal whose sizes sit at int32's bound (``sweep.case.MAX_SIZE``) and whose last
    chunk has a seed past it (a valid seed: up to 2^63 - 1)."""
    import json

    from attnbench.sweep.case import MAX_SIZE, make_case
    from helpers import simulated_record

    run_dir = tmp_path / "bound"
    run_dir.mkdir()
    with open(run_dir / "records.jsonl", "w") as fh:
        for i in range(rows):
            seed = 2**31 + i if i >= 2 * CHUNK_ROWS else 2**31 - 1 - i
            case = make_case("bound", {"backend": "naive", "dtype": "bf16", "gpu": "SIM-A",
                                       "seqlen_q": MAX_SIZE - i, "seqlen_kv": MAX_SIZE,
                                       "batch": 1, "heads_q": 8, "heads_kv": 8, "seed": seed})
            fh.write(json.dumps(simulated_record(case)) + "\n")
    return run_dir


def test_int32_columns_hold_values_at_the_bound(tmp_path, small_chunks):
    """Case sizes are int32 in the frame (4 B a row less each), and a value at the bound or past
    it (a seed) reads back as it was. Mutant: ``astype(np.int32)`` without the range check wraps
    the seeds past 2^31 to negative numbers, and this fails."""
    from attnbench.sweep.case import MAX_SIZE

    got, want = _both(_bound_run(tmp_path))
    assert got.seqlen_q.dtype == np.int32 and got.seqlen_kv.dtype == np.int32
    assert got.seed.dtype == np.int64  # one chunk's seeds do not fit: the column stays int64
    assert got.seqlen_kv.max() == MAX_SIZE
    for col in ("seqlen_q", "seqlen_kv", "seed", "batch", "world_size", "sequences"):
        assert got[col].tolist() == want[col].tolist(), col


@pytest.mark.parametrize("case", [
    {"backend": "naive", "gpu": "H100", "cp": 2, "tp": 1, "cp_algo": "ring", "seqlen_q": 1024},
    {"backend": "x\u00e9", "gpu": "A", "dropout": float("nan"), "seqlens_q": [3, 5], "cp": 1},
    {"b": 1, "a": None, "tp": 4},  # no gpu, no cp_algo
])
def test_case_keys_are_digests_of_canonical_texts(case):
    """The parallel key is the digest of the case's canonical text without gpu, cp, tp,
    cp_algo; the match key that text's digest continued with the text of the case's cp, tp and
    cp_algo (the case encoded once). Mutants: not dropping ``cp_algo`` from the parallel key
    fails the first case; a match key without cp/tp/cp_algo (the parallel key's twin) fails it
    too."""
    import hashlib

    from attnbench.report.read.reader import (DIGEST_BYTES, PARALLEL_IGNORES, canonical_text,
                                          case_keys, key_digest)

    def digest(*texts):
        raw = hashlib.blake2b(digest_size=DIGEST_BYTES)
        for text in texts:
            raw.update(text)
        return int.from_bytes(raw.digest(), "little", signed=True)

    shared = canonical_text({k: v for k, v in case.items() if k not in PARALLEL_IGNORES})
    split = canonical_text({k: v for k, v in case.items() if k in PARALLEL_IGNORES[1:]})
    assert case_keys(case) == (digest(shared, split), digest(shared))
    assert all(-2**63 <= k < 2**63 for k in case_keys(case))  # an int64 column
    assert key_digest(case) == case_keys(case)[0]


@pytest.mark.parametrize("text_of", ["installed", "json"])
def test_canonical_texts_are_equal_only_for_equal_values(text_of, monkeypatch):
    """orjson writes NaN and inf as null, and refuses ints past 64 bits and lone surrogates:
    those texts are json's (after a zero byte), so no two values share a text; a tuple and a
    list are one JSON array, and key order does not matter. Mutant: orjson's text for NaN
    (``b"null" in text`` not looked at) makes NaN, inf and None one case."""
    from attnbench.report.read import canonical

    if text_of == "json":  # a box without orjson
        monkeypatch.setattr(canonical, "orjson", None)
    values = [None, float("nan"), float("inf"), -float("inf"), 0, 0.0, -0.0, 1, 1.0, True,
              False, "1", "null", "\ud800", 2**64, -2**63 - 1, 2**63, [1, 2], [2, 1], [],
              [None], [float("nan")], {"a": 1}, {"a": None}, "\u00e9", "x\"y", 1e16, 10**16]
    texts = [canonical.canonical_text({"v": v, "w": 1}) for v in values]
    assert len(set(texts)) == len(values)
    assert canonical.canonical_text({"v": (1, 2), "w": 1}) == texts[values.index([1, 2])]
    assert canonical.canonical_text({"w": 1, "v": 1}) == texts[values.index(1)]


def test_case_keys_are_equal_only_for_equal_cases():
    """Two cases share a match key only when they differ in gpu alone, a parallel key when
    they differ in gpu, cp, tp, cp_algo alone; a value moved between the shared text and the
    split one (``tp`` written inside another field's text) gives other keys."""
    from attnbench.report.read.reader import case_keys

    base = {"backend": "naive", "gpu": "H100", "cp": 2, "tp": 1, "cp_algo": "ring",
            "seqlen_q": 1024, "window": None}
    variants = [dict(base, gpu="A100"), dict(base, cp=4), dict(base, tp=2),
                dict(base, cp_algo="zigzag"), dict(base, seqlen_q=2048), dict(base, window=[1, 2]),
                {k: v for k, v in base.items() if k != "cp_algo"}, dict(base, cp=2.0),
                dict(base, backend='naive","tp":1'), dict(base, seqlen_q=None)]
    match, parallel = case_keys(base)
    for other in variants:
        m, p = case_keys(other)
        same_case = {k: v for k, v in other.items() if k != "gpu"} == \
            {k: v for k, v in base.items() if k != "gpu"} and all(
                type(other.get(k)) is type(base.get(k)) for k in base)
        assert (m == match) == same_case, other
        differs_in = {k for k in base.keys() | other.keys() if other.get(k, 0j) != base.get(k, 0j)
                      or type(other.get(k)) is not type(base.get(k))}
        assert (p == parallel) == (differs_in <= {"gpu", "cp", "tp", "cp_algo"}), other


def test_columns_no_record_has_share_one_array(tmp_path, small_chunks):
    """A simulated run has no accuracy, fp8 or compile numbers: those columns are NaN, as one
    frame of every record holds them (the test above), and views of one read-only array, not 8 B
    a row each (~0.25 GB at 10^6 rows). A write to one copies it and leaves the others NaN.
    Mutant: ``np.full`` per column (as before) fails the shared-memory assertion."""
    got, want = _both(_bound_run(tmp_path))
    empty = [c for c in want.columns if want[c].dtype == np.float64 and want[c].isna().all()]
    assert len(empty) > 10
    first = got[empty[0]].to_numpy()
    assert all(np.shares_memory(first, got[c].to_numpy()) for c in empty[1:])
    got.loc[0, empty[0]] = 1.0
    assert got[empty[0]].iloc[0] == 1.0 and all(got[c].isna().all() for c in empty[1:])
