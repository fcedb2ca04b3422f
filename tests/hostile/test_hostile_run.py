"""Hostile runs (issue 13): bad arguments and run directories are refused before anything is
created, one run at a time appends to a directory, infrastructure verdicts are retried, and what
reaches a terminal or the journal is what it should be.

Classes covered here: 1 (a record the journal cannot hold does not stop a run), 5 (the embedded
cluster listens on loopback only), 6 (a lock on the run directory), 7 (no oversubscription past
the documented bound), 8 (lost / skipped run again, ``--retry``, ``--case`` into the same run),
9 (bad ``--out``, ``--workers``, ``--scheduler``, TLS files), 10 (a journal whose last line lost
only its newline), 13 (foreign records, changed options, ``--nthreads 0``, escape sequences,
the count after an interrupt). Most run in process against a scripted cluster; two start the
embedded Dask cluster (a few seconds each).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from attnbench import cli
from attnbench.cluster.connect import WorkerInfo, plan_case
from attnbench.results.records import make_record
from attnbench.results.store import RunStore, load_records
from attnbench.sweep.case import Case, make_case
from attnbench.sweep.load import load_sweep

SWEEP = """name: tiny
defaults: {backend: naive, batch: 1, seqlen_q: 32, heads_q: 2, head_dim: 16, dtype: fp32}
axes: {seed: [0, 1, 2, 3]}
options:
  timeout_s: 60
  timing: {enabled: false}
"""


@pytest.fixture
def sweep_file(tmp_path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(SWEEP)
    return path


def _store(sweep_file: Path, out: Path, verdicts: list[str], **kw) -> RunStore:
    """A run directory whose first cases have records with these verdicts (left open)."""
    store = RunStore(out, load_sweep(sweep_file), command=["test"], **kw)
    for case, verdict in zip(store.sweep.cases, verdicts):
        store.append(make_record(case, verdict=verdict, reason=f"{verdict} on purpose"))
    return store


def _journal(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


# -- a scripted cluster (no processes) -----------------------------------------------------------

class _Future:
    def __init__(self, key, record):
        self.key, self.record, self.status = key, record, "finished"

    def add_done_callback(self, fn):
        fn(self)

    def result(self):
        return self.record

    def cancel(self):
        self.status = "cancelled"


class _Client:
    status = "running"

    def __init__(self, answer):
        self.answer, self.attempts = answer, {}

    def submit(self, func, case_dict, options, attempt, devices, *, resources, key, pure):
        case = Case.from_dict(case_dict)
        self.attempts[case.id] = attempt
        return _Future(key, self.answer(case, attempt))


class _Connection:
    where = "scripted cluster"

    def __init__(self, answer):
        self.client = _Client(answer)

    def workers(self):
        return [WorkerInfo("tcp://127.0.0.1:1", "w", {"device": 2, "kind-cpu": 2})]


def _passing(case, attempt):
    return make_record(case, verdict="pass", attempt=attempt)


def _run(store, answer=_passing, stream=None):
    from attnbench.dispatch.run import run_pending

    conn = _Connection(answer)
    return run_pending(store, conn, stream=stream or io.StringIO()), conn


# -- class 8: infrastructure verdicts run again, with their attempt number ---------------------

def test_lost_and_skipped_cases_run_again_on_resume(sweep_file, tmp_path):
    out = tmp_path / "run"
    store = _store(sweep_file, out, ["lost", "skipped", "pass", "timeout"])
    lost, skipped, passed, timed_out = store.sweep.cases
    assert [c.id for c in store.pending()] == [lost.id, skipped.id]
    summary, conn = _run(store)
    store.close()
    assert summary.written == 2 and conn.client.attempts == {lost.id: 2, skipped.id: 2}
    last = {r["id"]: r for r in _journal(out)}
    assert [last[c.id]["verdict"] for c in (lost, skipped, passed, timed_out)] == \
        ["pass", "pass", "pass", "timeout"]
    assert last[lost.id]["attempt"] == 2
    # --retry adds verdicts; the timeout runs again as attempt 2
    store = RunStore(out, load_sweep(sweep_file), command=["test"], retry=("timeout",))
    assert [c.id for c in store.pending()] == [timed_out.id]
    _, conn = _run(store)
    store.close()
    assert conn.client.attempts == {timed_out.id: 2}
    assert {r["id"]: r for r in load_records(out)}[timed_out.id]["verdict"] == "pass"


def test_case_reruns_into_the_same_run_directory(sweep_file, tmp_path):
    from attnbench.sweep.load import single_case_sweep

    out = tmp_path / "run"
    _store(sweep_file, out, ["fail", "pass", "pass", "pass"]).close()
    sweep = load_sweep(sweep_file)
    failing = sweep.cases[0]
    store = RunStore(out, single_case_sweep(sweep, [failing.id[:8]]), command=["test"])
    assert store.pending() == [failing]  # the run directory is the whole sweep's
    summary, conn = _run(store)
    store.close()
    assert summary.written == 1 and summary.duplicated == 0
    assert conn.client.attempts == {failing.id: 2}
    assert [r["verdict"] for r in _journal(out) if r["id"] == failing.id] == ["fail", "pass"]
    assert len(load_records(out)) == 4


def test_resume_with_the_cli_reruns_a_lost_case(sweep_file, tmp_path, capsys):
    """End to end on the embedded cluster (a few seconds): a case whose worker another
    backend's crash took down (`lost`) runs again when the run is resumed."""
    out = tmp_path / "run"
    _store(sweep_file, out, ["lost", "pass", "pass", "pass"]).close()
    assert cli.main(["run", str(sweep_file), "--out", str(out), "--no-report"]) == 0
    stdout = capsys.readouterr().out
    assert f"4 cases, 4 already in {out}, 1 to run (again: 1 lost)" in stdout
    lines = _journal(out)
    assert len(lines) == 5 and lines[-1]["verdict"] == "pass" and lines[-1]["attempt"] == 2


