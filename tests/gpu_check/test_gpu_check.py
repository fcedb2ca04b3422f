"""``attnbench gpu-check``: its plan fits an H200's 8 minutes, its sweeps are the issue's cases,
a step that hangs is killed at its timeout and the collection still runs, the pre-warm compiles
in parallel (against a stand-in of the compile lane's warm module), the clock log reads
nvidia-smi (a stand-in), and the CPU variant runs end to end into a folder ``attnbench show``
reads, without Dask.
"""

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest

from attnbench.gpu_check.collect import collect_folder
from attnbench.gpu_check.command import gpu_visible, run_check
from attnbench.gpu_check.costs import CPU, H200
from attnbench.gpu_check.folder import FILES, MAX_FILES, folder_files
from attnbench.gpu_check.plan import TARGET_S, make_plan
from attnbench.gpu_check.prewarm import run_prewarm
from attnbench.gpu_check.smi_log import SmiLog
from attnbench.gpu_check.step_main import StepConfig
from attnbench.gpu_check.sweeps import load_check_sweeps, with_kernel_configs
from attnbench.gpu_check.timer_check import compare
from attnbench.resources import ENV_KERNEL_CONFIGS
from attnbench.sweep.options import RunOptions
from helpers import ROOT, SUPPORT, alive, attnbench_cmd

import gpu_check_standins as standins

TESTS = str(SUPPORT)


def _with_timeouts(plan, **timeouts):
    plan.steps = [dataclasses.replace(s, timeout_s=timeouts.get(s.name, s.timeout_s))
                  for s in plan.steps]
    return plan


# -- the plan ------------------------------------------------------------------------------------

def test_the_h200_plan_fits_the_eight_minutes():
    """Margin: 185 s planned of 480. Mutant: today's compiling -- every autotune config, one
    process -- plans the pre-warm alone at 500+ s, and fails."""
    sweeps = load_check_sweeps(cpu=False)
    plan = make_plan(sweeps, H200)
    assert plan.total_s <= TARGET_S, "\n".join(plan.lines())
    assert [s.name for s in plan.steps] == ["probe", "prewarm", "timer", "speed", "accuracy",
                                            "collect"]
    assert all(s.timeout_s >= 2 * s.estimate_s for s in plan.steps if s.name != "collect")
    today = dataclasses.replace(sweeps, kernel_configs="autotune")
    assert make_plan(today, dataclasses.replace(H200, cores=1)).total_s > TARGET_S


def test_pinned_configs_compile_each_kernel_once():
    """The plan's count per variant: pinned = 1 compilation per kernel (the target); autotune
    (the mutant the pinned mode exists against) compiles several per tuned kernel."""
    pinned = make_plan(load_check_sweeps(cpu=False), H200)
    tuned = make_plan(load_check_sweeps(cpu=False, kernel_configs="autotune"), H200)
    assert pinned.variants and all(v.compiles == len(v.kernels) for v in pinned.variants)
    assert sum(v.compiles for v in tuned.variants) > 3 * sum(v.compiles for v in pinned.variants)
    assert tuned.step("prewarm").estimate_s > pinned.step("prewarm").estimate_s
    dense = next(v for v in pinned.variants if v.label == "flash bf16 d128 causal mha fwd+bwd")
    assert dense.kernels == ["forward", "bwd_preprocess", "bwd_dkdv", "bwd_dq"]


