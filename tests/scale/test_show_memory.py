"""``attnbench show`` (and ``--all``) read a run once and hold no record (issue 29): memory per
added journal line, measured as in tests/scale/test_reader_memory.py (the peaks of a 4,000- and a
2,000-line journal, differenced, so fixed costs cancel), with a mutant that lists the records.
The end of ``attnbench run`` prints through the same :class:`RunSummary`."""

import contextlib
import os
import tracemalloc
from pathlib import Path

import pytest

import attnbench.cli as cli
import attnbench.results.columnar as columnar
import attnbench.report.show.sorted_lines as sorted_lines
from attnbench.report.show.case_lines import case_lines
from attnbench.report.show.sorted_lines import SortedLines
from attnbench.results.store import load_records
from helpers import in_fresh_interpreter, simulated_run

LINES = 2000
"""Lines of the smaller journal; the larger has twice as many. ~1 s each."""
BOUND_BYTES = 512
"""Peak growth allowed per added line. Measured: show 156-176 B, show --all 152-172 B (the
first pass's id, its dict slot and line number; --all's lines go to disk past a chunk: 500
lines here), ~3x under; the mutant that lists the records 7,520 B: ~15x over."""


def _run(tmp_path: Path, lines: int) -> Path:
    return simulated_run(tmp_path, lines, failing_every=10)  # failing: the listed 50


def _peak(argv: list[str]) -> int:
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        tracemalloc.start()
        try:
            assert cli.main(argv) == 0
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


def _growth_per_line(tmp_path: Path, *flags: str) -> float:
    """Peak memory of ``attnbench show`` per journal line, fixed costs cancelled."""
    small, large = _run(tmp_path, LINES), _run(tmp_path, 2 * LINES)
    _peak(["show", str(small), *flags])  # what the first call imports is no growth
    return (_peak(["show", str(large), *flags])
            - _peak(["show", str(small), *flags])) / LINES


BLOCK_BYTES = 64 << 10
"""show's blocks of columns (results/columnar.py): ~50 lines, so both journals are many blocks,
as 10^6 records are (a block of 4 MiB is memory that does not grow with the journal, but a
journal of one block would measure it as growth)."""


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(sorted_lines, "CHUNK", 500)  # --all spills as at 10^6 cases
    monkeypatch.setattr(columnar, "BLOCK_BYTES", BLOCK_BYTES)
    # Reading the manifest allocates its 16 MiB cap for a moment (read_bounded): a fixed peak
    # that would hide any growth under 16 MiB / 4,000 lines. The journal's pass is measured.
    monkeypatch.setattr(cli, "load_manifest", lambda run_dir: {"run_id": "memory"})


def fresh_growth_per_line(tmp: str, *flags: str) -> float:
    """:func:`_growth_per_line` as run in a fresh interpreter (helpers.in_fresh_interpreter),
    with the fixture's settings."""
    sorted_lines.CHUNK = 500
    columnar.BLOCK_BYTES = BLOCK_BYTES
    cli.load_manifest = lambda run_dir: {"run_id": "memory"}
    return _growth_per_line(Path(tmp), *flags)


@pytest.mark.parametrize("flags", [(), ("--all",)])
def test_show_holds_no_record(tmp_path, flags):
    growth = in_fresh_interpreter("test_show_memory", "fresh_growth_per_line", str(tmp_path),
                                  *flags)
    assert growth < BOUND_BYTES


def test_the_bound_catches_a_show_that_lists_the_records(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "stream_records", lambda run_dir: iter(load_records(run_dir)))
    monkeypatch.setattr(cli, "stream_record_blocks",  # show's columns (results/columnar.py)
                        lambda run_dir: iter(load_records(run_dir)))
    assert _growth_per_line(tmp_path) > 3 * BOUND_BYTES


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_sorted_lines_sort_stably_in_any_chunks(chunk):
    # Mutants: merging by key alone (equal labels out of order), a lost last chunk.
    pairs = [(f"label{i % 5}", f"line{i}") for i in range(23)][::-1]
    with SortedLines(chunk) as lines:
        for key, line in pairs:
            lines.add(key, line)
        assert list(lines) == [line for _, line in sorted(pairs, key=lambda p: p[0])]


def test_show_all_lists_records_sorted_by_label_in_their_order(tmp_path):
    run_dir = _run(tmp_path, 40)
    records = load_records(run_dir)
    expected = [line for _, line in sorted(
        zip((str(r["label"]) for r in records), _unsorted_lines(records)), key=lambda p: p[0])]
    assert list(case_lines(records)) == expected


def _unsorted_lines(records):
    from attnbench.report.show.case_lines import label_and_line

    return [label_and_line(r)[1] for r in records]
