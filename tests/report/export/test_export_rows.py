"""``attnbench export --format csv`` and ``json`` written from the rows
(report/export/rows.py, issue 29: export's time) print the bytes of the frames path
(``frames_chunks``: pandas' ``to_csv`` and ``to_dict``, the oracle): real runs, and rows made to reach every format change a
chunk may have to be mended for, in chunks of 1, 3 and all rows."""

import json
import math
import random
import shutil
from pathlib import Path

import pytest

import attnbench.report.export.chunks as export_chunks
import attnbench.report.read.jobs as read_jobs
from attnbench.report.export.command import frames_chunks, from_rows
from attnbench.report.synthetic import write_synthetic_run

CHUNKS = (1, 3, 10**9)


def _both(run_dirs, chunk, monkeypatch, rows_of=None, fmt="csv"
          ) -> tuple[bytes | None, bytes]:
    monkeypatch.setattr(export_chunks, "CHUNK_ROWS", chunk)
    fast = from_rows(run_dirs, fmt, rows_of)
    fast = None if fast is None else b"".join(fast)
    return fast, b"".join(frames_chunks(run_dirs, fmt, rows_of))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("export_csv")
    one = write_synthetic_run(root / "one", size="small")  # crashes: int/None exit codes
    two = write_synthetic_run(root / "two", size="small", gpus=("A100",), seed=1)
    lines = (two / "records.jsonl").read_text().splitlines()
    odd = json.loads(lines[3])  # text CSV must quote (dicts and packs: the odd rows below)
    odd.update(reason='a "quoted", comma\nand a newline', label="ünïcode, too")
    lines[3] = json.dumps(odd)
    (two / "records.jsonl").write_text("\n".join(lines) + "\n")
    return [one, two]


@pytest.mark.parametrize("fmt", ["csv", "json"])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_runs_are_written_as_the_frames_write_them(runs, chunk, fmt, monkeypatch):
    for run_dirs in (runs[:1], runs[1:], runs):
        fast, frames = _both(run_dirs, chunk, monkeypatch, fmt=fmt)
        assert fast is not None, "real runs take the rows' path"
        assert fast == frames


