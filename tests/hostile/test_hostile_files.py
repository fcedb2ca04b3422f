"""Hostile files in run directories (issue 25, items 7, 10, 11, 12): a shared run directory may
hold a planted link at any name attnbench writes, a journal of one 2 GiB line, a sweep with a
5,000-digit integer. None of it may be followed, read whole, or become a traceback.

Each test names the bug it catches (its mutant) where the check is not obvious.
"""

from __future__ import annotations

import json
import os
import time
import tracemalloc
from pathlib import Path

import pytest

from attnbench import cli
from attnbench.dispatch.detach import journal_verdicts
from attnbench.errors import RunDirError
from attnbench.results.journal import MAX_LINE_BYTES, journal_lines, journal_records
from attnbench.results.records import make_record
from attnbench.results.store import RunStore, load_records
from attnbench.sweep.load import load_sweep
from helpers import DATA

SWEEP = """name: files
defaults: {backend: naive, batch: 1, seqlen_q: 32, heads_q: 2, head_dim: 16, dtype: fp32}
axes: {seed: [0, 1, 2]}
"""
HUGE = 24 << 20
"""A journal line of 24 MiB: 24 times the cap, large enough that reading it whole shows in the
traced peak (the old reader held the file and its split lines: > 48 MiB)."""
PEAK = 8 << 20
"""What a bounded reader may hold at once: the cap (1 MiB) plus a chunk, a few times over."""


def _run(tmp: Path, name: str = "run", verdicts=("pass", "fail")) -> Path:
    sweep_file = tmp / f"{name}.yaml"
    sweep_file.write_text(SWEEP)
    out = tmp / name
    store = RunStore(out, load_sweep(sweep_file), command=["attnbench", "run"])
    for case, verdict in zip(store.sweep.cases, verdicts):
        store.append(make_record(case, verdict=verdict, env={"host": "h", "device": "cpu"}))
    store.close()
    return out


def _append_huge(run: Path, ended: bool = True) -> None:
    with open(run / "records.jsonl", "ab") as fh:
        chunk = b"x" * (1 << 20)
        fh.write(b'{"id": "')
        for _ in range(HUGE >> 20):
            fh.write(chunk)
        fh.write(b'"}' + (b"\n" if ended else b""))


def _peak(fn):
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# -- item 10: the journal read a line at a time, each line capped -----------------------------
def test_a_huge_journal_line_is_one_line_naming_it_without_reading_it_whole(tmp_path):
    """Mutant: ``path.read_bytes()`` then split (the old reader) -- peak > 48 MiB."""
    run = _run(tmp_path)
    _append_huge(run)

    def load():
        with pytest.raises(RunDirError) as caught:
            load_records(run)
        return str(caught.value)

    message, peak = _peak(load)
    assert f"records.jsonl:3: a line of more than {MAX_LINE_BYTES} bytes" in message
    assert "\n" not in message
    assert peak < PEAK, f"held {peak} bytes reading a {HUGE}-byte line"


def test_status_counts_a_huge_line_as_unreadable_without_holding_it(tmp_path):
    """Mutant: ``for line in fh`` (a line read whole, however long) -- peak > 24 MiB."""
    run = _run(tmp_path)
    _append_huge(run)
    (counts, unreadable), peak = _peak(lambda: journal_verdicts(run))
    assert dict(counts) == {"pass": 1, "fail": 1} and unreadable == 1
    assert peak < PEAK


def test_a_line_at_the_cap_is_read_and_one_over_it_is_not(tmp_path):
    """The cap's margin: a line of exactly ``limit`` bytes is whole; ``limit + 1`` is
    oversize (mutant: ``<`` for ``<=`` in the cap test)."""
    path = tmp_path / "j"
    path.write_bytes(b"a" * 10 + b"\n" + b"b" * 11 + b"\n" + b"c" * 3)
    lines = list(journal_lines(path, limit=10))
    assert [(x.number, x.data, x.ended, x.oversize) for x in lines] == [
        (1, b"a" * 10, True, False), (2, b"", True, True), (3, b"ccc", False, False)]


def test_journal_records_streams_and_skips_a_torn_last_line(tmp_path):
    run = _run(tmp_path)
    with open(run / "records.jsonl", "ab") as fh:
        fh.write(b'{"id": "tor')
    records = journal_records(run / "records.jsonl")
    assert next(records)[0] == 1  # a generator: nothing read beyond what is asked
    assert [n for n, _ in records] == [2]


