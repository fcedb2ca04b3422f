"""How the orchestration holds up at hundreds of GPUs, simulated on one box.

    python benchmarks/scale_simulation.py [--cases 100000] [--gpus 288] [--per-worker 32]
        [--kinds 3] [--case-seconds 1.0] [--tp 1] [--dispatch lanes|tasks] [--no-churn]
        [--profile]

288 GPUs by default: 9 workers, 3 of each kind, so that the kinds have equal capacity (with 8,
one kind has less and its cases finish last while the others' devices wait).

Starts on loopback a `dask scheduler` and ``gpus / per-worker`` `attnbench worker
--simulate-gpus` processes of ``kinds`` kinds (cases lease real device ids from the workers'
lease tables, then sleep ``case-seconds``: attnbench/cluster/simulation.py), and drives a sweep of
``cases`` cases through the same driver loop as `attnbench run` / `submit` (LaneRun or SweepRun,
in this process, so its memory and time are measured). With churn, workers join and leave during the
run: at 20 % of the records one more worker joins, at 40 % one leaves cleanly (SIGTERM), at
60 % one is SIGKILLed mid-case.

Prints: cases per second through the driver (overall and while every GPU had work), driver
and scheduler peak RSS, journal appends per second (time inside ``RunStore.append`` and
``.flush``), the share of GPU time idle while cases of its kind were waiting (and while any
case was), and the checks: no device leased twice at once (from the records'
``env.lease_start``/``lease_end``), no case lost or duplicated.

What the box limits: every process here shares the same CPU cores (scheduler, driver, all
workers): the figures are a floor for a cluster whose scheduler and driver have cores of their
own.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import psutil  # noqa: E402  (a dependency of distributed)

from attnbench.cluster.connect import Connection  # noqa: E402
from attnbench.cluster.simulation import lease_overlaps  # noqa: E402
from attnbench.dispatch.lanes import DISPATCHES, make_run  # noqa: E402
from attnbench.dispatch.loop import Progress  # noqa: E402
from attnbench.results.journal import journal_records  # noqa: E402
from attnbench.results.store import RunStore  # noqa: E402
from attnbench.sweep.load import load_sweep  # noqa: E402


def write_sweep(path: Path, cases: int, kinds: list[str], tp: list[int]) -> None:
    lengths = [512, 1024, 2048, 4096]
    seeds = max(1, cases // (len(kinds) * len(lengths) * len(tp)))
    sweep = {"name": "scale", "defaults": {"backend": "naive", "batch": 1, "heads_q": 8,
                                           "head_dim": 64, "dtype": "bf16"},
             # a range, not a list: 83,333 seeds listed are ~0.5 MB of the 1 MiB a sweep may be
             "axes": {"gpu": kinds, "tp": tp, "seqlen_q": lengths,
                      "seed": {"range": [0, seeds - 1]}},
             "options": {"timeout_s": 300}}
    path.write_text(json.dumps(sweep))


class Cluster:
    def __init__(self, tmp: Path, case_seconds: float):
        self.tmp, self.case_seconds = tmp, case_seconds
        self.env = dict(os.environ, PYTHONWARNINGS="ignore")
        self.env["PYTHONPATH"] = os.pathsep.join([str(ROOT), self.env.get("PYTHONPATH", "")])
        self.procs: list[subprocess.Popen] = []
        self.workers: dict[str, subprocess.Popen] = {}
        self.kind_of: dict[str, str] = {}

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen:
        proc = subprocess.Popen(argv, stdout=open(self.tmp / f"{name}.log", "w"),
                                stderr=subprocess.STDOUT, env=self.env, cwd=ROOT,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def scheduler(self) -> tuple[str, int]:
        info = self.tmp / "scheduler.json"
        proc = self._start("scheduler", [sys.executable, "-m", "distributed.cli.dask_scheduler",
                                         "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                         "--scheduler-file", str(info)])
        while not (info.exists() and info.stat().st_size):
            time.sleep(0.1)
        return json.loads(info.read_text())["address"], proc.pid

    def worker(self, name: str, address: str, kind: str, gpus: int) -> None:
        self.kind_of[name] = kind
        self.workers[name] = self._start(name, [
            sys.executable, "-m", "attnbench.cli", "worker", "--scheduler", address, "--name",
            name, "--kind", kind, "--simulate-gpus", str(gpus), "--case-seconds",
            str(self.case_seconds), "--no-nanny", "--no-dashboard"])

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        # One deadline for all: waiting 30 s per process in turn stalled a run's end for
        # minutes when several workers were slow to leave.
        deadline = time.monotonic() + 15
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class Sampler(threading.Thread):
    """Once a second: driver and scheduler RSS, which workers are connected."""

    def __init__(self, conn: Connection, scheduler_pid: int, cluster: "Cluster"):
        super().__init__(daemon=True)
        self.cluster = cluster
        self.cpu: dict[int, float] = {}  # pid -> CPU seconds (user + system), last seen
        self.conn, self.scheduler = conn, psutil.Process(scheduler_pid)
        self.driver = psutil.Process()
        self.peak_driver = self.peak_scheduler = 0
        self.presence: dict[str, list[float]] = {}  # worker name -> [first seen, last seen]
        self.devices: dict[str, int] = {}
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(1.0):
            self.sample()

    def sample(self) -> None:
        """Called once before the run too: workers there from the start count from then."""
        self.sample_cpu()
        self.peak_driver = max(self.peak_driver, self.driver.memory_info().rss)
        try:
            self.peak_scheduler = max(self.peak_scheduler, self.scheduler.memory_info().rss)
            before = time.time()
            workers = self.conn.workers()
        except Exception:
            return
        now = time.time()
        for w in workers:  # first seen when asked, last seen when answered
            self.presence.setdefault(w.name, [before, now])[1] = now
            self.devices[w.name] = w.devices

    def sample_cpu(self) -> None:
        for proc in self.cluster.procs:
            try:
                times = psutil.Process(proc.pid).cpu_times()
            except psutil.Error:
                continue
            self.cpu[proc.pid] = times.user + times.system

    def cpu_of(self, pids) -> float:
        return sum(self.cpu.get(pid, 0.0) for pid in pids)


class Churn:
    """Workers join and leave as the run advances."""

    def __init__(self, cluster: Cluster, address: str, kinds: list[str], per_worker: int):
        self.steps = [(0.2, "join"), (0.4, "leave"), (0.6, "kill")]
        self.cluster, self.address, self.kinds, self.per_worker = cluster, address, kinds, \
            per_worker
        self.events: list[str] = []

    def __call__(self, fraction: float) -> None:
        while self.steps and fraction >= self.steps[0][0]:
            _, what = self.steps.pop(0)
            if what == "join":
                self.cluster.worker("sim-late", self.address, self.kinds[0], self.per_worker)
                self.events.append(f"{time.strftime('%H:%M:%S')} sim-late joins ({self.kinds[0]})")
            else:
                kind = self.kinds[1 if what == "leave" else -1]
                name = next(n for n, p in self.cluster.workers.items()
                            if p.poll() is None and n.endswith(f"-{kind}-0"))
                proc = self.cluster.workers[name]
                proc.send_signal(signal.SIGTERM if what == "leave" else signal.SIGKILL)
                self.events.append(f"{time.strftime('%H:%M:%S')} {name} "
                                   f"{'leaves (SIGTERM)' if what == 'leave' else 'SIGKILLed'}")


def lease_records(journal: Path) -> tuple[list[dict], int]:
    """What the analysis reads of each case's last record (id, verdict, its lease), streamed,
    and the journal's line count: the whole records of a 1M-case run would be ~7.5 GB here."""
    by_id: dict[str, dict] = {}
    lines = 0
    for lines, record in journal_records(journal):
        env = record.get("env") or {}
        by_id[record["id"]] = {"id": record["id"], "verdict": record["verdict"], "env": {
            k: env.get(k) for k in ("lease_start", "lease_end", "lease", "worker", "worker_kind")}}
    return list(by_id.values()), lines