# -- class 1: what the journal cannot hold becomes an error record; the run goes on ------------

def test_a_record_with_nan_does_not_stop_the_run(sweep_file, tmp_path):
    store = _store(sweep_file, tmp_path / "run", [])

    def answer(case, attempt):
        record = make_record(case, verdict="pass", attempt=attempt)
        if case.seed == 0:
            record["timing"] = {"fwd": {"median_ms": float("nan")}}
        return record

    summary, _ = _run(store, answer)
    store.close()
    assert summary.written == 4
    records = {r["case"]["seed"]: r for r in load_records(tmp_path / "run")}
    assert records[0]["verdict"] == "error" and "cannot be stored" in records[0]["reason"]
    assert {records[s]["verdict"] for s in (1, 2, 3)} == {"pass"}


# -- class 13: the count after an interrupt ---------------------------------------------------

def test_an_interrupt_during_a_write_is_counted_with_the_record(sweep_file, tmp_path):
    from attnbench.dispatch.loop import Progress
    from attnbench.dispatch.run import SweepRun

    store = _store(sweep_file, tmp_path / "run", [])
    run = SweepRun(store, _Connection(_passing), Progress(0, 0, io.StringIO()))
    append = store.append

    def append_then_signal(record, **kwargs):
        note = append(record, **kwargs)
        run.interrupts.pending = "SIGINT"  # arrived while the record was being written
        return note

    store.append = append_then_signal
    summary = run.run()
    store.close()
    assert summary.interrupted and summary.written == len(_journal(tmp_path / "run")) == 1


# -- class 6: one run at a time per run directory -----------------------------------------------

