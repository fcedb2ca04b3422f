"""``compare`` finds its pairs from the key, the kind and each row's place, then takes the
compared columns (:func:`attnbench.report.compare.comparison._paired_rows` and ``_pairs_frame``,
issue 29:
merging the ~60 compared columns on the case alone met every kind of A with every kind of B,
3.6 GiB for 10^6 cases on 3 GPU kinds). The pairs must be those of that merge, filtered as it
was: same columns (those the outputs read: compare.PAIRED), order, types and values, on every
pair of the synthetic runs (same kind, across kinds, a kind unknown)."""

import itertools

import numpy as np
import pandas as pd
import pytest

from attnbench.report.compare import comparison as compare
from attnbench.report.read.reader import read_run


def _merged_then_filtered(fa: pd.DataFrame, fb: pd.DataFrame) -> pd.DataFrame:
    """The pairs as compare made them before: the wide merge, then the same rows and the
    cross-kind rows of records with no twin on their own kind."""
    m = fa.merge(fb, on="match_key", suffixes=("_a", "_b"))
    unknown = (m.run_gpu_a == "?") | (m.run_gpu_b == "?")
    same = m[(m.run_gpu_a == m.run_gpu_b) | unknown]
    paired = set(zip(same.match_key, same.run_gpu_a))
    lone_a = pd.Series([(k, g) not in paired for k, g in zip(m.match_key, m.run_gpu_a)],
                       index=m.index, dtype=bool)
    lone_b = pd.Series([(k, g) not in paired for k, g in zip(m.match_key, m.run_gpu_b)],
                       index=m.index, dtype=bool)
    cross = m[(m.run_gpu_a != m.run_gpu_b) & ~unknown & (lone_a | lone_b)]
    pairs = pd.concat([same, cross], ignore_index=True)
    return pairs[[c for c in pairs.columns if c in compare.PAIRED]]


def _pairs(fa, fb):
    return compare._pairs_frame(fa, fb, compare._paired_rows(fa, fb))


@pytest.fixture(scope="module")
def keyed(synthetic):
    return {name: compare._keyed(read_run(path)) for name, path in synthetic.items()}


def test_the_pairs_are_the_wide_merges(keyed):
    crossed = 0
    for a, b in itertools.permutations(sorted(keyed), 2):
        want = _merged_then_filtered(keyed[a], keyed[b])
        pd.testing.assert_frame_equal(_pairs(keyed[a], keyed[b]), want, obj=f"{a} vs {b}")
        crossed += int((want.run_gpu_a != want.run_gpu_b).sum())
    assert crossed  # the cross-kind pairs were met, not only the same-kind ones


def test_a_kind_unknown_pairs_with_every_kind(keyed):
    a, b = keyed["h100"], keyed["a100"].copy()
    b["run_gpu"] = np.where(np.arange(len(b)) % 2 == 0, "?", b.run_gpu.to_numpy())
    want = _merged_then_filtered(a, b)
    assert (want.run_gpu_b == "?").any()
    pd.testing.assert_frame_equal(_pairs(a, b), want)


def test_rows_out_of_order_are_caught(keyed):
    """The mutant a test of values alone would miss: right pairs, wrong order."""
    a, b = keyed["h100"], keyed["h100-slower"]
    rows = compare._paired_rows(a, b)
    shuffled = rows.iloc[::-1].reset_index(drop=True)
    with pytest.raises(AssertionError):
        pd.testing.assert_frame_equal(compare._pairs_frame(a, b, shuffled),
                                      _merged_then_filtered(a, b))
