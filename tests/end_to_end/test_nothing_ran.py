"""A run in which nothing ran is not a success (issue 40, item 1), on loopback with real
processes: against a `dask scheduler` with a plain `dask worker` (no attnbench resources),
``submit``, ``run --scheduler`` and ``status`` exit 3 and say why on standard output in one
line; a sweep whose every case its backend refuses exits 1."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from attnbench.results.records import make_record
from attnbench.results.store import RunStore
from attnbench.sweep.load import load_sweep
from cluster_rig import Processes, journal_of, wait_for, write_sweep
from helpers import ROOT, SUPPORT, attnbench_cmd

CASES = 4
WHY = "no connected worker can run them (cp=1 x tp=1 needs 1 devices on one worker"


@pytest.fixture(scope="module")
def env():
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join([str(SUPPORT), str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


@pytest.fixture(scope="module")
def plain_cluster(env, tmp_path_factory):
    """A scheduler and one plain `dask worker`, as a user who skipped `attnbench worker` has."""
    procs = Processes(tmp_path_factory.mktemp("plain"), env)
    try:
        address = procs.scheduler("scheduler")
        worker = procs.start("plain", [sys.executable, "-m", "distributed.cli.dask_worker",
                                       address, "--nthreads", "2", "--no-nanny", "--name",
                                       "plain", "--no-dashboard"])
        wait_for(lambda: "Registered to" in worker.log_path.read_text()
                 or worker.poll() is not None, 90, "the plain worker to register")
        assert worker.poll() is None, worker.log_path.read_text()[-3000:]
        yield address
    finally:
        procs.stop_all()


def _cli(*args, env) -> subprocess.CompletedProcess:
    return subprocess.run([*attnbench_cmd(), *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=180)


def _sweep(tmp_path):
    return write_sweep(tmp_path, "idle", {"seed": list(range(CASES))}, gpu="any")


def test_run_on_a_plain_dask_worker_exits_3_and_status_says_none_ran(plain_cluster, env,
                                                                      tmp_path):
    out = tmp_path / "run"
    run = _cli("run", _sweep(tmp_path), "--scheduler", plain_cluster, "--out", out,
               "--worker-wait", "20", env=env)
    assert run.returncode == 3, run.stdout + run.stderr
    last = run.stdout.rstrip().splitlines()[-1]
    assert last.startswith(f"attnbench: nothing ran: all {CASES} cases skipped, {WHY}"), last
    assert "attnbench: dashboard" not in run.stdout  # nothing to draw
    assert {r["verdict"] for r in journal_of(out)} == {"skipped"}  # the journal says why too

    status = _cli("status", out, env=env)
    assert status.returncode == 3, status.stdout + status.stderr
    lines = status.stdout.splitlines()
    assert lines[0].endswith(f"{CASES}/{CASES} cases recorded ({CASES} skipped), 0 ran")
    assert "driver: finished" in lines
    assert lines[-1].startswith(f"attnbench: nothing ran: all {CASES} cases skipped, {WHY}")


def test_submit_to_a_plain_dask_worker_starts_nothing_and_exits_3(plain_cluster, env, tmp_path):
    out = tmp_path / "run"
    submit = _cli("submit", _sweep(tmp_path), "--scheduler", plain_cluster, "--out", out,
                  "--worker-wait", "20", env=env)
    assert submit.returncode == 3, submit.stdout + submit.stderr
    last = submit.stdout.rstrip().splitlines()[-1]
    assert last.startswith(f"attnbench: nothing ran: no connected worker can run any of the "
                           f"{CASES} cases (cp=1 x tp=1 needs 1 devices"), last
    assert last.endswith("; no driver was started")
    assert not out.exists()  # a run that never started leaves nothing


def test_a_sweep_its_backend_refuses_entirely_exits_1(env, tmp_path):
    # Every case recorded unsupported (not run again): the run has nothing pending, starts no
    # cluster, and is not green.
    sweep = load_sweep(_sweep(tmp_path))
    out = tmp_path / "run"
    store = RunStore(out, sweep, command=["test"])
    for case in sweep.cases:
        store.append(make_record(case, verdict="unsupported", reason="sleepy: no such feature"))
    store.close()
    run = _cli("run", sweep.path, "--out", out, env=env)
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stdout.rstrip().splitlines()[-1] == (
        f"attnbench: nothing ran: all {CASES} cases unsupported by their backend (sleepy: no "
        "such feature)")
