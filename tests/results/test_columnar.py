"""The journal as Arrow columns (results/columnar.py, issue 44): the records of
``last_records``, in its order, where blocks are columns; every line that might read otherwise
goes the per-line path, so a bad line raises the very message it always did (file and line).

Each hostile line is put in the middle of a clean journal read in small blocks (the line's
own block, and only it, is read line by line) and the outcome -- the records, or the error --
compared with the per-line path's."""

import json
from pathlib import Path

import pytest

import attnbench.results.columnar as columnar
from attnbench.errors import RunDirError
from attnbench.results.columnar import RecordBlock, block_records, last_record_blocks
from attnbench.results.ledger import last_records
from helpers import simulated_record

pytest.importorskip("pyarrow")


def _record(i: int, verdict: str = "pass") -> dict:
    from attnbench.sweep.case import make_case

    case = make_case("columnar", {"backend": "naive", "dtype": "bf16", "gpu": "SIM-A",
                                  "seed": i, "heads_q": 8, "heads_kv": 2 if i % 3 else 8})
    return {**simulated_record(case, verdict), "id": f"{i:016x}"}


def _line(i: int, verdict: str = "pass") -> str:
    return json.dumps(_record(i, verdict), separators=(",", ":"))


def _journal(tmp_path: Path, lines: list[str], end: str = "\n") -> Path:
    (tmp_path / "manifest.json").write_text("{}")
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(lines) + end, errors="surrogateescape")
    return path


CLEAN = [_line(i, "fail" if i % 7 == 0 else "pass") for i in range(40)]


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    # ~6 records a block: a journal of 40 lines is several blocks, a bad line spoils one
    monkeypatch.setattr(columnar, "BLOCK_BYTES", 8 << 10)


def _items(path: Path, columns: bool = True):
    return list(last_record_blocks(path, columns))


def _records(items) -> list[dict]:
    out = []
    for item in items:
        out += block_records(item) if isinstance(item, RecordBlock) else [item]
    return out


def _same(a: dict, b: dict) -> bool:
    """Equal as JSON writes them, a field absent where the other is null; a number outside the
    case compared as a float (a NUMBER field is a float64 column: 5 reads 5.0; no reader tells
    them apart there), the case's to its type (``0`` and ``0.0`` print otherwise)."""
    def plain(value, exact):
        if isinstance(value, dict):
            return {k: plain(v, exact or k == "case") for k, v in value.items()
                    if v is not None}
        if isinstance(value, list):
            return [plain(v, exact) for v in value]
        if isinstance(value, int) and not isinstance(value, bool) and not exact:
            return float(value)
        return value

    return json.dumps(plain(a, False), sort_keys=True) == \
        json.dumps(plain(b, False), sort_keys=True)


def _outcome(path: Path, columns: bool):
    try:
        return _records(_items(path, columns))
    except RunDirError as exc:
        return str(exc)


def _assert_same_outcome(path: Path) -> list:
    """The outcome of both paths, equal; returns the columnar path's items (or [] on error)."""
    old, new = _outcome(path, False), _outcome(path, True)
    if isinstance(old, str) or isinstance(new, str):
        assert new == old
        return []
    assert len(new) == len(old) and all(map(_same, new, old))
    assert all(isinstance(r, dict) for r in _items(path, False))
    return _items(path)


def test_a_clean_journal_is_read_as_columns(tmp_path):
    path = _journal(tmp_path, CLEAN)
    items = _assert_same_outcome(path)
    assert items and all(isinstance(i, RecordBlock) for i in items)  # no line read alone
    assert sum(i.table.num_rows for i in items) == len(CLEAN)
    assert [i.first for i in items][0] == 1
    assert [r["id"] for r in _records(items)] == [r["id"] for r in last_records(path)]


def test_without_pyarrow_every_line_goes_the_per_line_path(tmp_path, monkeypatch):
    path = _journal(tmp_path, CLEAN)
    monkeypatch.setattr(columnar, "pa", None)
    items = _items(path)
    assert all(isinstance(i, dict) for i in items) and len(items) == len(CLEAN)


DEEP = '{"id":"00000000000000ff","case":' + "[" * 100_000 + "]" * 100_000 + "}"


def _edited(i: int, **fields) -> str:
    record = _record(i)
    for key, value in fields.items():
        target = record
        *parents, last = key.split("__")
        for p in parents:
            target = target[p]
        target[last] = value
    return json.dumps(record, separators=(",", ":"))


