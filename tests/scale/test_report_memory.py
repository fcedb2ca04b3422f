"""``attnbench report`` and ``attnbench compare`` read a run once, streamed (issue 29): what they
hold per case is a frame row (and a few tallies), never the record, so a 10^6-record journal fits
in a bounded process (docs/cluster.md). Growth per added record, as in test_reader_memory: the
peaks of a 4,000- and a 2,000-record journal apart, per added record, so fixed costs (the read
buffer, pandas' own) cancel."""

import copy
import json
import statistics
import tracemalloc
from pathlib import Path

import pytest

import attnbench.report.read.reader as reading
from attnbench.report.compare.comparison import load_compared
from attnbench.report.read.reader import read_run
from helpers import in_fresh_interpreter, simulated_record

RECORDS = 2000
"""Records of the smaller journal; the larger has twice as many. ~2 s each read."""
CHUNK_ROWS = 500
"""Rows per chunk here (50,000 in a real run): so that both journals span several chunks and
what grows is the frame, not the chunk buffer (bounded by CHUNK_ROWS whatever the journal)."""
REPORT_BOUND = 1536
"""Bytes a report's load may grow per added record: its frame row (~100 columns), the
concatenation of the chunks, the tallies. Measured 537 B on 2026-12-02 (1,009 B before sizes
int32, keys int64 and the columns no record has sharing one array): 2.9x under; the mutant that
also keeps each record measured 5,836 B (orjson shares the keys of the records it parses; 8,503
B as json parses them): 3.8x over. (tracemalloc sees numpy's arrays and Python's objects, not
pyarrow's text buffers: the benchmark's RSS figures count those.)"""
COMPARE_BOUND = 1024
"""... and a comparison's (~30 columns, no tallies). Measured 412 B: 2.5x under; the mutant
that keeps each record measured 5,414 B with orjson (7,883 B with json): 5.3x over."""


def _journal(tmp_path: Path, records: int) -> Path:
    from attnbench.sweep.case import make_case

    line = simulated_record(make_case("memory", {"backend": "naive", "dtype": "bf16",
                                                 "gpu": "SIM-A"}))
    run_dir = tmp_path / f"run{records}"
    run_dir.mkdir()
    with open(run_dir / "records.jsonl", "w") as fh:
        for i in range(records):
            fh.write(json.dumps({**line, "id": f"{i:016x}",
                                 "case": {**line["case"], "seed": i}}) + "\n")
    return run_dir  # no manifest: reading one costs a fixed 16 MiB peak (its size cap), which
    # would hide a growth of a few MB


def _peak(read, run_dir: Path) -> int:
    tracemalloc.start()
    try:
        run = read(run_dir)
        assert len(run.frame) == int(run_dir.name.removeprefix("run"))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _growth_per_record(read, tmp_path: Path, repeats: int = 1, times: int = 2) -> float:
    """Growth per added record from a RECORDS- to a ``times * RECORDS``-record journal, of the
    median peak of ``repeats`` reads of each."""
    small, large = _journal(tmp_path, RECORDS), _journal(tmp_path, times * RECORDS)
    _peak(read, small)  # imports and caches (pandas' first DataFrame) before measuring
    return (statistics.median(_peak(read, large) for _ in range(repeats))
            - statistics.median(_peak(read, small) for _ in range(repeats))
            ) / ((times - 1) * RECORDS)


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(reading, "CHUNK_ROWS", CHUNK_ROWS)


@pytest.fixture
def keeping_records(monkeypatch):
    """Mutant: the reader also keeps every record it reads (the records list of old)."""
    kept = []
    real_add = reading.RunReader.add

    def add(self, rec):
        kept.append(rec)
        real_add(self, rec)

    monkeypatch.setattr(reading.RunReader, "add", add)
    return kept


def fresh_growth_per_record(tmp: str, reader: str) -> float:
    """:func:`_growth_per_record` of ``read_run`` or ``load_compared``, in a fresh interpreter
    (helpers.in_fresh_interpreter), with small chunks."""
    reading.CHUNK_ROWS = CHUNK_ROWS
    return _growth_per_record({"read_run": read_run, "load_compared": load_compared}[reader],
                              Path(tmp))


