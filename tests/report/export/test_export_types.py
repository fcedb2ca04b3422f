"""``attnbench export`` keeps types (issue 27): counts are integers (``fwd_n`` was 6.0), a packed
case's lengths a list of integers where the format has lists (JSON, Parquet; it was JSON text)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from attnbench.cli import main
from attnbench.errors import EXIT_OK


@pytest.fixture(scope="module")
def packed_run(tiny, tmp_path_factory) -> Path:
    """The tiny run with one naive case made a pack of two documents (40 + 24 = its 64)."""
    dst = tmp_path_factory.mktemp("export") / "run"
    shutil.copytree(tiny, dst, ignore=shutil.ignore_patterns("dashboard", "compare-*", ".lock"))
    lines, done = [], False
    for line in (dst / "records.jsonl").read_text().splitlines():
        rec = json.loads(line)
        case = rec["case"]
        if not done and case["backend"] == "naive" and case["seqlen_q"] == case["seqlen_kv"] \
                == 64 and rec["verdict"] == "pass" and case["cp"] == case["tp"] == 1:
            case.update(seqlens_q=[40, 24], seqlens_kv=[40, 24], batch=2)
            done = True
        lines.append(json.dumps(rec))
    assert done, "the tiny run has a 64-token naive case"
    (dst / "records.jsonl").write_text("\n".join(lines) + "\n")
    return dst


def test_json_counts_are_integers_and_lengths_lists(packed_run, capsys):
    assert main(["export", str(packed_run), "--format", "json"]) == EXIT_OK
    rows = json.loads(capsys.readouterr().out)
    packed = [r for r in rows if r["seqlens_q"]]
    assert len(packed) == 1 and packed[0]["seqlens_q"] == [40, 24], packed
    timed = [r for r in rows if r["fwd_n"] is not None]
    assert timed and all(type(r["fwd_n"]) is int for r in timed)  # noqa: E721 (not bool)
    judged = [r for r in rows if r["out_nonfinite"] is not None]
    assert judged and all(type(r["out_nonfinite"]) is int for r in judged)  # noqa: E721
    assert any(r["fwd_n"] is None for r in rows)  # a case that died: null, not NaN


def test_parquet_counts_are_integers_and_lengths_lists(packed_run, tmp_path):
    pytest.importorskip("pyarrow")
    out = tmp_path / "cases.parquet"
    assert main(["export", str(packed_run), "--format", "parquet", "--out", str(out)]) == EXIT_OK
    back = pd.read_parquet(out)
    assert str(back.fwd_n.dtype) in ("Int64", "int64"), back.fwd_n.dtype
    lengths = back.seqlens_q.dropna().tolist()
    assert [list(x) for x in lengths] == [[40, 24]], lengths