def test_the_plan_prints_without_torch_or_dask(tmp_path):
    """A laptop prints the plan: the driver imports no torch, triton, dask or distributed."""
    blocked = "torch triton dask distributed tornado bokeh".split()
    code = ("import sys\n"
            f"for m in {blocked!r}: sys.modules[m] = None\n"
            "from attnbench.cli import main\n"
            "code = main(['gpu-check', '--plan'])\n"
            "import attnbench.gpu_check.command, attnbench.gpu_check.run_cases\n"
            "import attnbench.gpu_check.prewarm, attnbench.gpu_check.timer_check\n"
            f"assert not [m for m in {blocked!r} if sys.modules.get(m) is not None]\n"
            "sys.exit(code)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "H200" in proc.stdout and f"within the {TARGET_S:.0f} s target" in proc.stdout
    assert "1 per kernel" in proc.stdout


def test_bad_arguments_are_one_line(tmp_path, cli_env):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    for args, expected in ((["--out", str(tmp_path / "full")], "exists and is not an empty"),
                           (["--budget", "5", "--plan"], "--budget: got 5.0, expected")):
        proc = subprocess.run([*attnbench_cmd(), "gpu-check", *args], capture_output=True,
                              text=True, env=cli_env)
        assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


# -- the sweeps ----------------------------------------------------------------------------------

def test_the_sweeps_are_the_issues_cases():
    sweeps = load_check_sweeps(cpu=False)
    speed = sweeps.speed.cases
    dense = {(c.backend, c.batch, c.seqlen_q, c.mask) for c in speed
             if not (c.decode or c.is_packed) and c.dtype == "bf16" and c.backward}
    assert dense == {(b, n, s, m) for b in ("triton", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient")
                     for n, s in ((16, 1024), (1, 16384)) for m in ("none", "causal")}
    assert all(c.head_dim == 128 for c in speed)
    assert {c.dtype for c in speed if not c.backward and not c.decode} == {
        "bf16", "fp8_e4m3", "fp8_e5m2"}
    assert sorted(c.seqlen_kv for c in speed if c.decode and c.page_size) == [65536, 1048576]
    assert sorted({c.seqlen_q for c in speed if c.is_packed}) == [32768, 131072]
    accuracy = sweeps.accuracy.cases
    assert any(c.seqlen_q == 16384 and c.mask == "causal" for c in accuracy)
    assert any(c.is_packed for c in accuracy)
    assert any(c.decode and c.page_size and c.seqlen_kv == 1 << 20 for c in accuracy)
    assert {c.dtype for c in accuracy if c.dtype.startswith("fp8")} == {"fp8_e4m3", "fp8_e5m2"}
    assert not sweeps.speed.options.accuracy and not sweeps.accuracy.options.timing.enabled
    for cpu in (False, True):  # one journal: the two files never share a case
        both = load_check_sweeps(cpu=cpu)
        assert not {c.id for c in both.speed.cases} & {c.id for c in both.accuracy.cases}
        assert len(both.timer_cases()) == 3


def test_the_kernel_config_mode_reaches_the_ranks():
    sweeps = load_check_sweeps(cpu=True)
    assert sweeps.pool_env() == {ENV_KERNEL_CONFIGS: "pinned"}
    options = with_kernel_configs(RunOptions(), "pinned")
    assert getattr(options, "kernel_configs", "pinned") == "pinned"  # once RunOptions has it
    assert sweeps.roles_manifest()["accuracy"]["options"]["accuracy"] is True


# -- steps: timeouts, the budget, the collection -------------------------------------------------

def test_a_hanging_step_is_killed_and_the_collection_still_runs(tmp_path, monkeypatch):
    """The probe hangs (a stand-in, with a child of its own): killed at its 6 s timeout with
    its child; the budget left is then under a step's minimum, so the other steps are
    skipped; the collection records every case as skipped with the reason, and the folder is a
    run directory `attnbench show` reads. Mutant: killing only the step's own process leaves
    its child alive, and the test sees it."""
    monkeypatch.setenv("PYTHONPATH", TESTS)
    monkeypatch.setenv(standins.PIDS, str(tmp_path / "pids"))
    sweeps = load_check_sweeps(cpu=True)
    plan = _with_timeouts(make_plan(sweeps, CPU, budget_s=30.0), probe=6.0)
    out, lines = tmp_path / "check", []
    started = time.monotonic()
    status, summary = run_check(out, sweeps, plan, echo=lines.append,
                                funcs={"probe": "gpu_check_standins:hang"})
    assert time.monotonic() - started < 45  # 6 s of probe, then the collection; loaded CI
    steps = {s["name"]: s for s in summary["steps"]}
    assert steps["probe"]["status"] == "timeout" and 6 <= steps["probe"]["seconds"] < 20
    assert "hanging" in steps["probe"]["output_tail"]
    assert all(steps[n]["status"] == "skipped" for n in ("prewarm", "timer", "speed", "accuracy"))
    assert steps["collect"]["status"] == "ok" and status == 1
    for pid in map(int, (tmp_path / "pids").read_text().split()):
        deadline = time.monotonic() + 5
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pid), pid
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) == len(sweeps.speed.cases) + len(sweeps.accuracy.cases)
    assert all(r["verdict"] == "skipped" and "step skipped" in r["reason"] for r in records)
    files = folder_files(out)
    assert len(files) <= MAX_FILES and set(files) <= set(FILES), files
    show = subprocess.run([*attnbench_cmd(), "show", str(out)], capture_output=True, text=True)
    assert show.returncode == 0 and "26/26 cases recorded" in show.stdout, show.stderr


