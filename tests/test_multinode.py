"""Multi-node on loopback with real processes: a `dask scheduler` (the CLI) and `attnbench worker`s
that pretend two GPU kinds (--kind A, --kind B) on CPU slots, and `attnbench run --scheduler`.

What is checked: cases land on the workers of their kind with exclusive device leases; a kind no
worker has is `skipped` at submission; SIGKILL of a worker mid-case, Ctrl-C / SIGTERM of the
client and the loss of the scheduler neither lose nor duplicate a record; TLS works with a
self-made certificate. Cases use ``tests/sleepy_backend.py`` (naive math after a sleep), so they
take a known time without burning the CPU.

Counts asserted for every fault: cases submitted (the sweep), records written (journal lines),
lost (verdict ``lost``), duplicated (lines - distinct ids).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from attnbench.cluster.connect import WorkerInfo, plan_case
from attnbench.cluster.worker import DetectionError, DeviceLeases, LeaseTimeout, detect_node
from attnbench.cluster.worker import worker_main
from attnbench.sweep.case import Case
from helpers import ROOT, attnbench_cmd

SLEEP_S = 0.3
"""How long a sleepy case takes on the module's workers."""


# -- processes ---------------------------------------------------------------------------------


class Processes:
    """Processes a test started: logs in files, stopped by pid at the end."""

    def __init__(self, directory: Path, env: dict):
        self.dir, self.env = directory, env
        self.started: list[subprocess.Popen] = []

    def start(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.dir / f"{name}.log", "w")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=env or self.env, start_new_session=True)
        proc.log_path = self.dir / f"{name}.log"
        self.started.append(proc)
        return proc

    def scheduler(self, name: str, *extra: str) -> str:
        """Start `dask scheduler` on 127.0.0.1 on a free port; its address."""
        info = self.dir / f"{name}.json"
        self.start(name, [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host",
                          "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file",
                          str(info), *extra])
        _wait_for(lambda: info.exists() and info.stat().st_size, 60, f"{name} to start")
        return json.loads(info.read_text())["address"]

    def worker(self, name: str, address: str, *extra: str, env: dict | None = None):
        proc = self.start(name, [*attnbench_cmd(), "worker", "--scheduler", address, "--name", name,
                                 "--slots", "1", "--no-nanny", *extra], env=env)
        _wait_for(lambda: "Registered to" in proc.log_path.read_text() or proc.poll() is not None,
                  90, f"worker {name} to register")
        assert proc.poll() is None, proc.log_path.read_text()[-3000:]
        return proc

    def stop_all(self) -> None:
        """Newest first (workers before their scheduler), one at a time: a worker told to stop
        by SIGTERM and by its closing scheduler at once can hang in Dask's close."""
        for proc in reversed(self.started):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _sweep(tmp: Path, name: str, axes: dict, gpu: str | None = None) -> Path:
    defaults = {"batch": 1, "heads_q": 2, "head_dim": 16, "seqlen_q": 32, "dtype": "fp32",
                "backend": "sleepy_backend:make"}
    if gpu:
        defaults["gpu"] = gpu
    path = tmp / f"{name}.yaml"
    path.write_text(json.dumps({"name": name, "defaults": defaults, "axes": axes,
                                "options": {"timeout_s": 60, "timing": {"enabled": False}}}))
    return path


def _journal(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


def _counts(cases: int, out: Path) -> dict:
    lines = _journal(out)
    ids = collections.Counter(r["id"] for r in lines)
    return {"submitted": cases, "written": len(lines), "distinct": len(ids),
            "lost": sum(r["verdict"] == "lost" for r in lines),
            "duplicated": len(lines) - len(ids)}


def _run(args: list[str], env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*attnbench_cmd(), "run", *args, "--no-report"], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=timeout)


