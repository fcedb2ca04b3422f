"""Files a neighbour can plant in a shared run directory (issue 41): a link at ``dashboard``, a
marker naming the run's own files, a FIFO at ``.cancel``, ``driver.json``, ``.lock`` or
``driver.log``, a link from ``driver.log`` to ``/dev/zero``, a journal line nested 100,000
deep. Each is answered in one line (or ignored), at once, and nothing attnbench did not write
is deleted or written through.

A FIFO attack on the old code blocks in ``open()`` forever, so each call runs in a thread given
:data:`WAIT_S`; a blocked one is released by opening the FIFO for writing, then fails.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from attnbench import cli
from attnbench.errors import EXIT_BAD_INPUT, EXIT_OK, RunDirError
from attnbench.results.records import make_record
from attnbench.results.store import RunStore
from attnbench.sweep.load import load_sweep

SWEEP = """name: planted
defaults: {backend: naive, batch: 1, seqlen_q: 32, heads_q: 2, head_dim: 16, dtype: fp32}
axes: {seed: [0, 1, 2]}
"""
RUN_FILES = ("records.jsonl", "manifest.json", "driver.json")
WAIT_S = 10.0
"""Seconds a call may take before it counts as wedged: each answers in well under one here
(a FIFO opened without blocking); the old code never returns at all."""


def _run(tmp: Path, name: str = "run") -> Path:
    sweep_file = tmp / f"{name}.yaml"
    sweep_file.write_text(SWEEP)
    out = tmp / name
    store = RunStore(out, load_sweep(sweep_file), command=["attnbench", "run"])
    for case, verdict in zip(store.sweep.cases, ("pass", "fail")):
        store.append(make_record(case, verdict=verdict, env={"host": "h", "device": "cpu"}))
    store.close()
    (out / "driver.json").write_text(json.dumps({"state": "finished"}))
    return out


def _snapshot(run: Path) -> dict[str, bytes]:
    return {n: (run / n).read_bytes() for n in RUN_FILES}


def _within(fn, fifo: Path):
    """``fn()``'s result, or a failure when it is still blocked after :data:`WAIT_S`."""
    box: dict = {}

    def call():
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the test below
            box["error"] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(WAIT_S)
    if thread.is_alive():
        try:  # release the reader blocked in open(), so the thread ends
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
        thread.join(WAIT_S)
        pytest.fail(f"still blocked on the FIFO at {fifo.name} after {WAIT_S:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


# -- item 1: a planted dashboard link or marker ------------------------------------------------
def test_a_dashboard_link_to_the_run_itself_deletes_nothing(tmp_path, capsys):
    """``ln -s . RUN/dashboard`` and a marker listing the run's files: the old report followed
    the link, read the marker in the run directory and deleted the journal, the manifest and
    the driver state, exit 0. Now: refused, one line naming the link, every file intact."""
    run = _run(tmp_path)
    before = _snapshot(run)
    os.symlink(".", run / "dashboard")
    (run / ".attnbench-dashboard").write_text(json.dumps(list(RUN_FILES)))
    assert cli.main(["report", str(run)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "symbolic link" in err and str(run / "dashboard") in err and err.count("\n") == 1
    assert _snapshot(run) == before
    assert not (run / "index.html").exists()


def test_a_dashboard_link_outside_the_run_writes_nothing_there(tmp_path, capsys):
    """``RUN/dashboard -> ../outside``: the old report drew its pages into ``outside``."""
    run = _run(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink("../outside", run / "dashboard")
    assert cli.main(["report", str(run)]) == EXIT_BAD_INPUT
    assert "symbolic link" in capsys.readouterr().err
    assert list(outside.iterdir()) == []


def test_a_marker_removes_only_what_a_dashboard_draws(tmp_path):
    """A marker in a real dashboard directory naming files attnbench never draws (a user's
    notes, a copy of the journal, a run's own page): they survive a redraw. The figure the
    marker names and the new dashboard does not draw is still removed (margin: the rule keeps
    cleaning what a dashboard wrote)."""
    run = _run(tmp_path)
    assert cli.main(["report", str(run)]) == EXIT_OK
    board = run / "dashboard"
    kept = ["notes.txt", "records.jsonl", "dask-performance.html", "data.json"]
    for name in kept:
        (board / name).write_text("mine\n")
    (board / "p99-old.png").write_bytes(b"old figure")
    marker = board / ".attnbench-dashboard"
    marker.write_text(json.dumps(json.loads(marker.read_text()) + kept + ["p99-old.png"]))
    assert cli.main(["report", str(run)]) == EXIT_OK
    assert all((board / n).read_text() == "mine\n" for n in kept)
    assert not (board / "p99-old.png").exists()


def test_a_report_into_the_run_directory_itself_is_refused(tmp_path, capsys):
    """``--out RUN`` with a planted marker there: refused before anything is read or removed."""
    run = _run(tmp_path)
    before = _snapshot(run)
    (run / ".attnbench-dashboard").write_text(json.dumps(list(RUN_FILES)))
    assert cli.main(["report", str(run), "--out", str(run)]) == EXIT_BAD_INPUT
    assert "is a run directory" in capsys.readouterr().err
    assert _snapshot(run) == before


def test_a_failed_report_leaves_no_empty_dashboard(tmp_path, capsys, monkeypatch):
    """A drawing that fails (here: the disk full at the first figure) leaves no empty
    ``dashboard/`` behind (the old one stayed, and ``status`` then pointed at it)."""
    import errno

    from attnbench.report.page import build

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device", str(run / "dashboard" / "x.png"))

    run = _run(tmp_path)
    monkeypatch.setattr(build, "draw_panel", full)
    assert cli.main(["report", str(run)]) == EXIT_BAD_INPUT
    assert "No space left" in capsys.readouterr().err
    assert not os.path.lexists(run / "dashboard")


# -- item 5: FIFOs and devices where run files go -----------------------------------------------
def test_a_fifo_at_cancel_neither_wedges_the_driver_nor_cancel(tmp_path):
    """The driver's tick (``cancel_requested``) and ``attnbench cancel`` (``request_cancel``)
    both read ``.cancel``: the old ``open()`` blocked on a FIFO forever."""
    from attnbench.dispatch.driver_state import CANCEL, cancel_requested, request_cancel

    run = _run(tmp_path)
    os.mkfifo(run / CANCEL)
    assert _within(lambda: cancel_requested(run, ["t"]), run / CANCEL) is False
    _within(lambda: request_cancel(run, ["t"]), run / CANCEL)
    assert (run / CANCEL).is_file() and cancel_requested(run, ["t"])


def test_a_fifo_at_the_lock_or_the_driver_state_is_answered_at_once(tmp_path, capsys):
    """``.lock`` (every holder() call: status, cancel, run) and ``driver.json`` (status): a FIFO
    is not a holder's note, and not a driver's state (one line, exit 2)."""
    from attnbench.dispatch.driver_state import STATE, load_state
    from attnbench.results.lock import LOCK, RunLock

    run = _run(tmp_path)
    os.mkfifo(run / LOCK)
    assert _within(lambda: RunLock(run).holder(), run / LOCK) == {}
    (run / STATE).unlink()
    os.mkfifo(run / STATE)
    with pytest.raises(RunDirError, match="not a regular file"):
        _within(lambda: load_state(run), run / STATE)
    assert _within(lambda: cli.main(["status", str(run)]), run / STATE) == EXIT_BAD_INPUT
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_attach_reads_its_log_bounded_and_never_waits_on_it(tmp_path, capsys, kind):
    """``driver.log`` a FIFO (the old attach hung in open()) or a link to ``/dev/zero`` (the old
    attach read it whole: MemoryError): one line naming the log, exit 2."""
    from attnbench.dispatch.driver_state import LOG

    run = _run(tmp_path)
    if kind == "fifo":
        os.mkfifo(run / LOG)
    else:
        os.symlink("/dev/zero", run / LOG)
    code = _within(lambda: cli.main(["attach", str(run), "--poll", "0.05"]), run / LOG)
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT and str(run / LOG) in err and err.count("\n") == 1


def test_attach_follows_a_growing_log_and_a_line_longer_than_a_read(tmp_path, capsys,
                                                                     monkeypatch):
    """The bounded reads still show every line: the last ``--lines`` first, then what is
    appended, a line of 1.5 MiB (over a read's MiB) in pieces, not waited on forever."""
    import time

    from attnbench.dispatch import detach
    from attnbench.dispatch.driver_state import LOG, write_state
    from attnbench.results.journal import MAX_LINE_BYTES

    run = _run(tmp_path)
    write_state(run, {"state": "running"})
    (run / LOG).write_bytes(b"x" * MAX_LINE_BYTES + b"\n"
                            + b"".join(b"line %d\n" % i for i in range(20)))

    shown = threading.Event()  # attach has shown the earlier lines: what follows is new
    line_of = detach.driver_line
    monkeypatch.setattr(detach, "driver_line", lambda r: (shown.set(), line_of(r))[1])

    def driver():
        shown.wait(WAIT_S)
        with open(run / LOG, "ab") as fh:
            fh.write(b"y" * (3 * MAX_LINE_BYTES // 2))
        time.sleep(0.5)
        with open(run / LOG, "ab") as fh:
            fh.write(b"\nend\n")
        time.sleep(0.3)
        write_state(run, {"state": "finished"})  # atomic: attach never reads half of it

    thread = threading.Thread(target=driver, daemon=True)
    thread.start()
    assert cli.main(["attach", str(run), "--lines", "3", "--poll", "0.02"]) == EXIT_OK
    thread.join()
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == ["line 17", "line 18", "line 19"]
    pieces = [i for i, line in enumerate(out) if line.startswith("yyyy")]
    assert pieces and "end" in out[pieces[-1]:]


def test_a_fifo_at_an_old_dashboards_index_is_not_waited_on(tmp_path, capsys):
    """A dashboard directory without a marker is judged by its ``index.html``; a FIFO there
    made the old check block in open()."""
    run = _run(tmp_path)
    (run / "dashboard").mkdir()
    os.mkfifo(run / "dashboard" / "index.html")
    code = _within(lambda: cli.main(["report", str(run)]), run / "dashboard" / "index.html")
    assert code == EXIT_BAD_INPUT and "not a dashboard attnbench wrote" in capsys.readouterr().err


# -- item 6: a journal line nested too deep ----------------------------------------------------
DEEP = 100_000
"""Nesting far past Python's recursion limit (1,000) and the C parser's."""


@pytest.mark.parametrize("line", ["[" * DEEP + "]" * DEEP, '{"id": ' + "[" * DEEP + "]" * DEEP + "}"])
def test_status_counts_a_deeply_nested_line_as_bad_and_names_it(tmp_path, capsys, line):
    """The old status: a RecursionError traceback, exit 1. Now the line is one of the bad lines,
    named by file and line number; show says why in one line."""
    run = _run(tmp_path)
    with open(run / "records.jsonl", "a") as fh:
        fh.write(line + "\n")
    assert cli.main(["status", str(run)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "2/3 cases recorded" in out and f"{run / 'records.jsonl'}:3" in out
    assert cli.main(["show", str(run)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"records.jsonl:3: not a JSON record (nested too deeply)" in err


# -- item 9: records of cases not in the sweep -------------------------------------------------
def test_status_and_show_count_only_the_sweeps_own_cases(tmp_path, capsys):
    """Two records appended for a case the sweep does not have (a fourth seed): the old status
    and show said "5/3" (here "4/3"); now 3/3 and a note counting the one other case. Margin:
    a run whose sweep is too large to expand cheaply keeps counting every record."""
    import dataclasses

    from attnbench.results import store as store_module

    run = _run(tmp_path)
    sweep = load_sweep(tmp_path / "run.yaml")
    own = make_record(sweep.cases[2], verdict="pass", env={"host": "h", "device": "cpu"})
    other = dataclasses.replace(sweep.cases[0], seed=7)
    assert other.id not in {c.id for c in sweep.cases}
    stray = make_record(other, verdict="fail", env={"host": "h", "device": "cpu"})
    with open(run / "records.jsonl", "a") as fh:
        for record in (own, stray, stray):
            fh.write(json.dumps(record) + "\n")
    assert cli.main(["status", str(run)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "3/3 cases recorded (1 fail, 2 pass)" in out and "note: 1 more cases" in out
    assert cli.main(["show", str(run)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "3/3 cases recorded" in out and "note: 1 more cases" in out
    store_module.MAX_IDS_EXPANDED, old = 2, store_module.MAX_IDS_EXPANDED
    try:
        assert cli.main(["status", str(run)]) == EXIT_OK
        assert "4/3 cases recorded" in capsys.readouterr().out
    finally:
        store_module.MAX_IDS_EXPANDED = old


def test_a_fifo_at_a_file_appended_to_is_refused_not_waited_on(tmp_path):
    """``driver.log`` (the driver appends its progress lines) and the journal are opened for
    appending: a FIFO there blocked the old ``open()`` until a reader came. Margin: a regular
    file is still appended to, and writes to it block as ever (no EAGAIN)."""
    from attnbench.results.files import open_append

    fifo = tmp_path / "driver.log"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        _within(lambda: open_append(fifo), fifo)
    plain = tmp_path / "plain.log"
    with open_append(plain) as fh:
        assert os.get_blocking(fh.fileno())
        fh.write(b"line\n")
    assert plain.read_bytes() == b"line\n"


def test_a_resumed_run_keeps_its_journal_whatever_dashboard_is(tmp_path, capsys):
    """The end of ``run`` draws the dashboard: with ``RUN/dashboard -> .`` and a marker listing
    the run's files, the old resumed run printed "results in ..." and deleted its journal and
    manifest. Now the run stands (its exit status is its cases'), the dashboard is refused in a
    warning, and every file is there; the next run resumes (nothing left to run)."""
    run = _run(tmp_path)
    (run / "driver.json").unlink()  # a plain run's directory
    os.symlink(".", run / "dashboard")
    (run / ".attnbench-dashboard").write_text(json.dumps(["records.jsonl", "manifest.json"]))
    argv = ["run", str(tmp_path / "run.yaml"), "--out", str(run)]
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code in (0, 1) and "warning: no dashboard" in err and "symbolic link" in err
    assert (run / "records.jsonl").is_file() and (run / "manifest.json").is_file()
    assert cli.main(argv + ["--no-report"]) in (0, 1)
    assert "0 to run" in capsys.readouterr().out


def test_a_dashboard_directory_swapped_for_a_link_while_drawing_removes_nothing(tmp_path,
                                                                                monkeypatch):
    """The claim checks the directory once; a neighbour who swaps it for ``-> ..`` (the run)
    while the figures are drawn must not turn the clean-up on the run: it is checked again
    (device and inode, without following links) before anything is removed."""
    from attnbench.report.page import html

    run = _run(tmp_path)
    assert cli.main(["report", str(run)]) == EXIT_OK
    board = run / "dashboard"
    marker = board / html.MARKER
    marker.write_text(json.dumps(json.loads(marker.read_text()) + ["records.jsonl"]))
    (run / "gone.png").write_bytes(b"the run's own figure")  # a name a dashboard could draw
    marker.write_text(json.dumps(json.loads(marker.read_text()) + ["gone.png"]))
    finish = html.finish_output_dir

    def swapped(claim, written):
        board.rename(tmp_path / "moved")
        os.symlink("..", board)  # the name now leads to the run directory
        finish(claim, written)

    monkeypatch.setattr("attnbench.report.page.build.finish_output_dir", swapped)
    assert cli.main(["report", str(run)]) == EXIT_BAD_INPUT
    assert (run / "gone.png").exists() and (run / "records.jsonl").exists()