def test_a_step_that_fails_is_said_in_a_line_and_the_next_step_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", TESTS)
    sweeps = load_check_sweeps(cpu=True)
    plan = make_plan(sweeps, CPU)
    funcs = {"probe": "gpu_check_standins:fail", "prewarm": "gpu_check_standins:noop",
             "timer": "gpu_check_standins:noop", "speed": "gpu_check_standins:noop",
             "accuracy": "gpu_check_standins:noop"}
    status, summary = run_check(tmp_path / "c", sweeps, plan, echo=lambda _: None, funcs=funcs)
    steps = {s["name"]: s for s in summary["steps"]}
    assert steps["probe"]["status"] == "failed" and status == 1
    assert "RuntimeError: a stand-in step that fails" in steps["probe"]["note"]
    assert steps["speed"]["status"] == "ok" and "noop step" in steps["speed"]["output_tail"]
    assert "its step ended without it" in json.loads(
        (tmp_path / "c" / "records.jsonl").read_text().splitlines()[0])["reason"]


def test_without_a_usable_gpu_the_check_chooses_the_cpu_variant(monkeypatch):
    """Here: no GPU at all. Anywhere: CUDA_VISIBLE_DEVICES hiding every GPU."""
    assert gpu_visible() is False
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_visible() is False


# -- the pre-warm --------------------------------------------------------------------------------

def _prewarm(tmp_path, monkeypatch, **config):
    monkeypatch.setenv("PYTHONPATH", TESTS)
    monkeypatch.setenv(ENV_KERNEL_CONFIGS, "pinned")
    step = StepConfig(out=str(tmp_path), cpu=True, warm_module="gpu_check_standins", **config)
    started = time.perf_counter()
    run_prewarm(step)
    return json.loads((tmp_path / "configs.json").read_text()), time.perf_counter() - started


def test_the_prewarm_compiles_variants_in_parallel(tmp_path, monkeypatch):
    """6 stand-in variants of 1 s on 3 cores: 3 at a time, never more (read from when each
    compile ran, not from the wall time, which a loaded machine stretches). Mutant: one at a
    time never overlaps."""
    report, _ = _prewarm(tmp_path, monkeypatch, cores=3, timeout_s=120)
    variants = report["variants"]
    assert report["status"] == "ok" and len(variants) >= 5
    assert all(v["status"] == "ok" and v["variant"]["config_mode"] == "pinned" for v in variants)
    assert report["kernels"] == sum(len(v["variant"]["kernels"]) for v in variants)
    edges = sorted([(v["began"], 1) for v in variants] + [(v["ended"], -1) for v in variants])
    running = [sum(step for _, step in edges[:i + 1]) for i in range(len(edges))]
    assert max(running) == 3, running
    assert report["plan_variants"], "the plan's own count is kept beside"