def _idle(records: list[dict], presence: dict, devices: dict, t0: float) -> tuple[float, float]:
    """(busy, available) device-seconds from ``t0`` until fewer of these records' cases were
    left than devices: after that, idle devices are the sweep's tail, not the scheduler's
    doing."""
    ends = sorted(r["env"]["lease_end"] for r in records)
    at_end = sum(devices.get(n, 0) for n, (_, last) in presence.items() if last >= ends[-1] - 2)
    t1 = ends[max(0, len(ends) - max(at_end, 1) - 1)]
    busy = sum(max(0.0, min(r["env"]["lease_end"], t1) - max(r["env"]["lease_start"], t0))
               * len(r["env"]["lease"]) for r in records)
    available = sum(devices.get(name, 0) * max(0.0, min(last, t1) - max(first, t0))
                    for name, (first, last) in presence.items())
    return busy, available


def analyse(records: list[dict], lines: int, cases: int, sampler: Sampler,
            kind_of: dict[str, str]) -> dict:
    """Lease overlaps, idle share, rates -- from the journal alone (plus worker presence)."""
    lost = sum(r["verdict"] == "lost" for r in records)
    records = [r for r in records if (r.get("env") or {}).get("lease_start") is not None]
    overlaps = lease_overlaps(records)
    starts = sorted(r["env"]["lease_start"] for r in records)
    ends = sorted(r["env"]["lease_end"] for r in records)
    t0 = starts[0]
    devices_at_end = sum(sampler.devices.get(n, 0) for n, (_, last) in sampler.presence.items()
                         if last >= ends[-1] - 2)
    t1 = ends[max(0, len(ends) - max(devices_at_end, 1) - 1)]
    # Per kind: a device idles "because of scheduling" only while cases of its own kind wait
    # (with kinds of unequal capacity, one kind's devices run out of work first).
    busy = available = 0.0
    for kind in sorted(set(kind_of.values())):
        mine = [r for r in records if r["env"].get("worker_kind") == kind]
        if mine:
            b, a = _idle(mine, {n: p for n, p in sampler.presence.items()
                                if kind_of.get(n) == kind}, sampler.devices, t0)
            busy, available = busy + b, available + a
    all_busy, all_available = _idle(records, sampler.presence, sampler.devices, t0)
    in_window = sum(1 for e in ends if t0 <= e <= t1)
    return {"overlaps": overlaps, "idle_share": 1 - busy / available if available else None,
            "idle_all": 1 - all_busy / all_available if all_available else None,
            "window_s": t1 - t0, "rate_window": in_window / (t1 - t0) if t1 > t0 else None,
            "span_s": ends[-1] - t0, "distinct": len({r["id"] for r in records}), "lines": lines,
            "lost": lost,
            "devices_at_end": devices_at_end}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--gpus", type=int, default=288)
    parser.add_argument("--per-worker", type=int, default=32)
    parser.add_argument("--kinds", type=int, default=3)
    parser.add_argument("--case-seconds", type=float, default=1.0)
    parser.add_argument("--tp", default="1", help="tensor-parallel sizes, e.g. 1,2")
    parser.add_argument("--no-churn", action="store_true")
    parser.add_argument("--window", type=float, default=2.0,
                        help="cases in flight per device (the driver's default: 2)")
    parser.add_argument("--dispatch", choices=DISPATCHES, default="lanes",
                        help="a Dask task per case, or lanes that pull cases "
                        "(attnbench/dispatch/lanes.py)")
    parser.add_argument("--profile", action="store_true", help="cProfile the driver loop")
    parser.add_argument("--keep", action="store_true", help="keep the run directory")
    args = parser.parse_args()

    from distributed import Client

    kinds = [f"SIM-{chr(ord('A') + i)}" for i in range(args.kinds)]
    tmp = Path(tempfile.mkdtemp(prefix="attnbench-scale-"))
    sweep_path = tmp / "scale.yaml"
    write_sweep(sweep_path, args.cases, kinds, [int(t) for t in args.tp.split(",")])
    t = time.perf_counter()
    sweep = load_sweep(sweep_path)
    print(f"sweep: {len(sweep.cases)} cases over {args.gpus} simulated GPUs of {args.kinds} kinds "
          f"({args.gpus // args.per_worker} workers x {args.per_worker}), cases of "
          f"{args.case_seconds:g} s; loaded in {time.perf_counter() - t:.1f} s", flush=True)
    cluster = Cluster(tmp, args.case_seconds)
    try:
        address, scheduler_pid = cluster.scheduler()
        workers = args.gpus // args.per_worker
        for i in range(workers):
            kind = kinds[i % len(kinds)]
            cluster.worker(f"sim-{kind}-{i // len(kinds)}", address, kind, args.per_worker)
        client = Client(address, timeout="60s")
        client.wait_for_workers(workers, timeout=600)
        conn = Connection(client, None, args.gpus, where=f"scheduler {address}")
        store = RunStore(tmp / "run", sweep, command=["scale_simulation"])
        append, flush = store.append, store.flush
        spent = [0.0, 0]

        def timed_append(record, **kwargs):
            t = time.perf_counter()
            note = append(record, **kwargs)
            spent[0] += time.perf_counter() - t
            spent[1] += 1
            return note

        def timed_flush():
            t = time.perf_counter()
            flush()
            spent[0] += time.perf_counter() - t

        store.append, store.flush = timed_append, timed_flush
        sampler = Sampler(conn, scheduler_pid, cluster)
        sampler.sample()
        sampler.start()
        cpu_before = psutil.Process().cpu_times()
        sampler.sample_cpu()
        cpu_start = dict(sampler.cpu)
        churn = None if args.no_churn else Churn(cluster, address, kinds, args.per_worker)
        with open(tmp / "progress.log", "w") as progress_log:
            run = make_run(store, conn, Progress(0, 0, progress_log), dispatch=args.dispatch)
            total = len(run.cases)
            run.limit = lambda: max(2, int(args.window * sum(w.devices for w in run.workers)))
            if churn is not None:
                run.on_tick = lambda r: churn(r.progress.done / total)
            profiler = None
            if args.profile:
                import cProfile

                profiler = cProfile.Profile()
                profiler.enable()
            summary = run.run()
            if profiler is not None:
                profiler.disable()
        # The driver's whole life (the sweep's load and expansion included), before the
        # analysis below reads the journal back (Linux: KiB).
        driver_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
        print(f"{time.strftime('%H:%M:%S')} run done in {summary.wall_s:.0f} s; analysing",
              flush=True)
        sampler.stop_event.set()
        sampler.join()
        sampler.sample()  # the workers still there were there until the end
        cpu_after = psutil.Process().cpu_times()
        driver_cpu = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
        scheduler_cpu = sampler.cpu_of([scheduler_pid]) - cpu_start.get(scheduler_pid, 0.0)
        worker_pids = [p.pid for p in cluster.workers.values()]
        workers_cpu = sampler.cpu_of(worker_pids) - sum(cpu_start.get(p, 0.0)
                                                        for p in worker_pids)
        sampler.peak_driver = max(sampler.peak_driver, psutil.Process().memory_info().rss)
        store.close()
        records, lines = lease_records(tmp / "run" / "records.jsonl")
        found = analyse(records, lines, len(sweep.cases), sampler, cluster.kind_of)
        client.close()
        print(f"{time.strftime('%H:%M:%S')} analysed; stopping the cluster", flush=True)
    finally:
        cluster.stop()
    for event in (churn.events if churn else []):
        print(f"churn: {event}")
    print(f"records: {lines} lines, {found['distinct']} distinct of {len(sweep.cases)} cases, "
          f"{found['lost']} lost, {lines - found['distinct']} duplicated; "
          f"{summary.not_run} not run; devices leased twice at once: {found['overlaps']}")
    print(f"throughput: {summary.written / summary.wall_s:.0f} cases/s through the driver over "
          f"the whole run ({summary.written} in {summary.wall_s:.0f} s); "
          f"{found['rate_window']:.0f} cases/s while every GPU had work "
          f"({found['window_s']:.0f} s); ideal {args.gpus / args.case_seconds:.0f} cases/s")
    print(f"idle: {100 * found['idle_share']:.1f} % of GPU time idle while cases of its kind were "
          f"waiting ({100 * found['idle_all']:.1f} % while any case was waiting)")
    print(f"memory: driver peak RSS {driver_peak / 2**20:.0f} MiB (sampled during the run: "
          f"{sampler.peak_driver / 2**20:.0f} MiB), scheduler peak RSS "
          f"{sampler.peak_scheduler / 2**20:.0f} MiB")
    print(f"journal: {spent[1]} appends, {spent[1] / spent[0]:.0f} appends/s inside "
          f"RunStore.append and .flush ({1e3 * spent[0] / spent[1]:.2f} ms each, "
          f"write and fsync included)")
    per = 1e3 / max(1, summary.written)
    print(f"CPU per case: driver process {driver_cpu * per:.2f} ms (its Dask client included), "
          f"scheduler {scheduler_cpu * per:.2f} ms, workers {workers_cpu * per:.2f} ms "
          f"(all on {os.cpu_count()} shared cores, load average "
          f"{os.getloadavg()[0]:.1f}); with a core each, the driver alone would allow "
          f"{1e3 / (driver_cpu * per):.0f} cases/s and the scheduler "
          f"{1e3 / (scheduler_cpu * per):.0f} cases/s")
    duplicated = lines - found["distinct"]
    print(f"summary: {summary.written} cases of {args.case_seconds:g} s over {args.gpus} GPUs: "
          f"{summary.written / summary.wall_s:.0f} cases/s, driver peak RSS "
          f"{driver_peak / 2**20:.0f} MiB, idle {100 * found['idle_share']:.1f} %, "
          f"lost {found['lost']}, duplicated {duplicated}, double leases {found['overlaps']}, "
          f"wall {summary.wall_s:.0f} s")
    if args.profile:
        import pstats

        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
    if args.keep:
        print(f"run directory: {tmp / 'run'}")
    else:  # 100,000 records and the processes' logs: ~110 MB
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
