"""Plain helpers the test modules share (no fixtures, no hooks: those live in conftest.py).

``ROOT`` is the repository root, ``SUPPORT`` this folder (tests/support/: the helpers, the
test backends that sweeps name by module, and ``DATA``, the sweep files and recorded answers the
tests read); ``attnbench_cmd()`` is the command line that runs the CLI with the test's own
Python; ``alive(pid)`` says whether a process still runs; ``simulated_record(case)`` is a record
shaped like a simulated worker's. Test modules import them as ``from helpers import ...``; pytest
puts tests/support/ on sys.path (``pythonpath`` in pyproject.toml's [tool.pytest.ini_options]),
and ``SUPPORT`` goes on the PYTHONPATH of the processes a test starts.
"""

import sys
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
ROOT = SUPPORT.parents[1]
DATA = SUPPORT / "data"


def attnbench_cmd() -> list[str]:
    return [sys.executable, "-m", "attnbench.cli"]


def alive(pid: int) -> bool:
    """Running (zombies count as dead: they are only waiting for a reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def simulated_record(case, verdict: str = "pass") -> dict:
    """A record shaped like a simulated worker's (attnbench/cluster/simulation.py): ~1.2 KB
    as a journal line; benchmarks/make_journal.py writes the same shape."""
    from attnbench.results.records import make_record

    side = {"median_ms": 1.0, "q1_ms": 1.0, "q3_ms": 1.1, "n": 5, "tflops": 400.0,
            "noisy": False}
    timing = {"clock": "simulated", "world_size": 1, "flops_fwd": 1.0e9, "flops_bwd": 2.5e9,
              "fwd": dict(side), "bwd": dict(side)}
    env = {"host": "node-1", "pid": 4242, "simulated": True, "device": "sim:3",
           "gpu_kind": case.gpu, "worker": "sim-0", "worker_kind": case.gpu, "lease": ["3"],
           "lease_start": 1.0e9, "lease_end": 1.0e9 + 0.25}
    return make_record(case, verdict=verdict, reason="simulated", timing=timing, env=env,
                       duration_s=0.25, wall_s=0.25, attempt=1)


def in_fresh_interpreter(module: str, function: str, *args: str):
    """``tests/**/<module>.py``'s ``function(*args)`` run in a new Python process; its result
    (a number or a list of numbers), passed back as JSON. For memory measurements, which
    tracemalloc takes over every thread of the process: in the full suite a reader's growth per
    journal line read ~630 B (and once, on CI, 579 B where 103 B is the reader's own) --
    allocations of threads and state that earlier tests leave in the process. A measurement of
    the reader alone should not depend on which tests ran before it."""
    import json
    import subprocess

    folder = next((ROOT / "tests").rglob(f"{module}.py")).parent
    path = [str(folder), str(SUPPORT)]
    code = (f"import json, sys, threading; sys.path[:0] = {path!r}; "
            f"import {module} as m; result = m.{function}(*sys.argv[1:]); "
            "assert threading.active_count() == 1, threading.enumerate(); "
            "print(json.dumps(result))")
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def simulated_run(tmp_path: Path, lines: int, failing_every: int = 0) -> Path:
    """A run directory ``run<lines>`` under ``tmp_path``: a manifest and ``lines`` simulated
    records of 7 seeds, ids ``0..lines-1`` (16 hex digits); with ``failing_every`` = k, every
    k-th record (the first included) a ``fail``. For the readers' memory tests."""
    import json

    from attnbench.sweep.case import make_case

    run_dir = tmp_path / f"run{lines}"
    run_dir.mkdir()
    (run_dir / "manifest.json").write_text(json.dumps({"run_id": run_dir.name}))
    with open(run_dir / "records.jsonl", "w") as fh:
        for i in range(lines):
            case = make_case("memory", {"backend": "naive", "dtype": "bf16", "gpu": "SIM-A",
                                        "seed": i % 7})
            verdict = "fail" if failing_every and i % failing_every == 0 else "pass"
            fh.write(json.dumps({**simulated_record(case, verdict), "id": f"{i:016x}"}) + "\n")
    return run_dir