def test_a_hanging_compile_is_killed_and_the_others_kept(tmp_path, monkeypatch):
    monkeypatch.setenv(standins.HANG, "bf16 none")
    report, wall = _prewarm(tmp_path, monkeypatch, cores=8, timeout_s=15)  # 10 s of work
    statuses = {v["variant"]["name"]: v["status"] for v in report["variants"]}
    assert statuses.pop("bf16 none") == "timeout" and set(statuses.values()) == {"ok"}
    assert report["status"] == "incomplete" and wall < 14


def test_the_prewarm_without_the_warm_module_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", TESTS)
    step = StepConfig(out=str(tmp_path), cpu=True, warm_module="attnbench.kernels.nowarm")
    run_prewarm(step)
    report = json.loads((tmp_path / "configs.json").read_text())
    assert report["status"] == "unavailable" and "cases compile as they run" in report["note"]


def test_the_prewarm_is_rehearsed_where_nothing_compiles(tmp_path, monkeypatch):
    """Issue 43 item 1: without a CUDA device (the CPU variant, the rehearsal) the step still
    runs the parallel pre-warm -- processes, result files, the real launchers of every variant
    in Triton's interpreter -- one process per core, not per variant (a torch import per
    variant ran a loaded box's step out of time: "incomplete", 11 of 16)."""
    import attnbench.gpu_check.prewarm as prewarm
    processes = []
    real_start = prewarm._start
    monkeypatch.setattr(prewarm, "_start", lambda *a: processes.append(a[1]) or real_start(*a))
    began = time.perf_counter()
    run_prewarm(StepConfig(out=str(tmp_path), cpu=True, timeout_s=120, cores=2))
    report = json.loads((tmp_path / "configs.json").read_text())
    assert report["status"] == "rehearsed" and "nothing compiled" in report["note"], report
    assert len(processes) == 2 and sum(map(len, processes)) == len(report["variants"]) > 2
    assert all(v["status"] == "ok" and v["launched"] == len(v["variant"]["kernels"])
               for v in report["variants"]), report["variants"]
    assert report["kernels"] == 0 and time.perf_counter() - began < 90


def test_a_rehearsed_variant_the_launchers_refuse_fails_by_name(tmp_path, monkeypatch):
    """Rehearsal, all variants in one process: a variant whose launch raises is 'failed' with
    the exception's line, and the variants after it in that process still run. Mutant: letting
    the exception end the process loses every variant after it."""
    monkeypatch.setenv(standins.REHEARSE, "1")
    monkeypatch.setenv(standins.FAIL, "bf16 none")
    report, _ = _prewarm(tmp_path, monkeypatch, cores=1, timeout_s=60)
    statuses = {v["variant"]["name"]: v["status"] for v in report["variants"]}
    assert statuses.pop("bf16 none") == "failed" and set(statuses.values()) == {"ok"}, statuses
    failed = next(v for v in report["variants"] if v["status"] == "failed")
    assert "RuntimeError: a stand-in launch that fails" in failed["note"]
    assert report["status"] == "incomplete"


# -- the clock log -------------------------------------------------------------------------------

SMI = """#!{python}
import sys, time
args = " ".join(sys.argv[1:])
assert "--format=csv,nounits" in args and "-lms 500" in args, args
if "clocks_event_reasons" in args and "{old}" == "old":
    print('Field "clocks_event_reasons.active" is not a valid field to query.')
    sys.exit(2)
fields = args.split("--query-gpu=")[1].split()[0].split(",")
print(", ".join(f + (" [MHz]" if f.startswith("clocks.") else "") for f in fields), flush=True)
for i in range(100000):
    row = {{"clocks.sm": str(1980 - 100 * (i % 2)), "power.draw": "650.5",
           "temperature.gpu": "61", "clocks_event_reasons.active": "0x0000000000000004"}}
    print(", ".join(row.get(f, "1") for f in fields), flush=True)
    time.sleep(0.05)
"""


