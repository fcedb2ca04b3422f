"""``last_records`` (results/ledger.py): each case's last record, streamed, in the order of
``load_records`` -- what show and export print in -- with ids read unparsed on the first pass
and every line checked on the second. Memory: tests/scale/test_reader_memory.py."""

import json
from pathlib import Path

import pytest

import attnbench.results.ledger as ledger
from attnbench.errors import RunDirError
from attnbench.results.ledger import last_records
from attnbench.results.store import load_records
from helpers import simulated_record


def _line(i: int, verdict: str = "pass", **extra) -> str:
    from attnbench.sweep.case import make_case

    case = make_case("ledger", {"backend": "naive", "dtype": "bf16", "gpu": "SIM-A",
                                "seed": i})
    return json.dumps({**simulated_record(case, verdict), "id": f"{i:016x}", **extra},
                      separators=(",", ":"))


def _run(tmp_path: Path, lines: list[str], end: str = "\n") -> Path:
    (tmp_path / "manifest.json").write_text("{}")  # load_records asks only that it exists
    (tmp_path / "records.jsonl").write_text("\n".join(lines) + end)
    return tmp_path


def test_retried_cases_come_where_they_first_appeared(tmp_path):
    # Mutant: yield in the order of the last lines (case 1 after 3): show's ties and export's
    # rows would move.
    lines = [_line(i) for i in range(4)] + [_line(3, "fail", attempt=2),
                                            _line(1, "fail", attempt=2),
                                            _line(1, "crash", attempt=3), ""]
    run = _run(tmp_path, lines)
    records = list(last_records(run / "records.jsonl"))
    assert records == load_records(run)
    assert [(r["id"][-1], r["verdict"]) for r in records] == [
        ("0", "pass"), ("1", "crash"), ("2", "pass"), ("3", "fail")]


@pytest.mark.parametrize("tail, kept", [
    ('{"id":"0000000000000009","ca', 3),  # torn mid-write, its id readable: skipped
    (_line(9), 4),                         # only its newline lost: a whole record, kept
])
def test_a_last_line_without_newline_is_read_as_load_records_does(tmp_path, tail, kept):
    run = _run(tmp_path, [_line(i) for i in range(3)] + [tail], end="")
    assert list(last_records(run / "records.jsonl")) == load_records(run)
    assert len(load_records(run)) == kept


def test_ids_written_otherwise_are_parsed(tmp_path):
    record = json.loads(_line(1))
    spaced = json.dumps(record)  # json.dumps' blanks: still read unparsed
    later = json.dumps({"verdict": "fail", **record})  # id not first: parsed
    run = _run(tmp_path, [_line(0), spaced, _line(2), later])
    assert list(last_records(run / "records.jsonl")) == load_records(run)
    assert [r["verdict"] for r in load_records(run)] == ["pass", "pass", "pass"]


def test_a_line_with_two_ids_is_refused(tmp_path):
    # JSON keeps the last "id"; the first pass read the first. Without the check the line
    # reads as a journal rewritten under the reader (a wrong reason), or, when the second id
    # is a retried case's, puts that case where it never was.
    two = _line(1)[:-1] + ',"id":"00000000000000ff"}'
    run = _run(tmp_path, [_line(0), two])
    with pytest.raises(RunDirError, match=r"records.jsonl:2: a record with two ids"):
        list(last_records(run / "records.jsonl"))


def test_a_bad_line_is_refused_like_load_records(tmp_path):
    run = _run(tmp_path, [_line(0), _line(1).replace('"verdict":"pass"', '"verdict":"great"')])
    with pytest.raises(RunDirError, match=r"records.jsonl:2: verdict"):
        list(last_records(run / "records.jsonl"))


def test_a_journal_rewritten_between_the_passes_is_refused(tmp_path, monkeypatch):
    run = _run(tmp_path, [_line(0), _line(1), _line(1, "fail", attempt=2)])
    path = run / "records.jsonl"
    real = ledger._last_lines

    def then_rewrite(p):
        out = real(p)
        path.write_text("\n".join([_line(1), _line(0)]) + "\n")  # same ids, other lines
        return out

    monkeypatch.setattr(ledger, "_last_lines", then_rewrite)
    with pytest.raises(RunDirError, match="changed while it was read"):
        list(last_records(path))