def test_the_tiny_run_too(tiny, tmp_path, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(tiny, run, ignore=shutil.ignore_patterns("dashboard", "compare-*", ".lock"))
    for chunk, fmt in zip(CHUNKS * 2, ["csv"] * 3 + ["json"] * 3):
        fast, frames = _both([run], chunk, monkeypatch, fmt=fmt)
        assert fast is not None and fast == frames


def _odd_rows(seed: int, late: str) -> list[dict]:
    """Rows of flatten's kind of values; ``late``: what the last rows bring that the first
    did not (a format change for chunks already written)."""
    rng = random.Random(seed)
    texts = ["plain", "", "a,b", 'say "x"', "two\nlines", " spaced ", "nan", "ü"]
    rows = []
    for i in range(40):
        last = i >= 30
        rows.append({
            "run_id": "r", "id": f"c{i}", "label": rng.choice(texts), "verdict": "pass",
            "reason": rng.choice(texts),
            "f": rng.choice([0.1, -0.0, 1e16, 1e-5, 123456789.125, math.inf, math.nan, 2.0]),
            "code": (rng.choice([-11, 137]) if last and late in ("int", "big") else None)
            if not (late == "big" and last) else 2**60,
            "fwd_n": rng.choice([5.0, 20.0, math.nan]) if not (last and late == "fraction")
            else 2.5,
            "out_nonfinite": math.nan if not last else 0.0,
            "x_n": rng.choice([3, 4]),
            "noisy": rng.choice([True, False]),
            "maybe": rng.choice([True, None]),
            "mask": rng.choice(["none", {"window": 64}]),
            "seqlens_q": rng.choice([None, (40, 24)]),
            "mixed": rng.choice([1, 2]) if not (last and late == "text") else "x",
            "seq": i if not (last and late in ("none", "cr")) else None,
            "all_nan": math.nan,
        })
    rows[0]["fwd_n"] = 5  # an int among a count column's floats
    if late == "cr":  # a lone CR is not quoted (lineterminator "\n"): CSV cannot read it back
        rows[0]["label"] = "cr\rhere"
    return rows


@pytest.mark.parametrize("fmt", ["csv", "json"])
@pytest.mark.parametrize("late", ["int", "fraction", "none", "text", "big", "cr", ""])
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("seed", range(3))
def test_odd_rows_are_written_as_the_frames_write_them(late, chunk, seed, fmt, monkeypatch):
    # Mutants, each failing here: no mending (``_mended`` returning the chunk as it was:
    # ``code``'s -11 stays -11, not -11.0, in chunks written before the column gained a None
    # -- late "int", "none"); formats guessed once, from the first chunk (the same); NaN
    # printed as ``nan`` (``_cells`` returning float columns untouched); whole floats of an
    # Int64 count column printed as floats (fwd_n 5.0); JSON's infinities not null (raises).
    rows = _odd_rows(seed, late)
    fast, frames = _both([Path("r")], chunk, monkeypatch, lambda _: iter(rows), fmt)
    if late in ("text", "big") or late == "cr" and fmt == "csv":  # not mended (an int past 2^53; F -> N; a CR in a
        # chunk to mend): the frames write it
        assert fast is None or fast == frames
    else:
        assert fast is not None, "these rows take the rows' path"
        assert fast == frames


def test_rows_of_several_shapes_go_to_the_frames(monkeypatch):
    rows = [{"a": 1, "b": "x"}, {"a": 2}]
    fast, frames = _both([Path("r")], 10**9, monkeypatch, lambda _: iter(rows))
    assert fast is None and frames.startswith(b"a,b\n")


# --jobs N (report/export/pool.py): workers print line ranges typed alone; the main process
# takes them in order and mends them to the table's formats. Ranges of 1 and 3 lines put every
# type change (a crash's int exit code among Nones) across worker boundaries.

def _retried(runs: list[Path], root: Path) -> Path:
    """The first run with three cases recorded again (a retried case: yielded where it first
    appeared, its last record), one of them twice."""
    run = root / "retried"
    shutil.copytree(runs[0], run, ignore=shutil.ignore_patterns("dashboard", ".lock"))
    lines = (run / "records.jsonl").read_text().splitlines()
    again = []
    for n, i in enumerate((1, 4, 4, 9)):
        record = json.loads(lines[i])
        record.update(reason=f"attempt {n}", attempt=2 + n)
        again.append(json.dumps(record))
    (run / "records.jsonl").write_text("\n".join(lines[:6] + again[:2] + lines[6:] + again[2:])
                                       + "\n")
    return run


def _pooled(run_dirs, fmt, jobs, lines) -> bytes | None:
    from attnbench.report.export.command import _formats
    from attnbench.report.export.pool import pool_chunks

    chunks = pool_chunks(run_dirs, fmt, jobs, _formats, lines)
    return None if chunks is None else b"".join(chunks)


def _typed_alone(monkeypatch) -> None:
    """Workers not told the kinds of the pieces before theirs (as the first few are not):
    every type change across ranges is mended here."""
    import attnbench.report.export.rows as export_rows

    monkeypatch.setattr(export_rows.RowSpool, "known_kinds", lambda self: {})


@pytest.mark.parametrize("alone", [False, True])
@pytest.mark.parametrize("fmt", ["csv", "json"])
@pytest.mark.parametrize("jobs, lines", [(2, 1), (3, 3)])
def test_jobs_print_the_bytes_of_one_process(runs, tmp_path, fmt, jobs, lines, alone,
                                             monkeypatch):
    import attnbench.report.export.rows as export_rows

    if alone:
        _typed_alone(monkeypatch)
    mended = []
    for name in ("_mended", "_mended_json"):
        real = getattr(export_rows, name)
        monkeypatch.setattr(export_rows, name,
                            lambda data, mend, real=real: mended.append(mend) or real(data, mend))
    run_dirs = [_retried(runs, tmp_path), *runs]
    monkeypatch.setattr(export_chunks, "CHUNK_ROWS", lines)
    serial = b"".join(from_rows(run_dirs, fmt))
    assert all(f"attempt {n}".encode() in serial for n in (0, 2, 3))  # each case's last
    assert b"attempt 1" not in serial
    mended.clear()
    assert _pooled(run_dirs, fmt, jobs, lines) == serial
    if lines == 1 and alone:  # a line's row alone holds an exit code, or a None
        assert mended, "pieces typed alone are mended"


def test_the_bytes_catch_pieces_out_of_order_or_not_mended(runs, monkeypatch):
    # Mutants: the newest piece taken first; a type one piece saw (an int exit code where
    # others hold None) not mended in the pieces that did not see it. Each changes the bytes.
    import attnbench.report.export.pool as export_pool
    import attnbench.report.export.rows as export_rows

    monkeypatch.setattr(export_chunks, "CHUNK_ROWS", 1)
    _typed_alone(monkeypatch)
    serial = b"".join(from_rows(runs[:1], "csv"))
    with monkeypatch.context() as m:
        m.setattr(read_jobs, "_next_done", lambda pending: pending.pop())
        assert _pooled(runs[:1], "csv", 2, 3) not in (serial, None)
    monkeypatch.setattr(export_rows, "_mended", lambda data, mend: data)
    assert _pooled(runs[:1], "csv", 2, 1) not in (serial, None)


def test_a_workers_bad_line_reads_as_with_one_process(runs, tmp_path, capsys, monkeypatch):
    # Two bad lines in different ranges: the first in the journal is named, as by --jobs 1
    # (mutant: pieces taken newest first names the second).
    import attnbench.cli as cli
    import attnbench.report.export.pool as export_pool

    run = tmp_path / "bad"
    shutil.copytree(runs[0], run, ignore=shutil.ignore_patterns("dashboard", ".lock"))
    lines = (run / "records.jsonl").read_text().splitlines()
    for i in (5, 20):
        record = json.loads(lines[i])
        record["attempt"] = 0  # checked when a worker parses the line: not by the first pass
        lines[i] = json.dumps(record)
    (run / "records.jsonl").write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(read_jobs, "MIN_POOL_BYTES", 0)
    monkeypatch.setattr(export_pool, "TASK_LINES", 4)

    def told(jobs: int) -> tuple[int, str, str]:
        rc = cli.main(["export", str(run), "--jobs", str(jobs)])
        out, err = capsys.readouterr()
        return rc, out, err

    rc, out, err = told(1)
    assert rc != 0 and out == "" and f"records.jsonl:6: " in err and len(err.splitlines()) == 1
    assert told(2) == (rc, out, err)
    monkeypatch.setattr(read_jobs, "_next_done", lambda pending: pending.pop())
    assert told(2) != (rc, out, err)


def _die(*_):
    """A worker killed (out of memory, by a signal)."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_that_dies_is_one_line(runs, monkeypatch):
    import attnbench.report.export.pool as export_pool
    from attnbench.errors import ReportError

    monkeypatch.setattr(export_pool, "_piece", _die)  # sent to the workers by name
    with pytest.raises(ReportError, match=r"records.jsonl: a worker of --jobs 2 died .*--jobs 1$"):
        _pooled(runs[:1], "csv", 2, 5)
