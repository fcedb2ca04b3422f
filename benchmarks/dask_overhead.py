"""What Dask scheduling costs per case, and what the faults cost in records.

    python benchmarks/dask_overhead.py [--cases 400] [--fault-cases 12]

Starts on loopback a `dask scheduler` (the CLI) and two `attnbench worker`s (one CPU slot each),
then measures:

* Dask alone: trivial tasks (a function returning a small dict) submitted with the same
  resources and the same bounded window (2 x devices in flight) as ``attnbench run``.
* attnbench: trivial cases (backend ``testing.noop``, accuracy and timing off) through
  :func:`attnbench.dispatch.run.run_pending` on warm rank pools; per case = wall / cases, so two
  workers in parallel count once. Inside each record: ``wall_s`` (the task: device lease + rank
  pool round trip + the case) and ``duration_s`` (inside the rank).
* Faults, through ``attnbench run`` in a subprocess as a user would: a worker SIGKILLed while
  its rank is inside a case (its cases sleep 30 s), and the client interrupted (SIGINT) then
  resumed. Counts: cases submitted, records written, lost, duplicated.

Cases in the fault runs use ``tests/support/sleepy_backend.py`` (``tests/`` goes on the workers'
PYTHONPATH).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from attnbench.cluster.connect import connect  # noqa: E402
from attnbench.dispatch.run import run_pending  # noqa: E402
from attnbench.results.store import RunStore  # noqa: E402
from attnbench.sweep.load import load_sweep  # noqa: E402

SLEEPY = "sleepy_backend:make"


def trivial_task(i: int) -> dict:
    return {"id": i, "verdict": "pass"}


class Cluster:
    """A scheduler and two workers on loopback; stopped by pid."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.env = dict(os.environ, PYTHONWARNINGS="ignore", SLEEPY_S="0.2",
                        SLEEPY_LOG=str(tmp / "forward-starts.log"))
        self.env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), str(ROOT),
                                                  self.env.get("PYTHONPATH", "")])
        self.procs: list[subprocess.Popen] = []
        info = tmp / "scheduler.json"
        self._start("scheduler", [sys.executable, "-m", "distributed.cli.dask_scheduler",
                                  "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                  "--scheduler-file", str(info)])
        _wait(lambda: info.exists() and info.stat().st_size, 60)
        self.address = json.loads(info.read_text())["address"]
        for name in ("w1", "w2"):
            self.worker(name)

    def _start(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "w")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=env or self.env, start_new_session=True)
        self.procs.append(proc)
        return proc

    def worker(self, name: str, **env: str) -> subprocess.Popen:
        proc = self._start(name, [sys.executable, "-m", "attnbench.cli", "worker", "--scheduler",
                                  self.address, "--name", name, "--slots", "1", "--no-nanny"],
                           dict(self.env, **env))
        log = self.tmp / f"{name}.log"
        _wait(lambda: "Registered to" in log.read_text(), 90)
        return proc

    def close(self) -> None:
        # Workers before the scheduler, one at a time (stopped from both sides at once, a Dask
        # worker can hang in its close).
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _wait(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("gave up waiting")
        time.sleep(0.02)


def _write_sweep(path: Path, backend: str, cases: int, seed0: int = 0) -> Path:
    path.write_text(json.dumps({
        "name": path.stem, "defaults": {"batch": 1, "heads_q": 2, "head_dim": 16,
                                        "seqlen_q": 16, "dtype": "fp32", "backend": backend},
        "axes": {"seed": list(range(seed0, seed0 + cases))},
        "options": {"timeout_s": 60, "accuracy": backend != "testing.noop",
                    "timing": {"enabled": False}}}))
    return path


def dask_alone(address: str, tasks: int) -> float:
    """Seconds per task for trivial tasks, window of 4 in flight, resources like a case's."""
    from distributed import Client, as_completed

    with Client(address) as client:
        for fut in [client.submit(trivial_task, -i, resources={"device": 1}, pure=False)
                    for i in range(20)]:
            fut.result()
        t0 = time.perf_counter()
        todo = list(range(tasks))
        ac = as_completed([client.submit(trivial_task, todo.pop(), resources={"device": 1},
                                         pure=False) for _ in range(4)])
        for fut in ac:
            fut.result()
            if todo:
                ac.add(client.submit(trivial_task, todo.pop(), resources={"device": 1},
                                     pure=False))
        return (time.perf_counter() - t0) / tasks


def attnbench_cases(address: str, tmp: Path, cases: int) -> dict:
    conn = connect(address, 2)
    try:
        warm = load_sweep(_write_sweep(tmp / "warm.yaml", "testing.noop", 8, seed0=10_000))
        store = RunStore(tmp / "warm", warm, command=["bench"])
        run_pending(store, conn, stream=open(os.devnull, "w"))  # rank pools start here
        store.close()
        sweep = load_sweep(_write_sweep(tmp / "noop.yaml", "testing.noop", cases))
        store = RunStore(tmp / "noop", sweep, command=["bench"])
        summary = run_pending(store, conn, stream=open(os.devnull, "w"))
        store.close()
    finally:
        conn.close()
    records = list(store.done.values())
    assert summary.written == cases and summary.counts["pass"] == cases, summary
    return {"per_case_s": summary.wall_s / cases,
            "task_s": statistics.median(r["wall_s"] for r in records),
            "inside_s": statistics.median(r["duration_s"] for r in records)}


def _counts(cases: int, out: Path) -> str:
    lines = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    ids = collections.Counter(r["id"] for r in lines)
    return (f"submitted {cases}, written {len(lines)} ({len(ids)} distinct), "
            f"lost {sum(r['verdict'] == 'lost' for r in lines)}, "
            f"duplicated {len(lines) - len(ids)}")


def _cli(cluster: Cluster, sweep: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "attnbench.cli", "run", str(sweep), "--out",
                             str(out), "--scheduler", cluster.address, "--no-report"],
                            env=cluster.env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def kill_a_worker(cluster: Cluster, tmp: Path, cases: int) -> str:
    starts = Path(cluster.env["SLEEPY_LOG"])
    victim = cluster.worker("victim", SLEEPY_S="30")
    sweep = _write_sweep(tmp / "kill.yaml", SLEEPY, cases)
    client = _cli(cluster, sweep, tmp / "kill")

    def victim_busy() -> bool:
        lines = starts.read_text().splitlines() if starts.exists() else []
        return any(_parent(int(line.split()[0])) == victim.pid for line in lines)

    _wait(victim_busy, 120)
    victim.send_signal(signal.SIGKILL)
    code = client.wait(timeout=300)
    return f"exit {code}; " + _counts(cases, tmp / "kill")


def interrupt_and_resume(cluster: Cluster, tmp: Path, cases: int) -> str:
    sweep = _write_sweep(tmp / "interrupt.yaml", SLEEPY, cases, seed0=100)
    out = tmp / "interrupt"
    client = _cli(cluster, sweep, out)
    _wait(lambda: (out / "records.jsonl").exists()
          and len((out / "records.jsonl").read_text().splitlines()) >= cases // 4, 120)
    client.send_signal(signal.SIGINT)
    first = client.wait(timeout=60)
    partial = len((out / "records.jsonl").read_text().splitlines())
    second = _cli(cluster, sweep, out).wait(timeout=300)
    return (f"exit {first} after {partial} records, resume exit {second}; "
            + _counts(cases, out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=400, help="trivial cases to time")
    parser.add_argument("--fault-cases", type=int, default=12, help="cases in each fault run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="attnbench-dask-") as tmp_name:
        tmp = Path(tmp_name)
        cluster = Cluster(tmp)
        try:
            alone = dask_alone(cluster.address, args.cases)
            print(f"Dask alone, trivial task, 2 workers x 1 slot: {alone * 1e3:7.2f} ms per task")
            ours = attnbench_cases(cluster.address, tmp, args.cases)
            print(f"attnbench, noop case (accuracy, timing off): {ours['per_case_s'] * 1e3:7.2f} "
                  f"ms per case  (task median {ours['task_s'] * 1e3:.2f} ms, inside the rank "
                  f"{ours['inside_s'] * 1e3:.2f} ms)")
            print(f"  -> attnbench over Dask alone: {(ours['per_case_s'] - alone) * 1e3:+.2f} ms "
                  "per case")
            print("SIGKILL of a worker mid-case:", kill_a_worker(cluster, tmp, args.fault_cases))
            print("SIGINT of the client, resume:",
                  interrupt_and_resume(cluster, tmp, args.fault_cases))
        finally:
            cluster.close()


if __name__ == "__main__":
    main()