def test_a_second_run_on_a_held_directory_exits_2_naming_the_holder(sweep_file, tmp_path,
                                                                    capsys):
    out = tmp_path / "run"
    holder = _store(sweep_file, out, ["pass"])
    before = (out / "records.jsonl").read_bytes(), (out / "manifest.json").read_bytes()
    assert cli.main(["run", str(sweep_file), "--out", str(out), "--no-report"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnbench: error: {out}: in use by another attnbench run (pid "
                          f"{os.getpid()} on ") and err.count("\n") == 1, err
    assert ((out / "records.jsonl").read_bytes(), (out / "manifest.json").read_bytes()) == before
    holder.close()
    RunStore(out, load_sweep(sweep_file), command=["test"]).close()  # free again


# -- class 9: bad arguments and run directories: exit 2, nothing created ----------------------

@pytest.mark.parametrize("args, expected", [
    (["--scheduler", "not a url"], "--scheduler: got 'not a url', expected a Dask scheduler"),
    (["--scheduler", "tcp://host:99999"], "--scheduler: got 'tcp://host:99999'"),
    (["--scheduler", "tls://127.0.0.1:8786"], "speaks TLS: give --tls-ca-file"),
    (["--scheduler", "tls://h:1", "--tls-ca-file", "/nope/ca.pem", "--tls-cert", "/nope/c.pem",
      "--tls-key", "/nope/k.pem"], "TLS: /nope/ca.pem: no such file"),
    (["--tls-cert", "x.pem"], "TLS needs --tls-ca-file, --tls-cert and --tls-key; missing "
                              "--tls-ca-file, --tls-key"),
    (["--scheduler", "tcp://h:1", "--cluster", "slurm"],
     "give one of --scheduler, --scheduler-file and --cluster, not --scheduler and --cluster"),
    (["--scheduler-file", "/nope/s.json", "--cluster", "local"],
     "not --scheduler-file and --cluster"),
    (["--scheduler-file", "/nope/s.json", "--worker-wait", "0"],
     "/nope/s.json: no such scheduler file"),
])
def test_bad_connection_arguments_create_nothing(sweep_file, tmp_path, capsys, args, expected):
    out = tmp_path / "run"
    assert cli.main(["run", str(sweep_file), "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not out.exists()


@pytest.mark.parametrize("where, expected", [
    ("file", "exists and is not a directory"),
    ("under-a-file", "cannot create the run directory"),
    ("unwritable", "cannot create the run directory"),
    ("user-directory", "a non-empty directory that is not a run directory"),
])
def test_bad_out_paths_are_one_line(sweep_file, tmp_path, capsys, where, expected):
    (tmp_path / "f").write_text("mine")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("mine")
    out = {"file": tmp_path / "f", "under-a-file": tmp_path / "f" / "run",
           "unwritable": Path("/proc/attnbench-test/run"),
           "user-directory": tmp_path / "home"}[where]
    assert cli.main(["run", str(sweep_file), "--out", str(out), "--no-report"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnbench: error: {out}: ") and expected in err and \
        err.count("\n") == 1, err
    assert (tmp_path / "f").read_text() == "mine"
    assert sorted(p.name for p in (tmp_path / "home").iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("args", [["--workers", "-1"], ["--workers", "0"], ["--worker-wait", "nan"],
                                  ["--retry", "flaky"]])
def test_bad_numbers_and_names_are_argument_errors(sweep_file, tmp_path, capsys, args):
    with pytest.raises(SystemExit) as info:
        cli.main(["run", str(sweep_file), "--out", str(tmp_path / "run"), *args])
    assert info.value.code == 2
    assert "Traceback" not in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_worker_refuses_zero_threads_and_offers_its_listen_options(capsys):
    from attnbench.cluster.worker import worker_main

    for bad in (["--nthreads", "0"], ["--slots", "0"]):
        with pytest.raises(SystemExit) as info:
            worker_main(["tcp://10.0.0.1:8786", *bad, "--dry-run"])
        assert info.value.code == 2
    assert worker_main(["tcp://10.0.0.1:8786", "--slots", "1", "--host", "10.0.0.5",
                        "--listen-address", "tcp://10.0.0.5:9000", "--dashboard-address",
                        "127.0.0.1:0", "--dry-run"]) == 0
    argv = capsys.readouterr().out.splitlines()[0]
    assert argv.endswith("--host 10.0.0.5 --listen-address tcp://10.0.0.5:9000 "
                         "--dashboard-address 127.0.0.1:0")


# -- class 10: a last line that lost only its newline is a record ------------------------------

def test_a_complete_last_line_without_its_newline_is_kept(sweep_file, tmp_path):
    out = tmp_path / "run"
    _store(sweep_file, out, ["pass", "pass"]).close()
    journal = out / "records.jsonl"
    journal.write_bytes(journal.read_bytes()[:-1])  # truncate -s -1
    store = RunStore(out, load_sweep(sweep_file), command=["test"])
    assert len(store.done) == 2 and len(store.pending()) == 2
    store.close()
    assert journal.read_bytes().endswith(b"}\n") and len(_journal(out)) == 2
    journal.write_bytes(journal.read_bytes() + b'{"id": "torn')  # a torn line still goes
    RunStore(out, load_sweep(sweep_file), command=["test"]).close()
    assert len(_journal(out)) == 2


# -- class 13: foreign records, changed options, escape sequences ------------------------------

def test_records_of_another_sweep_are_neither_counted_nor_shown(sweep_file, tmp_path, capsys):
    out = tmp_path / "run"
    store = _store(sweep_file, out, ["pass"] * 4)
    foreign = make_record(make_case("x", {"backend": "naive", "seed": 99}), verdict="crash",
                          reason="pasted")
    store.append(foreign)
    store.close()
    assert cli.main(["run", str(sweep_file), "--out", str(out), "--no-report"]) == 0
    captured = capsys.readouterr()
    assert "holds 1 records of cases this sweep does not have" in captured.err
    assert "crash" not in captured.out


def test_resuming_with_other_options_is_refused(sweep_file, tmp_path, capsys):
    out = tmp_path / "run"
    _store(sweep_file, out, ["pass"]).close()
    sweep_file.write_text(SWEEP.replace("timeout_s: 60", "timeout_s: 5"))
    assert cli.main(["run", str(sweep_file), "--out", str(out), "--no-report"]) == 2
    err = capsys.readouterr().err
    assert "this run was started with other options (timeout_s 60.0 -> 5.0)" in err


def test_escape_sequences_in_records_never_reach_the_terminal(sweep_file, tmp_path, capsys):
    from attnbench.dispatch.loop import Progress

    out = tmp_path / "run"
    store = _store(sweep_file, out, [])
    nasty = "\x1b[2J\x1b]0;owned\x07\r\u202eevil\nsecond line"
    record = make_record(store.sweep.cases[0], verdict="crash", reason=nasty)
    record["label"] = nasty
    store.append(record)
    store.close()
    assert cli.main(["show", str(out), "--all"]) == 0
    shown = capsys.readouterr().out
    stream = io.StringIO()
    Progress(1, 0, stream).update(record)
    for text in (shown, stream.getvalue()):
        assert not any(c in text for c in "\x1b\x07\r\u202e"), repr(text)
        assert "\\x1b[2J" in text
    assert all("second line" not in line or "evil" in line for line in shown.splitlines())


# -- class 7: oversubscription bounded before any rank starts ---------------------------------

def test_cpu_oversubscription_is_bounded_at_planning():
    from attnbench.cluster.task import CPU_RANKS_PER_SLOT

    two_slots = [WorkerInfo("tcp://x:1", "w", {"device": 2, "kind-cpu": 2})]
    fits = Case(backend="naive", heads_q=8, cp=4, tp=2)  # sweeps/cp_tp.yaml's largest
    assert plan_case(fits, two_slots) == ({"device": 2, "kind-cpu": 2}, "")
    too_many = Case(backend="naive", heads_q=16, cp=8, tp=2)
    resources, reason = plan_case(too_many, two_slots)
    assert resources is None and reason == (
        f"cp=8 x tp=2 needs 16 ranks; the largest CPU worker has 2 slots and runs at most "
        f"{CPU_RANKS_PER_SLOT} ranks per slot (start it with more --slots)")


# -- class 5: the embedded cluster listens on loopback only ------------------------------------

def test_embedded_cluster_and_its_dashboard_listen_on_loopback_only():
    psutil = pytest.importorskip("psutil")
    from attnbench.cluster.connect import connect

    conn = connect(None, 1)
    try:
        assert conn.client.dashboard_link.startswith("http://127.0.0.1:")
        me = psutil.Process()
        listening = [(p.pid, c.laddr.ip) for p in [me, *me.children(recursive=True)]
                     for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    finally:
        conn.close()
    assert listening and all(ip == "127.0.0.1" for _, ip in listening), listening


def test_the_resume_hint_names_the_cluster_the_run_used(tmp_path):
    """Issue 41 item 9: after a disk error on ``--scheduler tcp://...`` the hint said
    ``attnbench run SWEEP --out RUN``, which resumes on an embedded cluster. Now it repeats
    where and how the cases ran (quoted); a default it leaves out (margin: ``--dispatch
    tasks`` and an absent option add nothing)."""
    sweep_file = tmp_path / "tiny.yaml"
    sweep_file.write_text(SWEEP)
    parser = cli.build_parser()
    args = parser.parse_args(["run", str(sweep_file), "--out", str(tmp_path / "r"),
                              "--scheduler", "tcp://node 1:8786", "--dispatch", "lanes",
                              "--tls-ca-file", "ca.pem"])
    hint = cli.resume_command(args, load_sweep(sweep_file), tmp_path / "r")
    assert hint == (f"attnbench run {sweep_file} --out {tmp_path / 'r'} --scheduler "
                    "'tcp://node 1:8786' --dispatch lanes --tls-ca-file ca.pem")
    plain = parser.parse_args(["run", str(sweep_file), "--out", str(tmp_path / "r")])
    assert cli.resume_command(plain, load_sweep(sweep_file), tmp_path / "r") == \
        f"attnbench run {sweep_file} --out {tmp_path / 'r'}"
