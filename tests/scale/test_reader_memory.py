"""``attnbench status`` streams the journal (issue 29): what it holds per case is an id and a
shared verdict string, never the record, so a 1M-record journal is read in ~0.25 GiB
(benchmarks/make_journal.py). :func:`last_records` (each case's last record, two streamed passes)
is what ``load_records`` returns, held by nobody: the building block for show, export,
compare."""

import json
import os
import tracemalloc
from pathlib import Path

import attnbench.dispatch.detach as detach
from attnbench.dispatch.detach import journal_verdicts
from attnbench.results.ledger import last_records
from attnbench.results.store import load_records
from helpers import in_fresh_interpreter, simulated_record

LINES = 2000
"""Lines of the smaller journal; the larger has twice as many. ~0.5 s."""
BOUND_BYTES = 512
"""Peak growth allowed per line: the difference of the peaks of a 4,000- and a 2,000-line
journal, per added line, so that fixed costs (the read buffer, which Python sizes by the file
system's block: 4 KiB here, 1 MiB on CI's -- 578 B a line when measured as peak / lines) cancel.
Measured 103 B (the id string and its dict slot): ~5x under; a reader that keeps each record (a
1.2 KB line parsed) measured 7,523 B: ~15x over."""


def _journal(tmp_path: Path, lines: int = LINES) -> Path:
    from attnbench.sweep.case import make_case

    line = simulated_record(make_case("memory", {"backend": "naive", "dtype": "bf16",
                                                 "gpu": "SIM-A"}))
    run_dir = tmp_path / f"run{lines}"
    run_dir.mkdir()
    with open(run_dir / "records.jsonl", "w") as fh:
        for i in range(lines):
            fh.write(json.dumps({**line, "id": f"{i:016x}"}) + "\n")
    return run_dir


def _peak(read, run_dir: Path) -> int:
    tracemalloc.start()
    try:
        read(run_dir)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _growth_per_line(read, tmp_path: Path, journal=_journal) -> float:
    """Peak memory of ``read`` per journal line, fixed costs cancelled (see BOUND_BYTES)."""
    small, large = journal(tmp_path, LINES), journal(tmp_path, 2 * LINES)
    return (_peak(read, large) - _peak(read, small)) / LINES


def _status(run_dir: Path) -> None:
    counts, unreadable = journal_verdicts(run_dir)
    assert sum(counts.values()) == counts.get("pass") and unreadable == 0


def _peak_per_line(tmp_path: Path) -> float:
    return _growth_per_line(_status, tmp_path)


def status_growth(tmp: str, buffering: str = "") -> float:
    """:func:`_peak_per_line` as run in a fresh interpreter (helpers.in_fresh_interpreter);
    with ``buffering``, the journal's read buffer forced to that many bytes."""
    if buffering:
        import attnbench.results.journal as journal

        real_fdopen, size = os.fdopen, int(buffering)
        journal.os.fdopen = lambda fd, mode, buffering=-1: real_fdopen(fd, mode, buffering=size)
    return _peak_per_line(Path(tmp))


def test_status_holds_no_record(tmp_path):
    assert in_fresh_interpreter("test_reader_memory", "status_growth",
                                str(tmp_path)) < BOUND_BYTES


def test_the_bound_catches_a_reader_that_keeps_records(tmp_path, monkeypatch):
    kept = []
    real_loads = json.loads

    def keeping_loads(data):  # mutant: every record parsed is also kept
        kept.append(real_loads(data))
        return kept[-1]

    monkeypatch.setattr(detach.json, "loads", keeping_loads)
    assert _peak_per_line(tmp_path) > 3 * BOUND_BYTES


def test_a_large_read_buffer_is_a_fixed_cost_not_growth(tmp_path):
    # What CI met: a file system whose block size makes Python's read buffer 1 MiB.
    assert in_fresh_interpreter("test_reader_memory", "status_growth", str(tmp_path),
                                str(1 << 20)) < BOUND_BYTES


LAST_RECORDS_BOUND = 1024
"""Peak growth allowed per line of :func:`_journal_with_retries` for :func:`last_records`.
Measured 490 B (2026-12-02, at 6f273df and after: half a retried case's id, its place, its
slots in the first pass's dict and in the set of cases sent): 2.1x under. Each record carries a
4,000-character reason, so the mutant that lists the records measures the records, not how
one parser shares their keys (orjson's shared keys halved it to 1,214 B without that text):
it measured 4,450-4,700 B, 4.3x over or more."""
REASON_CHARS = 4000


def _journal_with_retries(tmp_path: Path, lines: int = LINES) -> Path:
    """``lines`` records of ``lines // 2`` cases: every case twice, its second record a ``fail``;
    each with a reason of :data:`REASON_CHARS` characters (what a listed record would hold)."""
    from attnbench.sweep.case import make_case

    line = simulated_record(make_case("memory", {"backend": "naive", "dtype": "bf16",
                                                 "gpu": "SIM-A"}))
    run_dir = tmp_path / f"retries{lines}"
    run_dir.mkdir()
    with open(run_dir / "records.jsonl", "w") as fh:
        for attempt in (1, 2):
            for i in range(lines // 2):
                verdict = "pass" if attempt == 1 else "fail"
                fh.write(json.dumps({**line, "id": f"{i:016x}", "verdict": verdict,
                                     "attempt": attempt,
                                     "reason": f"{i} " + "r" * REASON_CHARS}) + "\n")
    (run_dir / "manifest.json").write_text("{}")  # load_records asks only that it exists
    return run_dir


def test_last_records_are_load_records_streamed(tmp_path):
    # Mutant: the first record of each case wins (a resumed run's retries would not show).
    run_dir = _journal_with_retries(tmp_path)
    streamed = {r["id"]: r for r in last_records(run_dir / "records.jsonl")}
    assert streamed == {r["id"]: r for r in load_records(run_dir)}
    assert len(streamed) == LINES // 2 and {r["verdict"] for r in streamed.values()} == {"fail"}


def _read_last_records(run_dir: Path) -> None:
    for _ in last_records(run_dir / "records.jsonl"):
        pass


def last_records_growth(tmp: str) -> float:
    return _growth_per_line(_read_last_records, Path(tmp), _journal_with_retries)


def test_last_records_hold_no_record(tmp_path):
    # Bound and mutant: LAST_RECORDS_BOUND. In a fresh interpreter: see
    # helpers.in_fresh_interpreter.
    assert in_fresh_interpreter("test_reader_memory", "last_records_growth",
                                str(tmp_path)) < LAST_RECORDS_BOUND


def test_the_bound_catches_last_records_that_list_them(tmp_path, monkeypatch):
    def listed(run_dir: Path) -> None:  # mutant: load_records, the whole list
        load_records(run_dir)

    assert _growth_per_line(listed, tmp_path, _journal_with_retries) > 3 * LAST_RECORDS_BOUND
