"""``report --jobs`` / ``compare --jobs`` (report/read/pool.py): a run read by several
processes in line ranges is the run one process reads, frame and tallies alike.

Ranges of 3 and 5 lines against chunks of 4 rows put chunk boundaries, retried cases, new
categories, type changes and tied failures across ranges. Mutants it must catch: ranges joined
out of order, a tally merged in the wrong order, a failure's position not the journal's."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import attnbench.report.read.pool as read_pool
import attnbench.report.read.reader as reading
import attnbench.report.read.jobs as read_jobs
from attnbench.errors import ReportError
from attnbench.report.read.code_changes import BackendCodeTally
from attnbench.report.read.environment import EnvironmentTally
from attnbench.report.read.reader import RunReader, read_run
from attnbench.report.synthetic import write_synthetic_run
from attnbench.report.read.trends import SeriesCollector
from attnbench.results.ledger import line_ranges

CHUNK = 4
"""Rows a chunk in these tests (5,000 in a report): ranges of 3 and 5 lines straddle them."""


def _rewrite(run: Path, edit) -> None:
    lines = (run / "records.jsonl").read_text().splitlines()
    (run / "records.jsonl").write_text("\n".join(edit(lines)) + "\n")


def _halves(lines: list[str]) -> list[str]:
    """Two environments and, per backend, two codes of equal counts (ties: the first seen
    wins, so merged in the wrong order the other does), and each failing record again on
    another GPU kind near the end (the same label: tied in the failures' order but by
    position)."""
    recs = [json.loads(line) for line in lines]
    per_backend: dict[str, list[dict]] = {}
    for rec in recs:
        per_backend.setdefault(rec["case"]["backend"], []).append(rec)
    for group in per_backend.values():
        group = group[:len(group) // 2 * 2]
        for i, rec in enumerate(group):
            second = i >= len(group) // 2
            rec["env"] = {**rec["env"], "torch": "2.6" if second else "2.5",
                          "backend": {"module": rec["case"]["backend"],
                                      "version": "2" if second else "1"}}
    again = []
    for rec in recs:
        if rec["verdict"] not in ("pass", "unsupported", "skipped"):
            copy = json.loads(json.dumps(rec))
            copy["case"]["gpu"] = copy["env"]["gpu_kind"] = "L4"
            copy["id"] = "f" + rec["id"][1:]
            again.append(copy)
    return [json.dumps(r) for r in recs[:-6] + again + recs[-6:]]


def _retried(lines: list[str]) -> list[str]:
    """Three cases recorded again (yielded where they first appeared, their last record)."""
    again = []
    for n, i in enumerate((1, 4, 4, 9)):
        record = json.loads(lines[i])
        record.update(reason=f"attempt {n}", attempt=2 + n)
        again.append(json.dumps(record))
    return lines[:6] + again[:2] + lines[6:] + again[2:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("read_pool")
    plain = write_synthetic_run(root / "plain", size="small")
    made = {"plain": plain}
    for name, edit in (("halves", _halves), ("retried", _retried)):
        made[name] = root / name
        shutil.copytree(plain, made[name], ignore=shutil.ignore_patterns("dashboard", ".lock"))
        _rewrite(made[name], edit)
    return made


def _facts(run) -> dict:
    """What a page reads of a Run, in order."""
    return {"environments": [(e.view, e.records, sorted(e.devices)) for e in run.environments],
            "backend_code": list(run.backend_code.items()),
            "series": [(s.backend, s.tensor, s.key, s.label, s.by_length()) for s in run.series],
            "parity": run.parity, "crashes": list(run.crashes.items()),
            "commonality": run.commonality}


def assert_same(a, b) -> None:
    pd.testing.assert_frame_equal(a.frame, b.frame, check_exact=True)
    assert list(a.frame.dtypes) == list(b.frame.dtypes)
    fa, fb = _facts(a), _facts(b)
    pd.testing.assert_frame_equal(fa.pop("parity"), fb.pop("parity"), check_exact=True)
    assert fa == fb


def _in_ranges(run: Path, lines: int, tallies: bool = True) -> RunReader:
    """What the pool does, in this process (so that mutants reach it): each range read by
    its own reader, merged in journal order."""
    path = run / "records.jsonl"
    parts = line_ranges(path, lines)
    merged = RunReader(run.name, None, tallies, chunk_rows=CHUNK)
    for part, start in zip(parts, read_pool._starts(parts)):
        what, other = read_pool._read_range(str(path), run.name, part, start, None, tallies,
                                            CHUNK)
        assert what == "read"
        merged.merge(other)
    return merged


def _serial(run: Path, tallies: bool = True) -> RunReader:
    from attnbench.results.ledger import last_records

    reader = RunReader(run.name, None, tallies, chunk_rows=CHUNK)
    for rec in last_records(run / "records.jsonl"):
        reader.add(rec)
    return reader


def _run(reader: RunReader, run: Path):
    return reading.run_of(reader, run, {})


@pytest.mark.parametrize("name", ["plain", "halves", "retried"])
@pytest.mark.parametrize("lines", [1, 3, 5, 100])
def test_ranges_merged_in_order_are_the_serial_read(runs, name, lines):
    serial, merged = _serial(runs[name]), _in_ranges(runs[name], lines)
    assert sorted(merged.failures) == sorted(serial.failures)
    assert_same(_run(merged, runs[name]), _run(serial, runs[name]))


def test_the_data_puts_ties_and_chunks_across_ranges(runs):
    run = _run(_serial(runs["halves"]), runs["halves"])
    counts = [e.records for e in run.environments]
    assert counts[0] == counts[1]  # a tie: the first seen first
    serial = _serial(runs["halves"])
    keys = [key[:-1] for key, _, _ in serial.failures]
    assert len(keys) > len(set(keys))  # failures tied but by position


def _reversed(cls):
    """A mutant ``merge``: ``other``'s tally first, then this one's."""
    real = cls.merge

    def merge(self, other):
        real(other, self)
        self.__dict__.update(other.__dict__)
    return merge


@pytest.mark.parametrize("tally", [EnvironmentTally, BackendCodeTally, SeriesCollector])
def test_a_tally_merged_in_the_wrong_order_is_caught(runs, tally, monkeypatch):
    serial = _run(_serial(runs["halves"]), runs["halves"])
    monkeypatch.setattr(tally, "merge", _reversed(tally))
    with pytest.raises(AssertionError):
        assert_same(_run(_in_ranges(runs["halves"], 5), runs["halves"]), serial)


def test_a_failure_position_not_offset_is_caught(runs, monkeypatch):
    serial = _serial(runs["halves"])
    monkeypatch.setattr(RunReader, "_position", lambda self: self.count - self.start)
    assert sorted(_in_ranges(runs["halves"], 5).failures) != sorted(serial.failures)


def test_ranges_joined_out_of_order_are_caught(runs, monkeypatch):
    # Refused (Misaligned: the pool then reads with one process); with that check gone, the
    # frame differs from the serial read's.
    path = runs["plain"] / "records.jsonl"
    parts = line_ranges(path, 5)
    readers = [read_pool._read_range(str(path), "plain", part, start, None, True, CHUNK)[1]
               for part, start in zip(parts, read_pool._starts(parts))]
    readers[1], readers[2] = readers[2], readers[1]
    with pytest.raises(reading.Misaligned):
        merged = RunReader("plain", chunk_rows=CHUNK)
        for other in readers:
            merged.merge(other)
    merged = RunReader("plain", chunk_rows=CHUNK)
    for other in readers:
        other.start = merged.count
        merged.merge(other)
    with pytest.raises(AssertionError):
        assert_same(_run(merged, runs["plain"]), _run(_serial(runs["plain"]), runs["plain"]))


# --- the pool itself: spawned workers (~2 s each pool) ---

@pytest.mark.parametrize("jobs, lines", [(2, 3), (3, 5)])
@pytest.mark.parametrize("tallies", [True, False])
def test_jobs_read_the_run_of_one_process(runs, jobs, lines, tallies, monkeypatch):
    monkeypatch.setattr(reading, "CHUNK_ROWS", CHUNK)  # sent to the workers by the reader
    columns = None if tallies else ["id", "verdict", "backend", "reason", "fwd_median_ms"]
    for name in ("halves", "retried"):
        serial = read_run(runs[name], columns, tallies)
        pooled = read_pool.pool_read(runs[name], jobs, columns, tallies, lines)
        assert pooled is not None  # not the serial path again
        assert_same(pooled, serial)


def test_out_of_order_in_the_pool_is_read_again_by_one_process(runs, monkeypatch):
    monkeypatch.setattr(reading, "CHUNK_ROWS", CHUNK)
    monkeypatch.setattr(read_jobs, "_next_done", lambda pending: pending.pop())
    assert read_pool.pool_read(runs["plain"], 2, task_lines=3) is None


def test_a_blank_line_moves_the_records_after_it_so_one_process_reads(runs, tmp_path,
                                                                        monkeypatch):
    run = tmp_path / "blank"
    shutil.copytree(runs["retried"], run, ignore=shutil.ignore_patterns("dashboard", ".lock"))
    _rewrite(run, lambda lines: lines[:2] + [""] + lines[2:])
    monkeypatch.setattr(reading, "CHUNK_ROWS", CHUNK)
    monkeypatch.setattr(read_jobs, "MIN_POOL_BYTES", 0)
    assert read_pool.pool_read(run, 2, task_lines=3) is None
    assert_same(read_pool.read_run_jobs(run, 2), read_run(run))


def test_a_workers_bad_line_reads_as_with_one_process(runs, tmp_path, capsys, monkeypatch):
    # Two bad lines in different ranges: the first in the journal is named, as by --jobs 1.
    import attnbench.cli as cli

    run = tmp_path / "bad"
    shutil.copytree(runs["plain"], run, ignore=shutil.ignore_patterns("dashboard", ".lock"))

    def bad(lines):
        for i in (5, 20):
            record = json.loads(lines[i])
            record["attempt"] = 0  # checked when a worker parses the line: not by pass 1
            lines[i] = json.dumps(record)
        return lines
    _rewrite(run, bad)
    monkeypatch.setattr(read_jobs, "MIN_POOL_BYTES", 0)
    monkeypatch.setattr(read_pool, "TASK_LINES", 4)

    def told(command: str, jobs: int) -> tuple[int, str, str]:
        rc = cli.main([command, str(run), *([str(runs["plain"])] if command == "compare"
                                            else []), "--jobs", str(jobs)])
        out, err = capsys.readouterr()
        return rc, out, err

    for command in ("report", "compare"):
        rc, out, err = told(command, 1)
        assert rc == 2 and out == "" and "records.jsonl:6: " in err
        assert len(err.splitlines()) == 1
        assert told(command, 2) == (rc, out, err)


def _die(*_):
    """A worker killed (out of memory, by a signal)."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_that_dies_is_one_line(runs, monkeypatch):
    monkeypatch.setattr(read_pool, "_read_range", _die)  # sent to the workers by name
    with pytest.raises(ReportError, match=r"records.jsonl: a worker of --jobs 2 died .*--jobs 1$"):
        read_pool.pool_read(runs["plain"], 2, task_lines=5)


@pytest.mark.parametrize("command", ["report", "compare", "export"])
@pytest.mark.parametrize("given", ["0", "65", "two"])
def test_jobs_past_the_limit_is_one_line(runs, command, given, capsys):
    import attnbench.cli as cli
    from attnbench.report.read.jobs import JOBS_LIMIT

    with pytest.raises(SystemExit) as exc:
        cli.main([command, str(runs["plain"]), *([str(runs["halves"])] if command == "compare"
                                                 else []), "--jobs", given])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    expected = f"a whole number of processes, 1 to {JOBS_LIMIT}"
    assert f"--jobs/-j: got '{given}', expected {expected}" in err