def test_resume_refuses_a_torn_last_line_longer_than_the_cap(tmp_path):
    """Mutant: the repair truncating inside the long line (leaving half of it for the next
    record to be glued to), or reading the whole file to find the last newline."""
    run = _run(tmp_path)
    _append_huge(run, ended=False)
    size = (run / "records.jsonl").stat().st_size
    with pytest.raises(RunDirError, match="last line is longer than"):
        RunStore(run, load_sweep(tmp_path / "run.yaml"), command=["attnbench", "run"])
    assert (run / "records.jsonl").stat().st_size == size


def test_resume_still_repairs_a_torn_last_line(tmp_path):
    run = _run(tmp_path)
    with open(run / "records.jsonl", "ab") as fh:
        fh.write(b'{"id": "tor')
    store = RunStore(run, load_sweep(tmp_path / "run.yaml"), command=["attnbench", "run"])
    store.close()
    assert (run / "records.jsonl").read_bytes().endswith(b"}\n")
    assert len(load_records(run)) == 2


# -- item 11: integers too long for Python's digit limit -------------------------------------
TINY = str(DATA / "tiny.yaml")
BIG_SWEEP = ("name: big\ndefaults: {backend: naive, batch: 1, seqlen_q: 32, heads_q: 2, "
             "head_dim: 16, dtype: fp32}\naxes: {seed: [VALUE]}\n")


@pytest.mark.parametrize("value", ["9" * 4301, "9" * 100_000, "0x" + "f" * 4000,
                                   "0b" + "1" * 20_000, "-" + "1" * 5000])
