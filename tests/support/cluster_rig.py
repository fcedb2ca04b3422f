"""A cluster to test against: real processes on loopback, or a scripted one in process.

:class:`Processes` starts a ``dask scheduler`` and ``attnbench worker``s (logs in files, stopped
newest first); :func:`write_sweep` writes a small sweep of ``sleepy_backend`` cases,
:func:`journal_of` and :func:`counts_of` read back what a run wrote (submitted, written, lost,
duplicated); ``certificate`` is a fixture (a self-signed certificate, its own CA). In process,
with no processes: :func:`worker_infos` describes workers of given kinds, and
:class:`FakeConnection` / :class:`FakeClient` / :class:`FakeFuture` script what the cluster
answers; :func:`scripted_store` is a run's store, :func:`passing_record` a case's passing record.

Used by tests/cluster/, tests/dispatch/, tests/end_to_end/ and tests/hostile/ (a fixture is
taken by importing it: ``from cluster_rig import certificate``).
"""

from __future__ import annotations

import collections
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnbench.cluster.connect import WorkerInfo
from attnbench.sweep.case import Case
from helpers import ROOT, attnbench_cmd


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
        wait_for(lambda: info.exists() and info.stat().st_size, 60, f"{name} to start")
        return json.loads(info.read_text())["address"]

    def worker(self, name: str, address: str, *extra: str, env: dict | None = None):
        proc = self.start(name, [*attnbench_cmd(), "worker", "--scheduler", address, "--name", name,
                                 "--slots", "1", "--no-nanny", *extra], env=env)
        wait_for(lambda: "Registered to" in proc.log_path.read_text() or proc.poll() is not None,
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



def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def write_sweep(tmp: Path, name: str, axes: dict, gpu: str | None = None) -> Path:
    defaults = {"batch": 1, "heads_q": 2, "head_dim": 16, "seqlen_q": 32, "dtype": "fp32",
                "backend": "sleepy_backend:make"}
    if gpu:
        defaults["gpu"] = gpu
    path = tmp / f"{name}.yaml"
    path.write_text(json.dumps({"name": name, "defaults": defaults, "axes": axes,
                                "options": {"timeout_s": 60, "timing": {"enabled": False}}}))
    return path


def journal_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


def counts_of(cases: int, out: Path) -> dict:
    lines = journal_of(out)
    ids = collections.Counter(r["id"] for r in lines)
    return {"submitted": cases, "written": len(lines), "distinct": len(ids),
            "lost": sum(r["verdict"] == "lost" for r in lines),
            "duplicated": len(lines) - len(ids)}


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


# -- a scripted cluster (no processes) -------------------------------------------------------


def worker_infos(*specs: tuple[str, int]) -> list[WorkerInfo]:
    return [WorkerInfo(f"tcp://10.0.0.{i}:1", f"w{i}", {"device": n, f"kind-{kind}": n})
            for i, (kind, n) in enumerate(specs)]


class FakeFuture:
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


class FakeClient:
    """Answers every submission through ``script(case_dict, future)``."""

    def __init__(self, script):
        self.script, self.status, self.submitted = script, "running", []

    def submit(self, func, case_dict, options, attempt, devices, *, resources, key, pure):
        fut = FakeFuture(key, Case.from_dict(case_dict).id)
        self.submitted.append((case_dict, resources))
        self.script(case_dict, fut)
        return fut


class FakeConnection:
    def __init__(self, script, workers):
        self.client, self.where, self.slots = FakeClient(script), "fake scheduler", 2
        self.worker_sets = list(workers)  # one list of workers per look; the last one stays

    def workers(self):
        return self.worker_sets.pop(0) if len(self.worker_sets) > 1 else self.worker_sets[0]


def scripted_store(tmp_path: Path, gpus: list[str], seeds: int = 2):
    from attnbench.sweep.load import load_sweep
    from attnbench.results.store import RunStore

    path = tmp_path / "fake.yaml"
    path.write_text(json.dumps({"name": "fake", "defaults": {"backend": "naive"},
                                "axes": {"gpu": gpus, "seed": list(range(seeds))}}))
    return RunStore(tmp_path / "run", load_sweep(path), command=["test"])


def passing_record(case_dict, fut) -> None:
    from attnbench.results.records import make_record

    fut.finish("result", make_record(Case.from_dict(case_dict), verdict="pass"))
