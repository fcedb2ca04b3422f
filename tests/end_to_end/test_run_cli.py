"""`attnbench run` end to end on the embedded Dask cluster: records stream into the journal,
crashes and hangs become records, reruns resume, a torn last line is tolerated."""

import json
import subprocess

import pytest

from attnbench.results.store import load_records
from helpers import ROOT, attnbench_cmd

SWEEP = """
name: e2e
defaults: {batch: 1, heads_q: 4, head_dim: 32, seqlen_q: 64, dtype: fp32}
axes:
  backend: [naive, sdpa, testing.segfault, testing.hang, testing.raises, testing.oom]
  mask: [none, causal]
exclude:
  - {backend: testing.segfault, mask: causal}
  - {backend: testing.hang, mask: causal}
  - {backend: testing.raises, mask: causal}
  - {backend: testing.oom, mask: causal}
options:
  timeout_s: 4
  timing: {warmup: 1, min_samples: 3, max_samples: 5, max_seconds: 0.05}
"""


def run_cli(args, env, timeout=240):
    return subprocess.run([*attnbench_cmd(), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    import os
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    tmp = tmp_path_factory.mktemp("e2e")
    sweep = tmp / "e2e.yaml"
    sweep.write_text(SWEEP)
    out = tmp / "run"
    proc = run_cli(["run", str(sweep), "--out", str(out), "--no-report"], env)
    return sweep, out, proc, env


def test_every_case_becomes_one_record(finished_run):
    sweep, out, proc, _ = finished_run
    assert proc.returncode == 1, proc.stdout + proc.stderr  # failing cases -> exit 1
    records = load_records(out)
    assert len(records) == 8
    lines = (out / "records.jsonl").read_text().splitlines()
    assert len(lines) == 8 and len({json.loads(line)["id"] for line in lines}) == 8
    by_backend = {}
    for r in records:
        by_backend.setdefault(r["case"]["backend"], []).append(r)
    assert all(r["verdict"] == "pass" for r in by_backend["naive"] + by_backend["sdpa"])
    for r in by_backend["naive"]:
        assert r["timing"]["fwd"]["median_ms"] > 0 and r["timing"]["bwd"]["tflops"] > 0
        assert r["timing"]["clock"] == "perf_counter" and r["timing"]["fwd"]["samples_ms"]


def test_segfault_hang_and_exception_are_recorded(finished_run):
    _, out, proc, _ = finished_run
    records = {r["case"]["backend"]: r for r in load_records(out)}
    seg = records["testing.segfault"]
    assert seg["verdict"] == "crash"
    assert seg["crash"]["signal"] == "SIGSEGV" and seg["crash"]["exit_code"] == -11
    assert "SIGSEGV" in seg["reason"]
    hang = records["testing.hang"]
    assert hang["verdict"] == "timeout" and "4 s" in hang["reason"]
    err = records["testing.raises"]
    assert err["verdict"] == "error" and "deliberate failure" in err["reason"]
    assert "Traceback" in err["crash"]["traceback"]
    oom = records["testing.oom"]
    assert oom["verdict"] == "oom" and "out of memory" in oom["reason"]
    # ...and the sweep went on: the CLI printed the summary and where results are.
    assert "results in" in proc.stdout and "Dask dashboard" in proc.stdout
    assert "CRASH" in proc.stderr or "crash" in proc.stdout


def test_manifest_describes_the_run(finished_run):
    sweep, out, _, _ = finished_run
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["sweep"]["name"] == "e2e" and manifest["sweep"]["cases"] == 8
    assert manifest["sweep"]["source"] == sweep.read_text()
    assert manifest["versions"]["torch"] and manifest["hosts"]
    assert manifest["devices"][0]["device"] == "cpu"


def test_rerun_resumes_and_a_torn_line_is_tolerated(finished_run):
    sweep, out, _, env = finished_run
    again = run_cli(["run", str(sweep), "--out", str(out), "--no-report"], env)
    assert "8 already in" in again.stdout and "0 to run" in again.stdout
    # Cut the journal mid-record, as a kill during a write would.
    path = out / "records.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    keep = [line for line in lines if '"backend":"naive"' not in line or '"mask":"causal"' not in line]
    torn = [line for line in lines if line not in keep][0]
    path.write_text("".join(keep) + torn[: len(torn) // 2])
    assert len(load_records(out)) == 7  # the torn line is skipped when reading
    resumed = run_cli(["run", str(sweep), "--out", str(out), "--no-report"], env)
    assert "7 already in" in resumed.stdout and "1 to run" in resumed.stdout
    records = load_records(out)
    assert len(records) == 8
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_run_into_a_directory_of_another_sweep_is_refused(finished_run, tmp_path):
    _, out, _, env = finished_run
    other = tmp_path / "other.yaml"
    other.write_text("name: other\naxes: {backend: [naive], seqlen_q: [16]}\n")
    proc = run_cli(["run", str(other), "--out", str(out)], env)
    assert proc.returncode == 2
    assert "manifest.json: this run holds sweep 'e2e'" in proc.stderr


def test_show_summarises_a_run(finished_run):
    _, out, _, env = finished_run
    proc = run_cli(["show", str(out), "--all"], env)
    assert proc.returncode == 0
    assert "sweep 'e2e'" in proc.stdout and "crash" in proc.stdout and "timeout" in proc.stdout
    missing = run_cli(["show", str(out / "nope")], env)
    assert missing.returncode == 2 and "no manifest" in missing.stderr


def test_single_case_reruns_alone(finished_run, tmp_path):
    sweep, out, _, env = finished_run
    seg = [r for r in load_records(out) if r["case"]["backend"] == "testing.segfault"][0]
    proc = run_cli(["run", str(sweep), "--case", seg["id"][:8], "--out", str(tmp_path / "one"),
                    "--no-report"], env)
    assert proc.returncode == 1
    records = load_records(tmp_path / "one")
    assert [r["id"] for r in records] == [seg["id"]] and records[0]["verdict"] == "crash"