def test_a_sweep_integer_over_the_digit_limit_is_one_line(tmp_path, capsys, value):
    """Mutant: the loader without ``construct_yaml_int`` -- Python's ``ValueError: Exceeds the
    limit (4300 digits)`` traceback (decimal), or a 4,800-digit seed printed into messages
    (hex/binary, which Python's limit does not cover)."""
    sweep = tmp_path / "big.yaml"
    sweep.write_text(BIG_SWEEP.replace("VALUE", value))
    assert cli.main(["validate", str(sweep)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "more than 4300 decimal digits" in err and "line 3" in err


def test_an_integer_at_the_digit_limit_is_read_as_an_integer():
    """The margin: 4,300 digits is Python's own limit, and is still read (then refused as a
    seed by the field's range, which is the field's business)."""
    from attnbench.validation import load_yaml

    assert load_yaml("a: " + "9" * 4300, "x")["a"] == int("9" * 4300)


def test_a_set_value_over_the_digit_limit_is_one_line(capsys):
    assert cli.main(["validate", TINY, "-s", "seed=" + "9" * 5000]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("attnbench: error: -s seed:")


# -- item 10: a sweep near the 1 MiB limit is answered fast -----------------------------------
def test_a_sweep_near_the_size_limit_is_refused_in_well_under_a_second_of_cpu(tmp_path, capsys):
    """0.93 MB of axis values (130,000 seeds). Pure-Python PyYAML spent 4.7 s of CPU parsing it
    here (40 s under load); libyaml's parser 0.8 s. Mutant: ``_FastStrictLoader`` on
    ``yaml.SafeLoader`` -- over the 2.5 s bound (measured as this process's CPU time, so a
    loaded machine does not fail it)."""
    import resource

    if not hasattr(__import__("yaml"), "CSafeLoader"):
        pytest.skip("PyYAML without libyaml: the pure-Python parser is the only one")
    sweep = tmp_path / "wide.yaml"
    # x 8 batches: 1,040,000 cases, over the 10^6 a sweep may have
    sweep.write_text(BIG_SWEEP.replace("VALUE", ", ".join(map(str, range(130_000))))
                     .replace("]}", "], batch: [1, 2, 3, 4, 5, 6, 7, 8]}"))
    assert 0.8e6 < sweep.stat().st_size < 1 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    assert cli.main(["validate", str(sweep)]) == 2
    spent = resource.getrusage(resource.RUSAGE_SELF).ru_utime - before
    # refused while counting (issue 41 item 7: 130,000 listed values, over the 10,000 a list
    # may have), before the product is counted
    assert "line 3, column 14: a list of more than 10,000 items" in capsys.readouterr().err
    assert spent < 2.5, f"{spent:.1f} s of CPU to refuse a 0.93 MB sweep"


# -- item 7: no planted link is followed ------------------------------------------------------
def _outside(tmp: Path) -> Path:
    victim = tmp / "outside" / "victim.txt"
    victim.parent.mkdir()
    victim.write_text("precious\n")
    return victim


def _plant(path: Path, victim: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(victim, path)


def test_links_at_the_old_predictable_temporary_names_are_never_followed(tmp_path):
    """The names attnbench used to write (``manifest.json.<pid>.tmp``, ``driver.json.<pid>.tmp``,
    ``.clock.<host>.<pid>.<thread>``), each a link to a file outside: the run writes its
    manifest, journal, driver state and clock probe, and the file outside is unchanged.
    Mutant: any of them back on ``Path.write_text`` of a name a neighbour can compute."""
    import socket
    import threading

    from attnbench.dispatch.driver_state import read_state, write_state
    from attnbench.results.lock import RunLock

    victim = _outside(tmp_path)
    run = _run(tmp_path)  # resumed below: its manifest is rewritten
    pid, host, thread = os.getpid(), socket.gethostname(), threading.get_ident()
    for name in (f"manifest.json.{pid}.tmp", f"driver.json.{pid}.tmp",
                 f".clock.{host}.{pid}.{thread}"):
        _plant(run / name, victim)
    store = RunStore(run, load_sweep(tmp_path / "run.yaml"), command=["attnbench", "run"])
    store.append(make_record(store.sweep.cases[2], verdict="pass", env={"host": "h2"}))
    write_state(run, {"state": "running"})
    assert RunLock(run).fs_now() > 0
    store.close()
    assert victim.read_text() == "precious\n"
    assert read_state(run)["state"] == "running" and len(load_records(run)) == 3
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]


def test_a_journal_that_is_a_link_is_refused_in_one_line(tmp_path, capsys):
    """Mutant: ``open(records.jsonl, "a")`` -- appends the next record to the file outside."""
    victim = _outside(tmp_path)
    run = _run(tmp_path)
    (run / "records.jsonl").unlink()
    _plant(run / "records.jsonl", victim)
    with pytest.raises(RunDirError, match="symbolic link") as caught:
        RunStore(run, load_sweep(tmp_path / "run.yaml"), command=["attnbench", "run"])
    assert "\n" not in str(caught.value)
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("name", ["driver.json", "manifest.json", ".cancel"])
def test_a_link_at_a_whole_file_is_replaced_not_written_through(tmp_path, name):
    from attnbench.dispatch.driver_state import request_cancel, write_state

    victim = _outside(tmp_path)
    run = _run(tmp_path)
    if name == "manifest.json":
        manifest = (run / name).read_text()
        (run / name).unlink()
        _plant(run / name, victim)
        from attnbench.results.files import write_atomic

        write_atomic(run / name, manifest)  # as RunStore._write_manifest does
    else:
        _plant(run / name, victim)
        write_state(run, {"state": "running"}) if name == "driver.json" else \
            request_cancel(run, ["t"])
    assert victim.read_text() == "precious\n" and not (run / name).is_symlink()


def test_a_dashboard_whose_files_became_links_is_redrawn_without_following_them(tmp_path):
    """A dashboard attnbench drew, its pages and figures then replaced by links to
    files outside: drawing again replaces the links. Mutant: ``index.write_text`` or
    ``fig.savefig(path)`` (both follow a link)."""
    victim = _outside(tmp_path)
    run = _run(tmp_path)
    assert cli.main(["report", str(run)]) == 0
    dashboard = run / "dashboard"
    links = [dashboard / "index.html", dashboard / "interactive.html"] + \
        sorted(dashboard.glob("*.png"))[:1] + sorted(dashboard.glob("*.svg"))[:1]
    links = [p for p in links if p.exists()]
    assert len(links) >= 3
    for path in links:
        path.unlink()
        _plant(path, victim)
    assert cli.main(["report", str(run)]) == 0
    assert victim.read_text() == "precious\n"
    assert not [p for p in links if p.is_symlink()]


def test_the_safe_writer_leaves_no_temporary_file_and_never_overwrites_without_replace(tmp_path):
    from attnbench.results.files import write_atomic

    target = tmp_path / "t"
    write_atomic(target, "one")
    with pytest.raises(FileExistsError):
        write_atomic(target, "two", replace=False)
    write_atomic(target, b"three", sync=True)
    assert target.read_text() == "three" and [p.name for p in tmp_path.iterdir()] == ["t"]


# -- item 10: text capped where it reaches a page; the scheduler file read bounded -------------
def test_a_huge_reason_is_cut_on_the_page_and_kept_in_the_journal(tmp_path):
    """A 60,000-character reason and traceback (under the journal's caps) reach index.html as
    20,000 characters each and a note. Mutant: ``esc`` without its limit -- the page grows by
    the whole text."""
    from attnbench.report.page.html import MAX_TEXT_SHOWN

    run = _run(tmp_path, verdicts=())
    store = RunStore(run, load_sweep(tmp_path / "run.yaml"), command=["attnbench", "run"])
    reason = "R" * 60_000
    store.append(make_record(store.sweep.cases[0], verdict="error", reason=reason,
                             crash={"traceback": "T" * 60_000}, env={"host": "h"}))
    store.close()
    assert cli.main(["report", str(run)]) == 0
    page = (run / "dashboard" / "index.html").read_text()
    assert "R" * MAX_TEXT_SHOWN in page and "R" * (MAX_TEXT_SHOWN + 1) not in page
    assert "more characters: see records.jsonl" in page
    assert len(page) < 100_000 + 2 * MAX_TEXT_SHOWN
    assert load_records(run)[0]["reason"] == reason


@pytest.mark.parametrize("kind", ["/dev/zero", "huge"])
def test_a_scheduler_file_is_read_bounded(tmp_path, capsys, kind):
    """Mutant: ``path.read_text()`` -- /dev/zero is read until memory runs out."""
    path = Path(kind)
    if kind == "huge":
        path = tmp_path / "scheduler.json"
        path.write_bytes(b" " * (5 << 20) + b'{"address": "tcp://h:1"}')
    assert cli.main(["run", TINY, "--scheduler-file", str(path), "--out",
                     str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected the file `dask scheduler --scheduler-file`" in err
    assert not (tmp_path / "out").exists()


# -- item 12: export, compare and --cluster slurm -----------------------------------------------
def test_export_refuses_to_overwrite_without_force(tmp_path, capsys):
    """Mutant: ``Path(out).write_bytes`` -- a user's file silently replaced."""
    run = _run(tmp_path)
    out = tmp_path / "cases.csv"
    out.write_text("mine\n")
    assert cli.main(["export", str(run), "--out", str(out)]) == 2
    assert "exists; give --force" in capsys.readouterr().err and out.read_text() == "mine\n"
    assert cli.main(["export", str(run), "--out", str(out), "--force"]) == 0
    assert out.read_text().startswith("run_id,")


def test_export_force_replaces_a_link_without_writing_through_it(tmp_path):
    victim = _outside(tmp_path)
    run = _run(tmp_path)
    out = tmp_path / "cases.csv"
    _plant(out, victim)
    assert cli.main(["export", str(run), "--out", str(out), "--force"]) == 0
    assert victim.read_text() == "precious\n" and not out.is_symlink()


def test_export_of_the_same_run_twice_is_refused(tmp_path, capsys):
    """Mutant: no duplicate check -- every row twice."""
    run = _run(tmp_path)
    assert cli.main(["export", str(run), str(run) + "/", "--format", "json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is given twice" in err


def test_compare_of_read_only_runs_writes_to_the_working_directory(tmp_path, capsys,
                                                                   monkeypatch):
    """The runs' directories not writable (tests run as root, for whom permission bits do
    not hold, so the check ``os.access`` makes is answered no): the dashboard goes to the
    working directory, said in one line. Mutant: the default always inside the last run --
    ``cannot create: Permission denied``, exit 2."""
    import attnbench.report.compare.command as commands

    a, b = _run(tmp_path, "a"), _run(tmp_path, "b")
    for run in (a, b):
        os.chmod(run, 0o555)
    real = os.access
    monkeypatch.setattr(commands.os, "access",
                        lambda p, mode, **kw: False if Path(p) in (a, b) else real(p, mode, **kw))
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    try:
        assert cli.main(["compare", str(a), str(b)]) == 0
    finally:
        for run in (a, b):
            os.chmod(run, 0o755)
    err = capsys.readouterr().err
    assert "is read-only; the comparison dashboard goes to" in err
    assert [p.name for p in here.iterdir()] == ["compare-a-vs-b"]
    assert not list(b.glob("compare-*"))


def test_cluster_slurm_without_dask_jobqueue_is_exit_2_with_the_install_hint(tmp_path, capsys,
                                                                           monkeypatch):
    """Mutant: the ImportError raised as a ClusterError (exit 3: "resume later", which no
    waiting fixes)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "dask_jobqueue" else real(name, *a))
    assert cli.main(["run", TINY, "--cluster", "slurm", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'attnbench[slurm]'" in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_a_record_too_long_for_a_journal_line_is_written_with_its_texts_cut(tmp_path):
    """A 3 MB exception message: the record is written with it cut to 64 Ki characters, so the
    run stays readable. Mutant: ``append`` without ``fit_line`` -- the next read of the run
    refuses line 3 as over the cap."""
    from attnbench.results.journal import MAX_FIELD_CHARS

    run = _run(tmp_path)
    store = RunStore(run, load_sweep(tmp_path / "run.yaml"), command=["attnbench", "run"])
    store.append(make_record(store.sweep.cases[2], verdict="error", reason="E" * 3_000_000,
                             env={"host": "h"}))
    store.close()
    reason = {r["id"]: r for r in load_records(run)}[store.sweep.cases[2].id]["reason"]
    assert reason.startswith("E" * MAX_FIELD_CHARS) and reason.endswith("more characters cut]")
