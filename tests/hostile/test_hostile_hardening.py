"""The documented hardening must not break ``run`` (issue 41, item 4): against a scheduler
started with ``--preload attnbench.cluster.closed_http`` (docs/cluster.md's remedy for its
HTTP port) ``attnbench run --scheduler`` crashed printing the dashboard link (Dask's
``client.dashboard_link`` raised ``KeyError: 'dashboard'``), over TCP and TLS alike.

Real processes on loopback (a ``dask scheduler``, one ``attnbench worker``), one quick case
each; verified to fail before the fix (rc 1 and the KeyError's traceback).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from cluster_rig import Processes, certificate, journal_of, write_sweep  # noqa: F401
from helpers import ROOT, SUPPORT, attnbench_cmd


@pytest.fixture
def env(tmp_path):
    env = dict(os.environ, PYTHONWARNINGS="ignore", SLEEPY_S="0.05",
               SLEEPY_LOG=str(tmp_path / "forward-starts.log"))
    env["PYTHONPATH"] = os.pathsep.join([str(SUPPORT), str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


@pytest.mark.parametrize("protocol", ["tcp", "tls"])
def test_run_against_a_scheduler_without_its_http_port(tmp_path, env, certificate, protocol):
    cert, key = certificate
    tls = (["--tls-ca-file", str(cert), "--tls-cert", str(cert), "--tls-key", str(key)]
           if protocol == "tls" else [])
    procs = Processes(tmp_path, env)
    try:
        address = procs.scheduler("scheduler", "--preload", "attnbench.cluster.closed_http",
                                  *(["--protocol", "tls", *tls] if tls else []))
        assert address.startswith(f"{protocol}://127.0.0.1:")
        procs.worker("w0", address, *tls)
        sweep = write_sweep(tmp_path, "hardened", {"seed": [0]}, gpu="any")
        out = tmp_path / "out"
        done = subprocess.run([*attnbench_cmd(), "run", str(sweep), "--out", str(out),
                               "--scheduler", address, *tls, "--no-report"],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=180)
    finally:
        procs.stop_all()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "Dask dashboard none (the scheduler serves no HTTP port)" in done.stdout
    assert [r["verdict"] for r in journal_of(out)] == ["pass"]