def test_report_load_holds_a_row_per_case_not_the_record(tmp_path):
    assert in_fresh_interpreter("test_report_memory", "fresh_growth_per_record", str(tmp_path),
                                "read_run") < REPORT_BOUND


def test_the_report_bound_catches_a_load_that_keeps_records(tmp_path, small_chunks,
                                                            keeping_records):
    assert _growth_per_record(read_run, tmp_path) > 3 * REPORT_BOUND


def test_compare_load_holds_a_few_numbers_per_case(tmp_path):
    assert in_fresh_interpreter("test_report_memory", "fresh_growth_per_record", str(tmp_path),
                                "load_compared") < COMPARE_BOUND


def test_the_compare_bound_catches_a_load_that_keeps_records(tmp_path, small_chunks,
                                                             keeping_records):
    assert _growth_per_record(load_compared, tmp_path) > 3 * COMPARE_BOUND


# --jobs 2 (report/read/pool.py): this process's growth, within the bounds above; the workers
# hold a range each, whatever the journal. Measured 414 B (read_run; 758 B by one process in
# the same session) and 428 B (load_compared; 410 B); the mutant that keeps a copy of every
# range's reader measured 6,035 B: 5.9x over COMPARE_BOUND. A pooled peak depends on how many
# finished ranges wait to be merged when it is reached (timing): one read's growth ranged
# -471..1,050 B over 12 runs (the small journal's peak 6.4-8.9 MB, the large one's in two modes
# 0.3 MB apart), so the pooled bound is judged from a 2,000- to an 8,000-record journal (the
# noise over 6,000 records, not 2,000) on the median of POOL_REPEATS peaks of each.
POOL_TASK_LINES = 200
"""Lines a range here (10,000 in a report): 10-20 ranges, so that what is in flight (4) is a
part of the journal and what grows is the frame."""
POOL_REPEATS, POOL_TIMES = 3, 4
# (pool_read: journals of any size go to the pool; read_run_jobs sends small ones to one process)


def _pooled(reader: str):
    """``read_run`` or ``load_compared`` with ``--jobs 2``, never the one-process path."""
    from attnbench.report.compare.comparison import COMPARED
    from attnbench.report.read.pool import pool_read

    columns, tallies = (None, True) if reader == "read_run" else (COMPARED, False)

    def read(run_dir: Path):
        run = pool_read(run_dir, 2, columns, tallies)
        assert run is not None
        return run
    return read


def _small_pool() -> None:
    import attnbench.report.read.pool as read_pool

    reading.CHUNK_ROWS = CHUNK_ROWS
    read_pool.TASK_LINES = POOL_TASK_LINES


def fresh_pooled_growth_per_record(tmp: str, reader: str) -> float:
    """:func:`_growth_per_record` of ``reader`` with ``--jobs 2``, in a fresh interpreter."""
    _small_pool()
    return _growth_per_record(_pooled(reader), Path(tmp), POOL_REPEATS, POOL_TIMES)


@pytest.mark.parametrize("reader, bound", [("read_run", REPORT_BOUND),
                                           ("load_compared", COMPARE_BOUND)])
def test_a_pooled_load_grows_as_one_process_does(tmp_path, reader, bound):
    assert in_fresh_interpreter("test_report_memory", "fresh_pooled_growth_per_record",
                                str(tmp_path), reader) < bound


def test_the_bound_catches_a_pool_that_keeps_its_ranges(tmp_path, monkeypatch):
    # Mutant: every range's reader kept (with its rows and chunks) after it is merged.
    import attnbench.report.read.pool as read_pool

    monkeypatch.setattr(reading, "CHUNK_ROWS", CHUNK_ROWS)
    monkeypatch.setattr(read_pool, "TASK_LINES", POOL_TASK_LINES)
    kept = []
    real = reading.RunReader.merge
    monkeypatch.setattr(reading.RunReader, "merge",
                        lambda self, other: kept.append(copy.deepcopy(other))
                        or real(self, other))
    assert _growth_per_record(_pooled("load_compared"), tmp_path) > 2 * COMPARE_BOUND