def _start_run(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen([*attnbench_cmd(), "run", *args, "--no-report"], env=env, cwd=ROOT,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)


def _wait_lines(out: Path, count: int, proc: subprocess.Popen, timeout: float = 90) -> None:
    path = out / "records.jsonl"
    _wait_for(lambda: proc.poll() is not None or (
        path.exists() and len(path.read_text().splitlines()) >= count), timeout,
        f"{count} records in {path}")
    assert proc.poll() is None, "the run ended before it could be interrupted"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multinode")
    env = dict(os.environ, PYTHONWARNINGS="ignore", SLEEPY_S=str(SLEEP_S),
               SLEEPY_LOG=str(tmp / "forward-starts.log"))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), str(ROOT),
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
    sweep = _sweep(tmp_path, "route", {"gpu": ["A", "B", "C"], "seed": [0, 1]})
    out = tmp_path / "run"
    proc = _run([str(sweep), "--out", str(out), "--scheduler", address], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = _journal(out)
    assert _counts(6, out) == {"submitted": 6, "written": 6, "distinct": 6, "lost": 0,
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
    sweep = _sweep(tmp_path, "kill", {"seed": list(range(8))}, gpu="A")
    out = tmp_path / "run"
    before = len(starts.read_text().splitlines()) if starts.exists() else 0
    client = _start_run([str(sweep), "--out", str(out), "--scheduler", address], env,
                        tmp_path / "client.log")

    def victim_rank_inside_a_case():
        lines = starts.read_text().splitlines()[before:] if starts.exists() else []
        return [int(l.split()[0]) for l in lines if _parent_pid(int(l.split()[0])) == victim.pid]

    _wait_for(lambda: victim_rank_inside_a_case() or client.poll() is not None, 90,
              "the victim's rank to start a case")
    rank_pid = victim_rank_inside_a_case()[0]
    victim.send_signal(signal.SIGKILL)
    assert client.wait(timeout=120) == 0, (tmp_path / "client.log").read_text()
    assert _counts(8, out) == {"submitted": 8, "written": 8, "distinct": 8, "lost": 0,
                               "duplicated": 0}
    records = _journal(out)
    assert {r["verdict"] for r in records} == {"pass"}
    assert {r["env"]["worker"] for r in records} == {"wA"}  # the victim finished none
    # Forward starts: the 8 cases plus the one the kill interrupted (rerun on wA).
    assert len(starts.read_text().splitlines()) - before == 9
    # The killed worker's rank did not outlive it (its pipe hung up, its watchdog fired).
    _wait_for(lambda: not Path(f"/proc/{rank_pid}").exists()
              or "zombie" in Path(f"/proc/{rank_pid}/status").read_text(), 15,
              f"rank {rank_pid} of the killed worker to exit")


def test_ctrl_c_and_sigterm_then_resume_lose_nothing(cluster, env, tmp_path):
    address, _ = cluster
    sweep = _sweep(tmp_path, "interrupt", {"seed": list(range(8))}, gpu="any")
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
        counts = _counts(8, out)
        assert counts["duplicated"] == 0 and counts["written"] < 8  # every line valid JSON
    done = _run(args, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{8 - counts['written']} to run" in done.stdout
    assert _counts(8, out) == {"submitted": 8, "written": 8, "distinct": 8, "lost": 0,
                               "duplicated": 0}


@pytest.fixture
def certificate(tmp_path):
    """A self-signed certificate that is its own CA (openssl CLI)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=attnbench-test",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-addext", "basicConstraints=critical,CA:TRUE"],
                   check=True, capture_output=True)
    return cert, key


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
        sweep = _sweep(tmp_path, "tls", {"seed": list(range(8))}, gpu="any")
        out = tmp_path / "run"
        refused = _run([str(sweep), "--out", str(out), "--scheduler", address], env)
        assert refused.returncode == 2  # bad arguments: refused before anything is created
        assert "speaks TLS: give --tls-ca-file, --tls-cert and --tls-key" in refused.stderr
        assert not out.exists()

        client = _start_run([str(sweep), "--out", str(out), "--scheduler", address, *tls,
                             "--dispatch", dispatch], env, tmp_path / "client.log")
        _wait_lines(out, 2, client)
        assert {r["env"]["worker"] for r in _journal(out)} == {"wT"}
        procs.started[0].send_signal(signal.SIGKILL)  # the scheduler
        assert client.wait(timeout=60) == 3
        log = (tmp_path / "client.log").read_text()
        assert "attnbench: error: lost the connection to the Dask scheduler" in log
        assert "Traceback" not in log and "resume with:" in log
        written = _counts(8, out)["written"]
        assert 2 <= written < 8
    finally:
        procs.stop_all()
    resumed = _run([str(sweep), "--out", str(out), "--scheduler", plain_address], env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"{8 - written} to run" in resumed.stdout
    assert _counts(8, out) == {"submitted": 8, "written": 8, "distinct": 8, "lost": 0,
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
    sweep = _sweep(tmp_path, "slurm", {"seed": [0, 1]}, gpu="cpu")
    out = tmp_path / "run"
    proc = _run([str(sweep), "--out", str(out), "--cluster", "slurm", "--workers", "1"],
                slurm_env, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SLURM (1 job)" in proc.stdout
    assert [r["verdict"] for r in _journal(out)] == ["pass", "pass"]


# -- the pieces, in process --------------------------------------------------------------------


def _workers(*specs: tuple[str, int]) -> list[WorkerInfo]:
    return [WorkerInfo(f"tcp://10.0.0.{i}:1", f"w{i}", {"device": n, f"kind-{kind}": n})
            for i, (kind, n) in enumerate(specs)]


@pytest.mark.parametrize("case, workers, expected", [
    (Case(backend="naive", gpu="H100", cp=2), _workers(("H100", 8)),
     {"device": 2, "kind-H100": 2}),
    (Case(backend="naive", gpu="any", tp=4), _workers(("A100", 2), ("H100", 4)), {"device": 4}),
    # CPU workers run more ranks than they have slots, the ranks sharing the slots.
    (Case(backend="naive", gpu="any", cp=4), _workers(("cpu", 2)), {"device": 2, "kind-cpu": 2}),
    (Case(backend="naive", gpu="cpu", cp=2), _workers(("cpu", 1)), {"device": 1, "kind-cpu": 1}),
], ids=["kind", "any", "cpu-oversubscribed", "cpu-kind-oversubscribed"])
def test_plan_case_asks_for_what_the_case_needs(case, workers, expected):
    assert plan_case(case, workers) == (expected, "")


@pytest.mark.parametrize("case, workers, reason", [
    (Case(backend="naive", gpu="H100"), _workers(("cpu", 2), ("cpu", 2)),
     "no worker offers GPU kind 'H100' (workers: 2 x cpu with 2 devices)"),
    (Case(backend="naive", gpu="H100", cp=2, tp=4), _workers(("H100", 4)),
     "cp=2 x tp=4 needs 8 devices of kind H100 on one worker; the largest offers 4 "
     "(workers: 1 x H100 with 4 devices)"),
    (Case(backend="naive", gpu="any", cp=2), _workers(("H100", 1)),
     "cp=2 x tp=1 needs 2 devices on one worker; the largest offers 1 "
     "(workers: 1 x H100 with 1 device)"),
    (Case(backend="naive"), [WorkerInfo("tcp://x:1", "plain", {})],
     "cp=1 x tp=1 needs 1 devices on one worker; the largest offers 0 (workers: 1 without "
     "attnbench resources (start workers with `attnbench worker`))"),
    (Case(backend="naive"), [], "no workers connected"),
], ids=["kind-missing", "too-few-devices", "any-too-few", "plain-dask-worker", "none"])
def test_plan_case_says_why_no_worker_can_run_a_case(case, workers, reason):
    assert plan_case(case, workers) == (None, reason)


def test_leases_are_exclusive_aligned_and_wait_for_release():
    leases = DeviceLeases([str(i) for i in range(8)], kind="H100", gpu=True)
    with leases.lease(2) as a, leases.lease(4) as b, leases.lease(1) as c:
        assert a.ids == ("0", "1") and b.ids == ("4", "5", "6", "7") and c.ids == ("2",)
        assert b.pool_env(4) == [{"CUDA_VISIBLE_DEVICES": d} for d in "4567"]
        with pytest.raises(LeaseTimeout, match="not free after 0.05 s"):
            with leases.lease(2, timeout=0.05):
                pass
        got = []
        waiter = threading.Thread(target=lambda: got.append(leases.lease(4).__enter__().ids))
        waiter.start()
        time.sleep(0.1)
        assert not got  # 3 free, 4 wanted: it waits
    waiter.join(timeout=5)
    assert got == [("0", "1", "2", "3")]
    cpu = DeviceLeases(["0", "1"], kind="cpu", gpu=False)
    with cpu.lease(1) as slot:
        assert slot.pool_env(1) is None  # CPU slots: any warm pool serves


def test_lease_table_of_a_plain_dask_worker_comes_from_its_resources():
    table = DeviceLeases.from_environment({"CUDA_VISIBLE_DEVICES": "4,5"},
                                          {"device": 2.0, "kind-H100": 2.0})
    assert (table.ids, table.kind, table.gpu) == (("4", "5"), "H100", True)
    table = DeviceLeases.from_environment({}, {"device": 3.0, "kind-cpu": 3.0})
    assert (table.ids, table.kind, table.gpu) == (("0", "1", "2"), "cpu", False)


def test_detect_node_names_the_kind_and_refuses_mixed_nodes(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # this CPU test box interprets
    node = detect_node(gpus=[("0", "NVIDIA H100 80GB HBM3"), ("1", "NVIDIA H100 80GB HBM3")])
    assert node.gpu and node.kind == "H100-SXM5-80GB" and node.resources == {
        "device": 2, "kind-H100-SXM5-80GB": 2, "kind-H100": 2}
    # nvidia-smi's extra columns (memory, PCI device id) tell an H100 PCIe from an SXM
    pcie = detect_node(gpus=[("0", "NVIDIA H100 PCIe", "81559 MiB", "0x233110DE")])
    assert pcie.kind == "H100-PCIe-80GB" and pcie.family == "H100"
    cpu = detect_node(kind="A", gpus=[])
    assert (cpu.kind, cpu.detected_kind, cpu.gpu) == ("A", "cpu", False)
    assert detect_node(slots=3, gpus=[]).resources == {"device": 3, "kind-cpu": 3}
    with pytest.raises(DetectionError,
                       match="several kinds.*H100-PCIe-80GB: CUDA_VISIBLE_DEVICES=0"):
        detect_node(gpus=[("0", "NVIDIA H100 PCIe"), ("1", "NVIDIA A100-SXM4-80GB")])
    with pytest.raises(DetectionError, match="--kind"):
        detect_node(kind="H 100", gpus=[])


def test_worker_command_line_passes_unknown_options_to_dask(capsys):
    # As dask-jobqueue calls it: address first, then its own options.
    assert worker_main(["tcp://10.0.0.1:8786", "--name", "job-1", "--nthreads", "4",
                        "--memory-limit", "8GB", "--death-timeout", "60", "--kind", "A",
                        "--slots", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("-m distributed.cli.dask_worker tcp://10.0.0.1:8786 --nthreads 4 "
                           "--resources 'device=2 kind-A=2' --nanny --preload "
                           "attnbench.cluster.plugin --name job-1 --memory-limit 8GB "
                           "--death-timeout 60")
    assert "ATTNBENCH_KIND=A" in out and "ATTNBENCH_DEVICE_TYPE=cpu" in out
    assert worker_main(["--slots", "1"]) == 2
    assert "give the scheduler's address" in capsys.readouterr().err


# -- the client loop against a scripted cluster (no processes) ---------------------------------


class _FakeFuture:
    def __init__(self, key: str, case_id: str):
        self.key, self.case_id = key, case_id
        self.outcome = None  # ("result", record) | ("error", exc)
        self.callbacks = []
        self.status = "pending"

    def finish(self, kind: str, value) -> None:
        self.outcome, self.status = (kind, value), "finished"
        for fn in self.callbacks:
            fn(self)

    def add_done_callback(self, fn) -> None:
        self.callbacks.append(fn)
        if self.outcome is not None:
            fn(self)

    def result(self):
        kind, value = self.outcome
        if kind == "error":
            raise value
        return value

    def cancel(self) -> None:
        self.status = "cancelled"


class _FakeClient:
    """Answers every submission through ``script(case_dict, future)``."""

    def __init__(self, script):
        self.script, self.status, self.submitted = script, "running", []

    def submit(self, func, case_dict, options, attempt, devices, *, resources, key, pure):
        fut = _FakeFuture(key, Case.from_dict(case_dict).id)
        self.submitted.append((case_dict, resources))
        self.script(case_dict, fut)
        return fut


class _FakeConnection:
    def __init__(self, script, workers):
        self.client, self.where, self.slots = _FakeClient(script), "fake scheduler", 2
        self.worker_sets = list(workers)  # one list of workers per look; the last one stays

    def workers(self):
        return self.worker_sets.pop(0) if len(self.worker_sets) > 1 else self.worker_sets[0]


def _store(tmp_path: Path, gpus: list[str], seeds: int = 2):
    from attnbench.sweep.load import load_sweep
    from attnbench.results.store import RunStore

    path = tmp_path / "fake.yaml"
    path.write_text(json.dumps({"name": "fake", "defaults": {"backend": "naive"},
                                "axes": {"gpu": gpus, "seed": list(range(seeds))}}))
    return RunStore(tmp_path / "run", load_sweep(path), command=["test"])


def _passing(case_dict, fut) -> None:
    from attnbench.results.records import make_record

    fut.finish("result", make_record(Case.from_dict(case_dict), verdict="pass"))


def test_killed_worker_becomes_lost_and_nothing_is_written_twice(tmp_path):
    from types import SimpleNamespace

    from distributed.scheduler import KilledWorker

    from attnbench.results.records import make_record
    from attnbench.dispatch.run import run_pending

    store = _store(tmp_path, ["any"], seeds=3)

    def script(case_dict, fut):
        case = Case.from_dict(case_dict)
        if case.seed == 0:  # its workers died allowed-failures + 1 times
            fut.finish("error", KilledWorker(fut.key, SimpleNamespace(address="tcp://10.0.0.9:1"),
                                             3))
        elif case.seed == 1:  # the journal got this case meanwhile: the result is a duplicate
            store.append(make_record(case, verdict="pass"))
            _passing(case_dict, fut)
        else:  # a worker with another attnbench computes another id for the same case
            fut.finish("result", make_record(case.replace(seed=7), verdict="pass"))

    summary = run_pending(store, _FakeConnection(script, [_workers(("A", 1))]),
                          stream=open(os.devnull, "w"))
    lines = _journal(tmp_path / "run")
    assert [r["verdict"] for r in lines] == ["pass", "lost", "error"]  # "pass": seed 1's own
    assert lines[1]["reason"].startswith("KilledWorker: Attempted to run task 'case-")
    assert "returned a record for case" in lines[2]["reason"]
    assert len({r["id"] for r in lines}) == 3
    assert (summary.written, summary.lost, summary.duplicated) == (2, 1, 1)


def test_cases_of_a_kind_whose_worker_left_stay_pending(tmp_path, monkeypatch):
    from attnbench.dispatch import loop
    from attnbench.dispatch import run as runner

    monkeypatch.setattr(loop, "TICK_S", 0.01)
    held = []
    store = _store(tmp_path, ["A", "B"], seeds=2)
    both, only_b = _workers(("A", 1), ("B", 1)), _workers(("B", 1))
    # A's futures never finish (their worker died); B's do.
    conn = _FakeConnection(
        lambda d, fut: held.append(fut) if d["gpu"] == "A" else _passing(d, fut),
        [both, both, only_b])
    summary = runner.run_pending(store, conn, stream=open(os.devnull, "w"), worker_wait_s=0.05)
    assert summary.counts == {"pass": 2} and summary.not_run == 2 and summary.lost == 0
    assert {Case.from_dict(d).gpu for d, _ in conn.client.submitted} == {"A", "B"}
    assert all(f.status == "cancelled" for f in held)
    assert {c.gpu for c in store.pending()} == {"A"}  # the next run does them


def test_losing_the_scheduler_raises_one_line_and_records_nothing_in_flight(tmp_path):
    from distributed.client import FutureCancelledError

    from attnbench.errors import ClusterError
    from attnbench.dispatch.run import run_pending

    def script(case_dict, fut):
        if Case.from_dict(case_dict).seed == 0:
            _passing(case_dict, fut)
        else:
            fut.finish("error", FutureCancelledError(fut.key, "scheduler-connection-lost"))

    store = _store(tmp_path, ["any"], seeds=3)
    with pytest.raises(ClusterError, match=r"lost the connection to the Dask scheduler \(fake "
                                           r"scheduler\); 1 records written by this run"):
        run_pending(store, _FakeConnection(script, [_workers(("A", 4))]),
                    stream=open(os.devnull, "w"))
    assert [r["verdict"] for r in _journal(tmp_path / "run")] == ["pass"]


# -- the Dask ways of naming the scheduler ------------------------------------------------------


@pytest.mark.parametrize("how", ["scheduler-file", "DASK_SCHEDULER_ADDRESS"])
def test_run_finds_the_scheduler_the_way_dask_deployments_name_it(cluster, env, tmp_path, how):
    """SLURM/MPI deployments hand clients a scheduler file; Dask's Client reads
    DASK_SCHEDULER_ADDRESS. Either reaches the running scheduler (not an embedded cluster),
    and the run keeps Dask's performance report beside its records."""
    address, procs = cluster
    sweep = _sweep(tmp_path, "named", {"seed": [0, 1]}, gpu="A")
    out = tmp_path / "run"
    if how == "scheduler-file":
        proc = _run([str(sweep), "--out", str(out), "--scheduler-file",
                     str(procs.dir / "scheduler.json")], env)
    else:
        proc = _run([str(sweep), "--out", str(out)], dict(env, DASK_SCHEDULER_ADDRESS=address))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"running on scheduler {address} (from " in proc.stdout
    assert {r["env"]["worker"] for r in _journal(out)} == {"wA"}
    assert (out / "dask-performance.html").is_file()