@pytest.mark.parametrize("driver", ["new", "old"])
def test_the_clock_log_reads_nvidia_smi(tmp_path, driver):
    """A stand-in nvidia-smi (it checks its arguments); an old driver refuses the throttle
    reasons' newer name and the log starts without it."""
    exe = tmp_path / "nvidia-smi"
    exe.write_text(SMI.format(python=sys.executable, old=driver))
    exe.chmod(0o755)
    log = SmiLog(tmp_path, executable=str(exe))
    assert log.start() == ""
    time.sleep(0.5)
    summary = log.stop()
    assert summary["file"] == "smi.csv" and summary["samples"] >= 3
    assert summary["sm_clock_mhz"]["max"] == 1980 and summary["power_w"]["max"] == 650.5
    assert ("throttled_samples" in summary) == (driver == "new")


def test_without_nvidia_smi_the_log_says_so(tmp_path):
    log = SmiLog(tmp_path, executable="no-such-nvidia-smi")
    assert "not found" in log.start()
    assert log.stop()["file"] is None and not (tmp_path / "smi.csv").exists()


# -- the timer check -----------------------------------------------------------------------------

def test_the_timer_check_reports_the_hosts_gap():
    def record(fwd_ms, note=""):
        return {"verdict": "timed", "timing": {"fwd": {"median_ms": fwd_ms}, "bwd": None,
                                                "note": note}}
    entry = compare("id", "label", {"eager": record(0.150), "graph": record(0.100)})
    assert entry["fwd"]["gap_us"] == pytest.approx(50.0) and entry["fwd"]["gap_pct"] == 33.33
    assert "bwd" not in entry


def test_a_backward_the_graph_could_not_capture_is_said_not_measured_as_a_gap():
    """Issue 43 item 3: an autograd backward falls back to eager in graph mode; its two eager
    times must not read as the host's share, and the summary says it fell back."""
    from attnbench.gpu_check.timer_check import describe, direction_text

    def record(fwd, bwd, bwd_as):
        return {"verdict": "timed", "timing": {
            "fwd": {"median_ms": fwd, "timed_as": "graph"},
            "bwd": {"median_ms": bwd, "timed_as": bwd_as},
            "note": "" if bwd_as == "graph" else "bwd: graph capture failed (...); timed eagerly"}}
    entry = compare("id", "label", {"eager": record(0.15, 0.40, "eager"),
                                    "graph": record(0.10, 0.30, "eager")})
    assert entry["fwd"]["gap_us"] == pytest.approx(50.0)
    assert entry["bwd"]["fell_back"] and entry["bwd"]["gap_us"] is None
    assert "bwd not captured, timed eagerly" in direction_text("bwd", entry["bwd"])
    assert "bwd not captured" in describe(entry)


def test_graph_mode_says_per_direction_what_was_timed_eagerly():
    """The record says, per direction, that graph mode fell back (on a CPU: both)."""
    from attnbench.execution.case_runner import run_case
    from attnbench.sweep.case import make_case
    from attnbench.sweep.options import RunOptions, TimingOptions
    case = make_case("t", {"backend": "sdpa", "seqlen_q": 64, "heads_q": 2, "head_dim": 16,
                           "dtype": "fp32"})
    options = RunOptions(accuracy=False, timing=TimingOptions(mode="graph", max_seconds=0.05))
    timing = run_case(case, options)["timing"]
    assert timing["fwd"]["timed_as"] == "eager" and timing["bwd"]["timed_as"] == "eager"
    assert "fwd: graph mode needs a CUDA device" in timing["note"]
    assert "bwd: graph mode needs a CUDA device" in timing["note"]


