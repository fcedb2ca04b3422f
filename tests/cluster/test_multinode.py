"""Multi-node on loopback with real processes: a `dask scheduler` (the CLI) and `attnbench worker`s
that pretend two GPU kinds (--kind A, --kind B) on CPU slots, and `attnbench run --scheduler`.

What is checked: cases land on the workers of their kind with exclusive device leases; a kind no
worker has is `skipped` at submission; SIGKILL of a worker mid-case, Ctrl-C / SIGTERM of the
client and the loss of the scheduler neither lose nor duplicate a record; TLS works with a
self-made certificate. Cases use ``tests/support/sleepy_backend.py`` (naive math after a sleep),
so they
take a known time without burning the CPU.

Counts asserted for every fault: cases submitted (the sweep), records written (journal lines),
lost (verdict ``lost``), duplicated (lines - distinct ids).
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from cluster_rig import (Processes, certificate, counts_of, journal_of,  # noqa: F401
                         wait_for, write_sweep)  # certificate: a fixture
from helpers import ROOT, SUPPORT, attnbench_cmd

SLEEP_S = 0.3
"""How long a sleepy case takes on the module's workers."""



def _run(args: list[str], env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*attnbench_cmd(), "run", *args, "--no-report"], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=timeout)


def _start_run(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen([*attnbench_cmd(), "run", *args, "--no-report"], env=env, cwd=ROOT,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)


def _wait_lines(out: Path, count: int, proc: subprocess.Popen, timeout: float = 90) -> None:
    path = out / "records.jsonl"
    wait_for(lambda: proc.poll() is not None or (
        path.exists() and len(path.read_text().splitlines()) >= count), timeout,
        f"{count} records in {path}")
    assert proc.poll() is None, "the run ended before it could be interrupted"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multinode")
    env = dict(os.environ, PYTHONWARNINGS="ignore", SLEEPY_S=str(SLEEP_S),
               SLEEPY_LOG=str(tmp / "forward-starts.log"))
    env["PYTHONPATH"] = os.pathsep.join([str(SUPPORT), str(ROOT),
                                         env.get("PYTHONPATH", "")])
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


@pytest.fixture(scope="module")
def cluster(env, tmp_path_factory):
    """A scheduler and two workers: wA (kind A) and wB (kind B), one slot each."""
    tmp = tmp_path_factory.mktemp("cluster")
    procs = Processes(tmp, env)
    try:
        address = procs.scheduler("scheduler")
        threads = [threading.Thread(target=procs.worker, args=(name, address, "--kind", kind))
                   for name, kind in (("wA", "A"), ("wB", "B"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        yield address, procs
    finally:
        procs.stop_all()


# -- routing -----------------------------------------------------------------------------------


def test_cases_land_on_their_kind_and_a_missing_kind_is_skipped_at_once(cluster, env, tmp_path):
    address, _ = cluster
    sweep = write_sweep(tmp_path, "route", {"gpu": ["A", "B", "C"], "seed": [0, 1]})
    out = tmp_path / "run"
    proc = _run([str(sweep), "--out", str(out), "--scheduler", address], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = journal_of(out)
    assert counts_of(6, out) == {"submitted": 6, "written": 6, "distinct": 6, "lost": 0,
                               "duplicated": 0}
    by_gpu = collections.defaultdict(list)
    for r in lines:
        by_gpu[r["case"]["gpu"]].append(r)
    for kind in ("A", "B"):
        assert [r["verdict"] for r in by_gpu[kind]] == ["pass", "pass"]
        assert {r["env"]["worker"] for r in by_gpu[kind]} == {f"w{kind}"}
        assert all(r["env"]["worker_kind"] == kind and r["env"]["lease"] == ["0"]
                   for r in by_gpu[kind])
    for r in by_gpu["C"]:
        assert r["verdict"] == "skipped"
        assert r["reason"] == ("no worker offers GPU kind 'C' (workers: 1 x A with 1 device, "
                               "1 x B with 1 device)")
    # Reported at submission: the skipped records come before any result.
    assert [r["case"]["gpu"] for r in lines[:2]] == ["C", "C"]
    assert "skipping cases no worker can run: no worker offers GPU kind 'C'" in proc.stderr


# -- faults ------------------------------------------------------------------------------------


def _parent_pid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_attnbench_workers_set_up_their_plugin_once(cluster):
    """`attnbench worker` registers the worker plugin as it starts (--preload); a client that
    registers it again on connect, as every run does, changes nothing on the workers."""
    from distributed import Client

    from attnbench.cluster.plugin import NAME, register

    address, procs = cluster

    def plugin(dask_worker):
        state = dask_worker.plugins[NAME]
        return id(state), state.closed, state.leases.kind

    with Client(address, timeout="20s") as client:
        before = client.run(plugin)
        register(client)
        assert client.run(plugin) == before
    assert sorted(kind for _, closed, kind in before.values() if not closed) == ["A", "B"]
    workers = [p for p in procs.started if "worker" in p.args and p.poll() is None]
    assert len(workers) == 2
    for proc in workers:
        assert proc.log_path.read_text().count(f"Starting Worker plugin {NAME}") == 1


def test_sigkill_of_a_worker_mid_case_loses_nothing(cluster, env, tmp_path):
    """A second kind-A worker whose cases take 30 s is SIGKILLed while its rank is inside the
    first one: that case reruns on wA; every case has exactly one record."""
    address, procs = cluster
    starts = Path(env["SLEEPY_LOG"])
    victim = procs.worker("victim", address, "--kind", "A", env=dict(env, SLEEPY_S="30"))
    sweep = write_sweep(tmp_path, "kill", {"seed": list(range(8))}, gpu="A")
    out = tmp_path / "run"
    before = len(starts.read_text().splitlines()) if starts.exists() else 0
    client = _start_run([str(sweep), "--out", str(out), "--scheduler", address], env,
                        tmp_path / "client.log")

    def victim_rank_inside_a_case():
        lines = starts.read_text().splitlines()[before:] if starts.exists() else []
        return [int(l.split()[0]) for l in lines if _parent_pid(int(l.split()[0])) == victim.pid]

    wait_for(lambda: victim_rank_inside_a_case() or client.poll() is not None, 90,
              "the victim's rank to start a case")
    rank_pid = victim_rank_inside_a_case()[0]
    victim.send_signal(signal.SIGKILL)
    assert client.wait(timeout=120) == 0, (tmp_path / "client.log").read_text()
    assert counts_of(8, out) == {"submitted": 8, "written": 8, "distinct": 8, "lost": 0,
                               "duplicated": 0}
    records = journal_of(out)
    assert {r["verdict"] for r in records} == {"pass"}
    assert {r["env"]["worker"] for r in records} == {"wA"}  # the victim finished none
    # Forward starts: the 8 cases plus the one the kill interrupted (rerun on wA).
    assert len(starts.read_text().splitlines()) - before == 9
    # The killed worker's rank did not outlive it (its pipe hung up, its watchdog fired).
    wait_for(lambda: not Path(f"/proc/{rank_pid}").exists()
              or "zombie" in Path(f"/proc/{rank_pid}/status").read_text(), 15,
              f"rank {rank_pid} of the killed worker to exit")


def test_ctrl_c_and_sigterm_then_resume_lose_nothing(cluster, env, tmp_path):
    address, _ = cluster
    sweep = write_sweep(tmp_path, "interrupt", {"seed": list(range(8))}, gpu="any")
    out = tmp_path / "run"
    args = [str(sweep), "--out", str(out), "--scheduler", address]
    for sig, after in ((signal.SIGINT, 2), (signal.SIGTERM, 4)):
        client = _start_run(args, env, tmp_path / f"{sig.name}.log")
        _wait_lines(out, after, client)
        client.send_signal(sig)
        assert client.wait(timeout=60) == 130
        log = (tmp_path / f"{sig.name}.log").read_text()
        assert f"resume with: attnbench run {sweep} --out {out}" in log
        assert "Traceback" not in log
        counts = counts_of(8, out)
        assert counts["duplicated"] == 0 and counts["written"] < 8  # every line valid JSON
    done = _run(args, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{8 - counts['written']} to run" in done.stdout
    assert counts_of(8, out) == {"submitted": 8, "written": 8, "distinct": 8, "lost": 0,
                               "duplicated": 0}


@pytest.mark.parametrize("dispatch", ["tasks", "lanes"])
def test_tls_then_scheduler_lost_then_resume_elsewhere(cluster, env, tmp_path, certificate,
                                                       dispatch):
    """Over TLS: a client without certificates is refused in one line (exit 2); with them the run works
    until the scheduler is killed, which the client reports in one line (exit 3); the run then
    resumes on another cluster (the module's, plain TCP) without losing or repeating a case.
    With lanes, the workers reach the client's own listener over TLS too."""
    plain_address, _ = cluster
    cert, key = certificate
    tls = ["--tls-ca-file", str(cert), "--tls-cert", str(cert), "--tls-key", str(key)]
    procs = Processes(tmp_path, env)
    try:
        address = procs.scheduler("tls-scheduler", "--protocol", "tls", *tls)
        assert address.startswith("tls://127.0.0.1:")
        procs.worker("wT", address, *tls)
        sweep = write_sweep(tmp_path, "tls", {"seed": list(range(8))}, gpu="any")
        out = tmp_path / "run"
        refused = _run([str(sweep), "--out", str(out), "--scheduler", address], env)
        assert refused.returncode == 2  # bad arguments: refused before anything is created
        assert "speaks TLS: give --tls-ca-file, --tls-cert and --tls-key" in refused.stderr
        assert not out.exists()

        client = _start_run([str(sweep), "--out", str(out), "--scheduler", address, *tls,
                             "--dispatch", dispatch], env, tmp_path / "client.log")
        _wait_lines(out, 2, client)
        assert {r["env"]["worker"] for r in journal_of(out)} == {"wT"}
        procs.started[0].send_signal(signal.SIGKILL)  # the scheduler
        assert client.wait(timeout=60) == 3
        log = (tmp_path / "client.log").read_text()
        assert "attnbench: error: lost the connection to the Dask scheduler" in log
        assert "Traceback" not in log and "resume with:" in log
        written = counts_of(8, out)["written"]
        assert 2 <= written < 8
    finally:
        procs.stop_all()
    resumed = _run([str(sweep), "--out", str(out), "--scheduler", plain_address], env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"{8 - written} to run" in resumed.stdout
    assert counts_of(8, out) == {"submitted": 8, "written": 8, "distinct": 8, "lost": 0,
                               "duplicated": 0}


# -- SLURM through dask-jobqueue, with a stand-in sbatch ---------------------------------------

FAKE_SBATCH = """#!/bin/bash
# Stand-in for sbatch: run the job script on this machine, in its own process group.
cp "$1" "$1.job"
setsid bash "$1.job" > "$1.job.log" 2>&1 < /dev/null &
echo "Submitted batch job $!"
"""
FAKE_SCANCEL = """#!/bin/bash
for job in "$@"; do kill -TERM -- "-$job" 2>/dev/null; done
exit 0
"""


def test_slurm_cluster_runs_attnbench_workers(env, tmp_path):
    """`--cluster slurm` with dask-jobqueue, `sbatch`/`scancel` replaced by local stand-ins:
    the job script starts `python -m attnbench.cluster.worker`, which advertises its slots."""
    pytest.importorskip("dask_jobqueue")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("scancel", FAKE_SCANCEL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    slurm_env = dict(env, PATH=f"{bin_dir}{os.pathsep}{env['PATH']}",
                     DASK_JOBQUEUE__SLURM__CORES="1", DASK_JOBQUEUE__SLURM__MEMORY="2GB",
                     DASK_JOBQUEUE__SLURM__WALLTIME="00:10:00")
    sweep = write_sweep(tmp_path, "slurm", {"seed": [0, 1]}, gpu="cpu")
    out = tmp_path / "run"
    proc = _run([str(sweep), "--out", str(out), "--cluster", "slurm", "--workers", "1"],
                slurm_env, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SLURM (1 job)" in proc.stdout
    assert [r["verdict"] for r in journal_of(out)] == ["pass", "pass"]


# -- the Dask ways of naming the scheduler ------------------------------------------------------


@pytest.mark.parametrize("how", ["scheduler-file", "DASK_SCHEDULER_ADDRESS"])
def test_run_finds_the_scheduler_the_way_dask_deployments_name_it(cluster, env, tmp_path, how):
    """SLURM/MPI deployments hand clients a scheduler file; Dask's Client reads
    DASK_SCHEDULER_ADDRESS. Either reaches the running scheduler (not an embedded cluster),
    and the run keeps Dask's performance report beside its records."""
    address, procs = cluster
    sweep = write_sweep(tmp_path, "named", {"seed": [0, 1]}, gpu="A")
    out = tmp_path / "run"
    if how == "scheduler-file":
        proc = _run([str(sweep), "--out", str(out), "--scheduler-file",
                     str(procs.dir / "scheduler.json")], env)
    else:
        proc = _run([str(sweep), "--out", str(out)], dict(env, DASK_SCHEDULER_ADDRESS=address))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"running on scheduler {address} (from " in proc.stdout
    assert {r["env"]["worker"] for r in journal_of(out)} == {"wA"}
    assert (out / "dask-performance.html").is_file()
