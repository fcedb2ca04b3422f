"""A packed case does not inherit the sizes its own lengths imply from ``defaults`` (issue 27:
``include[13]: seqlen_q: got 128, expected 300`` for a 128 the user wrote only in defaults)."""

from __future__ import annotations

import pytest

from attnbench.errors import SweepError
from attnbench.sweep.load import load_sweep

SWEEP = """
name: packs
defaults: {batch: 4, seqlen_q: 128, seqlen_kv: 128, heads_q: 4, head_dim: 32, dtype: fp32}
axes:
  backend: [naive]
include:
  - {backend: naive, seqlens_q: [100, 200]}
  - {backend: naive, varlen: {lengths: uniform, min: 10, max: 90, total: 300, seed: 0}}
  - {backend: naive, seqlens_kv: [70, 9, 40]}
  - {backend: naive, seqlens_q: [100, 200], seqlen_q: 250}
"""


def _load(tmp_path, text):
    path = tmp_path / "packs.yaml"
    path.write_text(text)
    return load_sweep(path)


def test_a_pack_takes_its_sizes_from_its_lengths_not_from_defaults(tmp_path):
    text = SWEEP.replace("  - {backend: naive, seqlens_q: [100, 200], seqlen_q: 250}\n", "")
    cases = {tuple(c.seqlens_kv): c for c in _load(tmp_path, text).cases if c.seqlens_q}
    two = cases[(100, 200)]
    assert (two.batch, two.seqlen_q, two.seqlen_kv) == (2, 300, 300)
    mixed = next(c for k, c in cases.items() if sum(k) == 300 and k != (100, 200))
    assert mixed.seqlen_q == 300 and mixed.batch == len(mixed.seqlens_q)
    cache = cases[(70, 9, 40)]  # seqlens_kv alone: defaults' seqlen_q queries per sequence
    assert cache.seqlens_q == (128, 128, 128) and cache.seqlen_kv == 119 and cache.batch == 3
    dense = next(c for c in _load(tmp_path, text).cases if not c.seqlens_q)
    assert (dense.batch, dense.seqlen_q) == (4, 128)  # dense cases keep the defaults


def test_a_size_written_in_the_include_itself_must_still_agree(tmp_path):
    with pytest.raises(SweepError, match=r"include\[3\]: seqlen_q: got 250, expected 300"):
        _load(tmp_path, SWEEP)