HOSTILE = {
    # bad lines: the per-line path's error, file and line
    "truncated": _line(20)[:300],
    "wrong type": _edited(20, case__batch="2"),
    "bool for a number": _edited(20, duration_s=True),
    "deep": DEEP,
    "NaN": _line(20).replace('"duration_s":0.25', '"duration_s":NaN'),
    "1e400": _line(20).replace('"duration_s":0.25', '"duration_s":1e400'),
    "huge int": _line(20).replace('"duration_s":0.25', f'"duration_s":{10 ** 30}'),
    "huge int in a metric": _line(20).replace('"wall_s":0.25', f'"wall_s":{-10 ** 19}'),
    "two ids": _line(20)[:-1] + ',"id":"zzzz"}',
    "a key twice": _line(20)[:-1] + ',"verdict":"fail"}',
    "null case field": _edited(20, case__batch=None),
    "null in a list of numbers": _edited(20, timing__fwd__samples_ms=[1.0, None]),
    "unknown verdict": _edited(20, verdict="great"),
    "bad case value": _edited(20, case__dtype="bf17"),
    "cp * tp too large": _edited(20, case__cp=16, case__tp=16),
    "attempt 0": _edited(20, attempt=0),
    "empty id": _line(20).replace('"id":"0000000000000014"', '"id":""'),
    "a list": "[1, 2]",
    "two objects": _line(20) + " " + _line(41),
    "not UTF-8": _line(20).replace("simulated", "simul\xffted").encode("latin-1").decode(
        "utf-8", "surrogateescape"),
    # odd but good lines: the same records
    "int dropout": _edited(20, case__dropout=0),
    "negative zero softcap": _edited(20, case__softcap=-0.0),
    "escapes": _edited(20, reason='a "quoted" \\ reason\n\u00e9\ud83d\ude00'),
    "lone surrogate": _line(20).replace('"reason":"simulated"', '"reason":"\\ud800"'),
    "non-ASCII": json.dumps({**_record(20), "reason": "é"}, ensure_ascii=False,
                            separators=(",", ":")),
    "blank line": "",
    "spaces": json.dumps(_record(20)),
    "unknown field": _edited(20, newer={"x": 1}),
    "null label": _edited(20, label=None),
    "no reason": json.dumps({k: v for k, v in _record(20).items() if k != "reason"}),
    "case without a field": json.dumps({**_record(20), "case": {
        k: v for k, v in _record(20)["case"].items() if k != "window_left"}}),
    "int for a float metric": _edited(20, timing__fwd__tflops=400),
    "long id digits in a string": _edited(20, reason="1" * 30 + " e0000"),
    "retried case": _edited(3, verdict="fail", attempt=2),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_line_reads_as_the_per_line_path_reads_it(tmp_path, name):
    lines = CLEAN[:20] + [HOSTILE[name]] + CLEAN[21:]
    if name == "retried case":
        lines = CLEAN[:20] + [HOSTILE[name]] + CLEAN[20:]
    path = _journal(tmp_path, lines)
    items = _assert_same_outcome(path)
    if items:  # read: its block line by line, the rest still columns
        assert any(isinstance(i, RecordBlock) for i in items)


def test_a_bad_line_is_named_with_its_file_and_line(tmp_path):
    path = _journal(tmp_path, CLEAN[:20] + [HOSTILE["NaN"]] + CLEAN[21:])
    with pytest.raises(RunDirError, match=rf"^{path}:21: "):
        _items(path)


@pytest.mark.parametrize("tail", [_line(40)[:200], _line(40)])
def test_a_last_line_without_newline(tmp_path, tail):
    path = _journal(tmp_path, CLEAN + [tail], end="")
    _assert_same_outcome(path)


@pytest.mark.parametrize("block", [8 << 10, 4 << 20])  # the line over many blocks, in one
def test_a_line_too_long_to_hold(tmp_path, monkeypatch, block):
    monkeypatch.setattr(columnar, "BLOCK_BYTES", block)
    long = _edited(20, reason="x" * (columnar.MAX_LINE_BYTES + 10))
    for lines, end in ((CLEAN[:20] + [long] + CLEAN[21:], "\n"), (CLEAN[:20] + [long], "")):
        path = _journal(tmp_path, lines, end)
        assert "a line of more than" in _outcome(path, True)
        assert _outcome(path, True) == _outcome(path, False)


def test_blocks_of_every_size_give_the_same_records(tmp_path, monkeypatch):
    path = _journal(tmp_path, CLEAN)
    expected = _records(_items(path, False))
    for size in (1, 700, 1300, 5000, 1 << 20):
        monkeypatch.setattr(columnar, "BLOCK_BYTES", size)
        assert all(map(_same, _records(_items(path)), expected))


def test_after_a_stretch_of_odd_blocks_columns_come_back(tmp_path, monkeypatch):
    # Mutant: once MISSES blocks in a row fail, never trying again (a journal with a stretch
    # of escaped texts read line by line to its end).
    monkeypatch.setattr(columnar, "BLOCK_BYTES", 1)  # a line a block
    monkeypatch.setattr(columnar, "RETRY", 4)
    odd = [_edited(i, reason="a \\ b") for i in range(40, 46)]
    path = _journal(tmp_path, odd + CLEAN)
    items = _assert_same_outcome(path)
    assert all(isinstance(i, dict) for i in items[:6])
    assert sum(isinstance(i, RecordBlock) for i in items) >= len(CLEAN) - 4
