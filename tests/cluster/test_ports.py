"""What each process listens on (issue #25, item 8), measured from the kernel's socket table.

``attnbench worker --no-dashboard`` opened an HTTP port on every interface anyway (Dask's flag
drops the Bokeh pages only; ``/health`` and ``/metrics`` stayed), and ``dask scheduler
--no-dashboard`` kept ``/info`` and ``/json``. Now the worker opens its Dask port and its
nanny's, nothing else, and ``dask scheduler --preload attnbench.cluster.closed_http`` only its
Dask port; an embedded ``attnbench run`` listens on loopback only. docs/cluster.md's ports table
is this test's measurement.

Mutants and margins: without the preload in ``dask_worker_argv`` the worker has one listening
port more (its HTTP server; the second case shows the measurement sees it); without
``--dashboard-address 127.0.0.1:0`` nothing here changes (it covers the milliseconds before the
preload runs); a LocalCluster without ``host="127.0.0.1"`` listens on 0.0.0.0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from helpers import ROOT, attnbench_cmd

WAIT_S = 90  # a scheduler and a worker start in 2-5 s here; 90 s for a box under load


def _listening(pid: int) -> set[tuple[str, int]]:
    """(ip, port) of every listening TCP socket of ``pid`` and its descendants."""
    found = set()
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            found |= {(c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="tcp")
                      if c.status == psutil.CONN_LISTEN}
        except psutil.NoSuchProcess:
            pass
    return found


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


@pytest.fixture
def scheduler(cli_env, tmp_path):
    """``dask scheduler`` on loopback with no HTTP port: (its address, its process)."""
    file = tmp_path / "scheduler.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", "0", "--no-dashboard", "--preload", "attnbench.cluster.closed_http",
         "--scheduler-file", str(file)], env=cli_env, cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + WAIT_S
        while not file.exists() or not file.read_text().strip():
            assert proc.poll() is None and time.monotonic() < deadline, "no scheduler"
            time.sleep(0.1)
        time.sleep(0.5)  # the file is written as it starts listening
        yield json.loads(file.read_text())["address"], proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("flags, http", [(["--no-dashboard"], False), ([], True)])
def test_worker_listens_on_its_dask_and_nanny_ports_only(cli_env, scheduler, flags, http):
    from distributed import Client

    address, scheduler_proc = scheduler
    worker = subprocess.Popen([*attnbench_cmd(), "worker", "--scheduler", address, "--slots",
                               "1", "--host", "127.0.0.1", *flags], env=cli_env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with Client(address, timeout=WAIT_S) as client:
            client.wait_for_workers(1, timeout=WAIT_S)
            time.sleep(1)  # registered: its ports are open
            (worker_address, info), = client.scheduler_info(n_workers=-1)["workers"].items()
            dask_ports = {("127.0.0.1", _port(worker_address)), ("127.0.0.1", _port(info["nanny"]))}
            opened = _listening(worker.pid)
            scheduler_opened = _listening(scheduler_proc.pid)
        assert scheduler_opened == {("127.0.0.1", _port(address))}
        if not http:
            assert opened == dask_ports and "dashboard" not in info.get("services", {})
            return
        extra = opened - dask_ports
        assert len(opened) == 3 and len(extra) == 1, opened
        (host, port), = extra
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=10) as answer:
            assert answer.read() == b"ok"  # the port the first case must not have
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def test_worker_dry_run_names_the_closed_http(cli_env):
    out = subprocess.run([*attnbench_cmd(), "worker", "--scheduler", "tcp://127.0.0.1:8786",
                          "--slots", "1", "--no-dashboard", "--dry-run"], env=cli_env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--preload attnbench.cluster.closed_http" in out.stdout
    assert "--dashboard-address 127.0.0.1:0" in out.stdout
    assert "DASK_DISTRIBUTED__WORKER__HTTP__ROUTES=[]" in out.stdout.splitlines()


@pytest.mark.parametrize("dispatch", ["tasks", "lanes"])
def test_embedded_run_listens_on_loopback_only(cli_env, tmp_path, dispatch):
    sweep = tmp_path / "ports.yaml"
    sweep.write_text(json.dumps({
        "name": "ports", "axes": {"seed": [0, 1, 2, 3]},
        "defaults": {"batch": 1, "heads_q": 2, "head_dim": 16, "seqlen_q": 32, "dtype": "fp32",
                     "backend": "sleepy_backend:make"},
        "options": {"timeout_s": 60, "timing": {"enabled": False}}}))
    out = tmp_path / "run"
    run = subprocess.Popen([*attnbench_cmd(), "run", str(sweep), "--out", str(out),
                            "--no-report", "--workers", "1", "--dispatch", dispatch],
                           env=dict(cli_env, SLEEPY_S="1.0"), cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        journal, deadline = out / "records.jsonl", time.monotonic() + WAIT_S
        while not (journal.exists() and journal.read_text().strip()):
            assert run.poll() is None and time.monotonic() < deadline, run.stdout.read()
            time.sleep(0.1)
        opened = _listening(run.pid)  # mid-run: scheduler, nanny, worker, HTTP, lanes
        assert run.wait(timeout=WAIT_S * 2) == 0, run.stdout.read()
    finally:
        if run.poll() is None:
            run.kill()
    assert len(opened) >= 4, opened  # the scheduler, its HTTP, the nanny, the worker
    assert {ip for ip, _ in opened} == {"127.0.0.1"}, opened
