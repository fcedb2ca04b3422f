"""A disk that refuses writes (issue 25, item 4), and a driver state that lies (item 9).

A full disk is simulated by wrapping the journal's file: it takes a byte budget, writes what
fits (a torn last line, as ENOSPC leaves one) and raises ``OSError(ENOSPC)`` from then on;
``/dev/full`` stands in for a full standard output. Before issue 25: ``run`` ended in an OSError
traceback, and the cleanup after it (``RunStore.close``) raised again, so the lock and its
heartbeat outlived the run (``status``: running; ``submit``/``run``: in use) until the worker
was killed.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from attnbench import cli
from attnbench.errors import DiskError
from attnbench.results.lock import LOCK
from attnbench.results.records import make_record
from attnbench.results.store import RunStore, load_records
from attnbench.sweep.load import load_sweep
from helpers import ROOT, attnbench_cmd

SWEEP = """name: tiny
defaults: {backend: naive, batch: 1, seqlen_q: 32, heads_q: 2, head_dim: 16, dtype: fp32}
axes: {seed: [0, 1, 2, 3]}
options:
  timeout_s: 60
  timing: {enabled: false}
"""
ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture
def sweep_file(tmp_path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(SWEEP)
    return path


class _FullDisk:
    """The journal's file on a disk with room for ``budget`` more records: the next write
    writes half its line, then raises ENOSPC, as does every write, flush and close after it."""

    def __init__(self, fh, budget: int):
        self.fh, self.budget = fh, budget

    def write(self, text: str) -> int:
        if self.budget <= 0:
            self.fh.write(text[:len(text) // 2 if self.budget == 0 else 0])
            self.fh.flush()
            self.budget = -1
            raise ENOSPC
        self.budget -= 1
        return self.fh.write(text)

    def flush(self) -> None:
        self.fh.flush()
        if self.budget < 0:
            raise ENOSPC

    def fileno(self) -> int:
        return self.fh.fileno()

    def close(self) -> None:
        self.fh.close()
        if self.budget < 0:
            raise ENOSPC


def _fill_after(monkeypatch, records: int) -> None:
    """Every RunStore opened from now on has room for ``records`` records and half of one."""
    opened = RunStore._open

    def open_on_a_small_disk(self, command):
        opened(self, command)
        self._fh = _FullDisk(self._fh, records)

    monkeypatch.setattr(RunStore, "_open", open_on_a_small_disk)


def test_close_never_raises_and_always_releases_the_lock(sweep_file, tmp_path, monkeypatch):
    """The driver's cleanup on a full disk. Mutant: the close before issue 25 (``sync()`` then
    ``release()``, nothing guarded): the fsync's ENOSPC escapes and the lock stays, its
    heartbeat thread still beating."""
    out = tmp_path / "run"
    store = RunStore(out, load_sweep(sweep_file), command=["test"])
    store.append(make_record(store.sweep.cases[0], verdict="pass"))
    beat = store.lock._beat
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(ENOSPC))
    store.close()  # no exception
    assert not (out / LOCK).exists() and not store.lock.held
    assert not beat.is_alive()
    monkeypatch.undo()
    assert [r["verdict"] for r in load_records(out)] == ["pass"]  # what the disk took stays


def test_a_refused_write_is_one_disk_error_and_nothing_is_appended_after_it(sweep_file,
                                                                             tmp_path,
                                                                             monkeypatch):
    _fill_after(monkeypatch, 1)
    out = tmp_path / "run"
    store = RunStore(out, load_sweep(sweep_file), command=["test"])
    first, second, third = store.sweep.cases[:3]
    store.append(make_record(first, verdict="pass"))
    with pytest.raises(DiskError) as raised:
        store.append(make_record(second, verdict="pass"))
    assert str(raised.value).startswith(f"{out / 'records.jsonl'}: No space left on device "
                                        "(ENOSPC); the records written before stay")
    with pytest.raises(DiskError):  # a torn line is never followed by another record
        store.append(make_record(third, verdict="pass"))
    store.close()
    assert not (out / LOCK).exists()
    assert (out / "records.jsonl").read_text().count("\n") == 1  # one record, one torn line
    assert [r["id"] for r in load_records(out)] == [first.id]


def test_a_manifest_the_disk_refuses_mid_run_is_the_same_disk_error(sweep_file, tmp_path,
                                                                     monkeypatch):
    """A record from a new host rewrites the manifest; on a full disk that was a raw OSError
    (exit 2 as bad input, not 3). Mutant: ``_note_env`` outside the journal's disk guard."""
    out = tmp_path / "run"
    store = RunStore(out, load_sweep(sweep_file), command=["test"])
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / "manifest.json.tmp"))
    monkeypatch.setattr(RunStore, "_write_manifest", lambda self: (_ for _ in ()).throw(full))
    with pytest.raises(DiskError, match=r"manifest.json.tmp: No space left on device"):
        store.append(make_record(store.sweep.cases[0], verdict="pass",
                                 env={"host": "gpu-node-2"}))
    store.close()
    assert not (out / LOCK).exists()


