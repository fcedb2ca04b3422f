"""The report's frame is stored compactly (issue 29: ``report`` under 1 GiB at 10^6 records):
text columns of a few values as categories, a chunk's all-NaN number column as its length, a
panel's rows as only the columns it reads. None of that may change a value or an order: the
frame read in chunks must hold what one DataFrame of every record holds
(:func:`attnbench.report.data.frame`, what ``export`` writes), and sort and group the same."""

import numpy as np
import pandas as pd
import pytest

import attnbench.report.reading as reading
from attnbench.report.data import frame, load_records, load_manifest
from attnbench.report.reading import CATEGORICAL, UNREAD, read_run

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
