"""A case that compiles is said while it compiles (issue 40, item 4), through real Dask: the
rank tells its pool, the worker logs a Dask event, the client's progress line says
``compiling <case>``. A `dask scheduler` and one `attnbench worker` on loopback, ~20 s."""

from __future__ import annotations

import os
import subprocess

from cluster_rig import Processes, write_sweep
from helpers import ROOT, SUPPORT, attnbench_cmd


def test_the_client_says_which_case_compiles(tmp_path):
    env = dict(os.environ, PYTHONWARNINGS="ignore", SLEEPY_S="0", SLEEPY_COMPILE_S="2.5")
    env["PYTHONPATH"] = os.pathsep.join([str(SUPPORT), str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("CUDA_VISIBLE_DEVICES", None)
    procs = Processes(tmp_path, env)
    try:
        address = procs.scheduler("scheduler")
        procs.worker("w1", address)
        sweep = write_sweep(tmp_path, "compiles", {"seed": [0]}, gpu="any")
        run = subprocess.run([*attnbench_cmd(), "run", str(sweep), "--scheduler", address,
                              "--out", str(tmp_path / "run"), "--no-report"],
                             capture_output=True, text=True, env=env, cwd=ROOT, timeout=180)
    finally:
        procs.stop_all()
    assert run.returncode == 0, run.stdout + run.stderr
    notes = [line for line in run.stderr.splitlines() if line.startswith("attnbench: compiling ")]
    assert len(notes) == 1, run.stderr  # once per case, however many calls compile
    assert "sleepy_backend:make: its first call compiles" in notes[0], notes
