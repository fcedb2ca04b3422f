"""``attnbench status`` streams the journal (issue 29): what it holds per case is an id and a
shared verdict string, never the record, so a 1M-record journal is read in ~0.25 GiB
(benchmarks/make_journal.py). :func:`last_records` (each case's last record, two streamed passes)
is what ``load_records`` returns, held by nobody: the building block for show, export,
compare."""

import json
import tracemalloc
from pathlib import Path

import attnbench.dispatch.detach as detach
from attnbench.dispatch.detach import journal_verdicts
from attnbench.results.ledger import last_records
from attnbench.results.store import load_records
from helpers import simulated_record

LINES = 2000
"""Enough lines that per-line growth dwarfs the reader's own buffers; ~0.2 s."""
BOUND_BYTES = 512
"""Peak growth allowed per line. Measured 103 B (the id string and its dict slot): ~5x under;
a reader that keeps each record (a 1.2 KB line parsed) measured 7,523 B: ~15x over."""


def _journal(tmp_path: Path) -> Path:
    from attnbench.sweep.case import make_case

    line = simulated_record(make_case("memory", {"backend": "naive", "dtype": "bf16",
                                                 "gpu": "SIM-A"}))
    with open(tmp_path / "records.jsonl", "w") as fh:
        for i in range(LINES):
            fh.write(json.dumps({**line, "id": f"{i:016x}"}) + "\n")
    return tmp_path


def _peak_per_line(run_dir: Path) -> float:
    tracemalloc.start()
    try:
        counts, unreadable = journal_verdicts(run_dir)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert counts == {"pass": LINES} and unreadable == 0
    return peak / LINES


def test_status_holds_no_record(tmp_path):
    assert _peak_per_line(_journal(tmp_path)) < BOUND_BYTES


def test_the_bound_catches_a_reader_that_keeps_records(tmp_path, monkeypatch):
    kept = []
    real_loads = json.loads

    def keeping_loads(data):  # mutant: every record parsed is also kept
        kept.append(real_loads(data))
        return kept[-1]

    monkeypatch.setattr(detach.json, "loads", keeping_loads)
    assert _peak_per_line(_journal(tmp_path)) > 3 * BOUND_BYTES


def _journal_with_retries(tmp_path: Path) -> Path:
    """LINES records of LINES // 2 cases: every case twice, its second record a ``fail``."""
    from attnbench.sweep.case import make_case

    line = simulated_record(make_case("memory", {"backend": "naive", "dtype": "bf16",
                                                 "gpu": "SIM-A"}))
    with open(tmp_path / "records.jsonl", "w") as fh:
        for attempt in (1, 2):
            for i in range(LINES // 2):
                verdict = "pass" if attempt == 1 else "fail"
                fh.write(json.dumps({**line, "id": f"{i:016x}", "verdict": verdict,
                                     "attempt": attempt}) + "\n")
    (tmp_path / "manifest.json").write_text("{}")  # load_records asks only that it exists
    return tmp_path


def test_last_records_are_load_records_streamed(tmp_path):
    # Mutant: the first record of each case wins (a resumed run's retries would not show).
    run_dir = _journal_with_retries(tmp_path)
    streamed = {r["id"]: r for r in last_records(run_dir / "records.jsonl")}
    assert streamed == {r["id"]: r for r in load_records(run_dir)}
    assert len(streamed) == LINES // 2 and {r["verdict"] for r in streamed.values()} == {"fail"}


def test_last_records_hold_no_record(tmp_path):
    # Measured 95 B a line; the mutant that lists the records (load_records) 3,819 B: 7x over.
    run_dir = _journal_with_retries(tmp_path)
    tracemalloc.start()
    try:
        for _ in last_records(run_dir / "records.jsonl"):
            pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak / LINES < BOUND_BYTES