def test_a_probe_cut_in_the_middle_leaves_what_it_measured(tmp_path, monkeypatch):
    """Issue 43 item 2: the probe writes probe.json after every part, so a hang (here: the
    second SDPA choice never returns, stood in by an interrupt) keeps the device identity and
    the first choice; the summary says the probe was cut."""
    from attnbench.gpu_check import probe as probe_step
    from attnbench.gpu_check.step_main import StepConfig
    asked = []

    def stuck(case, device):
        asked.append(case.id)
        if len(asked) > 1:
            raise KeyboardInterrupt  # what a killed step never gets to write after
        return {"id": case.id, "sdpa_picks": "MATH"}
    monkeypatch.setattr(probe_step, "sdpa_choice", stuck)
    with pytest.raises(KeyboardInterrupt):
        probe_step.run_probe(StepConfig(out=str(tmp_path), cpu=True))
    written = json.loads((tmp_path / "probe.json").read_text())
    assert written["complete"] is False and written["env"] and written["precision"]
    assert written["sdpa"] == [{"id": asked[0], "sdpa_picks": "MATH"}]
    from attnbench.gpu_check.collect import _device
    assert _device(written)["probe_complete"] is False


# -- end to end, on the CPU ----------------------------------------------------------------------

@pytest.mark.slow
def test_the_cpu_variant_end_to_end_without_dask(tmp_path):
    """`attnbench gpu-check --cpu` with dask, distributed, tornado and bokeh unimportable in
    every process: every step ok, every case recorded (26), at most 8 files, `show` reads it.
    ~50 s alone on this 2-core machine."""
    blocked = tmp_path / "blocked"
    for name in ("dask", "distributed", "tornado", "bokeh"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('{name} is blocked')\n")
    env = {**os.environ, "PYTHONPATH": f"{blocked}:{ROOT}", "PYTHONWARNINGS": "ignore"}
    out = tmp_path / "check"
    proc = subprocess.run([*attnbench_cmd(), "gpu-check", "--cpu", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert {s["name"]: s["status"] for s in summary["steps"]} == {
        n: "ok" for n in ("probe", "prewarm", "timer", "speed", "accuracy", "collect")}
    assert sum(sum(c.values()) for role in summary["verdicts"].values()
               for c in role.values()) == 26
    assert summary["failing"] == [] and summary["figures"]
    files = folder_files(out)
    assert len(files) <= MAX_FILES and set(files) <= set(FILES), files
    assert sum(files.values()) < 4 << 20
    show = subprocess.run([*attnbench_cmd(), "show", str(out)], capture_output=True, text=True,
                          env=env)
    assert show.returncode == 0 and "26/26 cases recorded" in show.stdout, show.stderr


def test_collecting_an_untouched_folder_records_every_case(tmp_path):
    """The collection alone (every step lost): a complete run directory all the same."""
    sweeps = load_check_sweeps(cpu=True)
    plan = make_plan(sweeps, CPU)
    config = StepConfig(out=str(tmp_path))
    summary = collect_folder(config, sweeps, plan, [], {"note": "none"}, "now", time.monotonic())
    assert summary["compile"]["status"].startswith("no configs.json")
    records = (tmp_path / "records.jsonl").read_text().splitlines()
    assert len(records) == 26 and "its step did not run" in records[0]


@pytest.mark.parametrize("cpu", [False, True])
def test_the_plan_counts_the_variants_the_prewarm_compiles(cpu):
    """The plan's torch-free model of Triton variants (it must print where torch is absent)
    agrees with attnbench.kernels.warm, which the pre-warm compiles: same variants, same
    kernels. A drift (a constexpr the plan does not know) shows here."""
    from attnbench.gpu_check.plan import plan_variants
    from attnbench.gpu_check.sweeps import load_check_sweeps
    from attnbench.kernels.warm import variants

    sweeps = load_check_sweeps(cpu)
    cases = list(sweeps.speed.cases + sweeps.accuracy.cases)
    planned, warmed = plan_variants(cases, "pinned"), variants(cases, kernel_configs="pinned")
    assert len(planned) == len(warmed)
    assert sum(len(v.kernels) for v in planned) == sum(len(v["kernels"]) for v in warmed)