def test_a_full_disk_during_run_is_one_line_exit_3_and_the_resume_is_exact(
        sweep_file, tmp_path, monkeypatch, capsys):
    """End to end on the embedded cluster. Before: an OSError traceback (exit 1) and, from the
    cleanup, a second one. Now: one error line naming the journal, the resume line, exit 3
    (resume later), the lock gone, the journal valid, and the same command completes the
    sweep with every case recorded once."""
    out = tmp_path / "run"
    argv = ["run", str(sweep_file), "--out", str(out), "--no-report"]
    _fill_after(monkeypatch, 2)
    assert cli.main(argv) == 3
    err = [line for line in capsys.readouterr().err.splitlines()
           if line.startswith("attnbench:")]  # not the progress lines
    assert err[0].startswith(f"attnbench: error: {out / 'records.jsonl'}: No space left on "
                             "device (ENOSPC)"), err
    assert err[1].startswith("attnbench: resume with: ") and len(err) == 2, err
    assert not (out / LOCK).exists()
    kept = load_records(out)
    assert len(kept) == 2
    monkeypatch.undo()  # space was freed
    assert cli.main(argv) == 0
    assert "4 cases, 2 already in" in capsys.readouterr().out
    lines = (out / "records.jsonl").read_text().splitlines()
    ids = [json.loads(line)["id"] for line in lines]
    assert len(ids) == len(set(ids)) == 4  # the torn line was dropped, nothing duplicated


def test_an_output_the_disk_refuses_is_one_line_exit_2(sweep_file, tmp_path):
    """``attnbench export RUN > /dev/full``: was an OSError traceback."""
    out = tmp_path / "run"
    store = RunStore(out, load_sweep(sweep_file), command=["test"])
    for case in store.sweep.cases:
        store.append(make_record(case, verdict="pass"))
    store.close()
    with open("/dev/full", "w") as full:
        proc = subprocess.run([*attnbench_cmd(), "export", str(out)], stdout=full,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == ("attnbench: error: writing the output: No space left on device "
                           "(ENOSPC)\n"), proc.stderr


# -- item 9: driver.json is checked as manifests and records are --------------------------------

@pytest.mark.parametrize("state, expected", [
    ({"state": "running", "done": "many"}, "done: got 'many', expected a number"),
    ({"state": "sleeping"}, "state: got 'sleeping', expected one of submitted"),
    ({"state": "running", "running": {"w1": "case"}}, "running: got {'w1': 'case'}"),
    ([1, 2], "got [1, 2], expected a JSON object"),
])
def test_status_names_a_bad_driver_state_in_one_line(sweep_file, tmp_path, capsys, state,
                                                      expected):
    """Before: a traceback (``TypeError`` formatting ``done``, ``AttributeError`` on a list).
    Mutant: ``status`` reading driver.json unchecked (``read_state``)."""
    out = tmp_path / "run"
    RunStore(out, load_sweep(sweep_file), command=["test"]).close()
    (out / "driver.json").write_text(json.dumps(state))
    for command in ("status", "attach"):
        assert cli.main([command, str(out)]) == 2
        captured = capsys.readouterr()
        assert captured.err == f"attnbench: error: {out / 'driver.json'}: {expected}" + \
            captured.err.split(expected, 1)[1] and captured.err.count("\n") == 1, captured.err
        assert "Traceback" not in captured.err


def test_a_driver_that_lost_its_scheduler_is_gone_not_a_raw_exception(sweep_file, tmp_path,
                                                                      capsys):
    """After the scheduler died, ``status`` printed the driver's ``ClosedClientError``. The
    driver now says it lost the scheduler (whatever Dask raised), and ``status`` that the
    driver is gone and how to resume."""
    from distributed.client import ClosedClientError

    from attnbench.dispatch.driver import _failure

    class Closed:
        status = "closed"

    lost = _failure(ClosedClientError(), Closed(), "tcp://10.0.0.1:8786")
    assert lost["scheduler_lost"] and "ClosedClientError" not in lost["message"]
    out = tmp_path / "run"
    RunStore(out, load_sweep(sweep_file), command=["test"]).close()
    (out / "driver.json").write_text(json.dumps(
        {"submission": "abc", "state": "failed", "updated": 0, **lost}))
    assert cli.main(["status", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "driver: gone (lost the Dask scheduler tcp://10.0.0.1:8786" in printed
    assert "resubmit with the same --out to resume" in printed and "Closed" not in printed


def test_a_driver_that_cannot_write_its_last_state_still_lets_go(sweep_file, tmp_path,
                                                                 monkeypatch):
    """The submitted driver's end on a full disk: ``driver.json`` cannot be written and the
    journal's last fsync fails; the lock goes all the same (before: the lock and its heartbeat
    stayed until the worker was killed; ``status`` said running, ``cancel`` timed out)."""
    from attnbench.dispatch import driver

    out = tmp_path / "run"
    store = RunStore(out, load_sweep(sweep_file), command=["test"], submission="abc")
    store.append(make_record(store.sweep.cases[0], verdict="pass"))
    monkeypatch.setattr(driver, "write_state", lambda *a: (_ for _ in ()).throw(ENOSPC))
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(ENOSPC))
    driver._leave(out, store, {"submission": "abc", "state": "failed", "message": "disk"})
    assert not (out / LOCK).exists() and not store.lock.held
