"""``attnbench export`` in chunks writes what the whole table would (report/export/chunks.py):
each chunk is typed with one value of every kind its columns hold across the runs, so a column
of ints and Nones stays float64 in a chunk of ints alone (``-11.0``, not ``-11``), a column a
chunk holds only Nones keeps its string type in Parquet, and count columns are integers only
when every chunk's are whole."""

import io
import json
from pathlib import Path

import pytest

import attnbench.report.export.chunks as export_chunks
from attnbench.report.export.command import export_chunks as chunks_of
from attnbench.report.synthetic import write_synthetic_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("export")
    one = write_synthetic_run(root / "one", size="small")  # crashes: crash_exit_code int/None
    two = write_synthetic_run(root / "two", size="small", gpus=("A100",), seed=1)
    lines = (two / "records.jsonl").read_text().splitlines()
    retried = json.loads(lines[2])  # a retried case: its last record, where it first came
    retried.update(verdict="fail", reason="again", attempt=2)
    with open(two / "records.jsonl", "a") as fh:
        fh.write(json.dumps(retried) + "\n")
    return [one, two]


def _export(run_dirs, fmt, chunk, monkeypatch) -> bytes:
    monkeypatch.setattr(export_chunks, "CHUNK_ROWS", chunk)
    return b"".join(chunks_of(run_dirs, fmt))


@pytest.mark.parametrize("fmt", ["csv", "json"])
@pytest.mark.parametrize("chunk", [1, 13])
def test_chunks_write_the_bytes_of_one_chunk(runs, fmt, chunk, monkeypatch):
    # Mutant: chunks typed alone (no kinds in front): crash_exit_code's -11.0 becomes -11 in
    # a chunk of one crash (chunks of 1 fail; of 13, this run's crashes never fill one).
    for run_dirs in (runs[:1], runs):
        whole = _export(run_dirs, fmt, 10**9, monkeypatch)
        assert _export(run_dirs, fmt, chunk, monkeypatch) == whole


@pytest.mark.parametrize("chunk", [1, 13])
def test_parquet_chunks_have_the_schema_and_values_of_one(runs, chunk, monkeypatch):
    # The mutant above fails both: a chunk without a crash types crash_signal as null.
    pq = pytest.importorskip("pyarrow.parquet")
    whole = pq.read_table(io.BytesIO(_export(runs, "parquet", 10**9, monkeypatch)))
    table = pq.read_table(io.BytesIO(_export(runs, "parquet", chunk, monkeypatch)))
    assert table.schema == whole.schema and table.schema.metadata == whole.schema.metadata
    assert table.to_pylist() == whole.to_pylist()


def test_an_empty_run_exports_its_header(tmp_path, monkeypatch):
    (tmp_path / "records.jsonl").write_text("")
    (tmp_path / "manifest.json").write_text(json.dumps({"run_id": "empty"}))
    text = _export([tmp_path], "csv", 5, monkeypatch).decode()
    assert text.startswith("run_id,id,label,backend,verdict,reason,") and text.count("\n") == 1
    assert _export([tmp_path], "json", 5, monkeypatch) == b"[\n\n]\n"


@pytest.mark.parametrize("rows", [
    [{"a": 1, "b": "x"}, {"b": "y", "a": None}, {"b": "z", "a": 2.5}],   # one shape, two orders
    [{"a": 1, "b": "x"}, {"a": 2}, {"a": 3, "b": None, "c": True}],       # several shapes
    [{"a": 1}, {"a": None}],                                              # one column
])
def test_spooled_rows_come_back_as_the_frame_of_their_dicts(rows, monkeypatch):
    # Rows of one shape are spooled as tuples of their values (issue 29: export's time); the
    # frame must be the one pandas makes of the dicts. Mutant: the values taken in each row's
    # own key order (dict.values()): the second row of the first case swaps a and b.
    import pandas as pd

    from attnbench.report.export.command import _run_frame

    monkeypatch.setattr(export_chunks, "CHUNK_ROWS", 2)  # the second chunk gains a column
    with export_chunks.spool_runs([Path("r")], lambda _: iter(rows)) as spool:
        frames = [frame.iloc[front:] for frame, front in spool.frames(_run_frame)]
    got = pd.concat(frames, ignore_index=True)
    want = pd.DataFrame(rows)
    assert list(got.columns) == list(want.columns) and got.dtypes.equals(want.dtypes)
    assert got.equals(want)
