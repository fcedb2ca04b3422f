"""The pre-warm step: compile every Triton variant the check's cases need, in parallel, before
any case is timed. ``configs.json``.

``attnbench.kernels.warm`` (the compile lane's module) names the variants of a list of cases
(:func:`variants`) and compiles one (:func:`compile_variant`: every kernel of the variant, on
the current device, nothing timed). Here each variant is compiled in a process of its own, as
many at once as the box has cores: compiling is single-threaded CPU work (LLVM, ptxas), and
Triton's on-disk cache is shared, so the rank processes of the sweeps then load the binaries
instead of compiling them. A variant whose process outlives the step is killed and recorded
as ``timeout``; one never started, as ``not started``. Without the warm module (an attnbench
before the compile lane) the step records ``unavailable`` and the cases compile as they run.
"""

from __future__ import annotations

import importlib
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from attnbench.errors import exception_summary
from attnbench.gpu_check.folder import CONFIGS
from attnbench.gpu_check.plan import plan_variants
from attnbench.gpu_check.step_main import StepConfig
from attnbench.gpu_check.sweeps import load_check_sweeps

POLL_S = 0.05
"""How often the running compiles are looked at (each takes seconds)."""
_ROOT = str(Path(__file__).resolve().parents[2])
_BOOT = ("import sys; sys.path.insert(0, {root!r}); "
         "from attnbench.gpu_check.prewarm import compile_child; "
         "sys.exit(compile_child(sys.argv[1:]))")


def run_prewarm(config: StepConfig) -> None:
    sweeps = load_check_sweeps(config.cpu, config.kernel_configs, config.sweeps_dir)
    cases = [c for c in sweeps.speed.cases + sweeps.accuracy.cases if c.backend == "triton"]
    report: dict[str, Any] = {
        "warm_module": config.warm_module, "kernel_configs": config.kernel_configs,
        "cores": config.cores, "cases": len(cases),
        "plan_variants": [asdict(v) for v in plan_variants(cases, config.kernel_configs)]}
    path = config.folder / CONFIGS
    try:
        warm = importlib.import_module(config.warm_module)
    except ModuleNotFoundError as exc:
        if not config.warm_module.startswith(exc.name or "\0"):
            raise  # the module is there but something it imports is not: a failure
        report.update(status="unavailable", note=f"no {config.warm_module} in this attnbench "
                      "(it comes with the compile lane): the cases compile as they run")
        path.write_text(json.dumps(report, indent=1))
        print(f"prewarm: {report['note']}")
        return
    started = time.perf_counter()
    variants = list(warm.variants(cases))
    compiles = getattr(warm, "compiles_here", lambda: True)()
    slots = max(1, min(config.cores, len(variants)))
    if compiles:
        print(f"prewarm: {len(variants)} variants of {len(cases)} triton cases, up to "
              f"{slots} compiling at once", flush=True)
        results = compile_parallel(variants, config)
    else:
        # Triton's interpreter compiles nothing, but the step is rehearsed all the same: the
        # same parallel processes, timeouts and result files, each running the real
        # launchers of its variants in the interpreter. One process per core (not per
        # variant): on a loaded box a torch import per variant ran the step out of time.
        print(f"prewarm: rehearsal without CUDA: {len(variants)} variants launched in Triton's "
              f"interpreter by {slots} processes at once (nothing compiles)", flush=True)
        results = compile_parallel(variants, config, per_process=math.ceil(len(variants) / slots))
    done = [r for r in results if r.get("status") == "ok"]
    complete = len(done) == len(results)
    report.update(
        status=("ok" if compiles else "rehearsed") if complete else "incomplete",
        seconds=round(time.perf_counter() - started, 2),
        compile_seconds=round(sum(float(r.get("seconds") or 0) for r in done), 2),
        kernels=sum(int(r.get("kernels") or 0) for r in done), variants=results)
    if not compiles:
        report["note"] = ("no CUDA device: a rehearsal (the parallel pre-warm's processes ran "
                          "every variant's launchers in Triton's interpreter; nothing compiled)")
    path.write_text(json.dumps(report, indent=1, default=str))
    print(f"prewarm: {len(done)}/{len(results)} variants, {report['kernels']} kernels, "
          f"{report['compile_seconds']:.1f} s of compiling in {report['seconds']:.1f} s")


def compile_parallel(variants: list[dict], config: StepConfig,
                     per_process: int = 1) -> list[dict]:
    """``compile_variant`` of the variants, ``per_process`` of them (one after another) in
    each process, at most ``config.cores`` processes at once; results in the variants'
    order."""
    slots = max(1, min(config.cores, len(variants)))
    jobs = [list(range(i, min(i + per_process, len(variants))))
            for i in range(0, len(variants), max(1, per_process))]
    scratch = Path(tempfile.mkdtemp(prefix="attnbench-prewarm-"))
    results: list[dict] = [{"variant": v, "status": "not started",
                            "note": "the step's time ran out first"} for v in variants]
    pending = list(range(len(jobs)))
    running: dict[int, tuple[subprocess.Popen, float]] = {}
    try:
        while pending or running:
            while pending and len(running) < slots and config.left_s() > 0:
                job = pending.pop(0)
                running[job] = (_start(job, [variants[i] for i in jobs[job]], config, scratch),
                                time.perf_counter())
            for job, (proc, began) in list(running.items()):
                if proc.poll() is None and config.left_s() > 0:
                    continue
                killed = proc.returncode is None
                if killed:
                    proc.kill()
                    proc.wait()
                done = _results(job, scratch)  # a killed process keeps the ones it finished
                for n, index in enumerate(jobs[job]):
                    results[index] = done.get(n) or (
                        {"variant": variants[index], "status": "timeout",
                         "note": "killed: the step's time ran out"} if killed
                        else _failed(variants[index], job, proc.returncode, scratch))
                    results[index]["process_s"] = round(time.perf_counter() - began, 2)
                    _say(results[index])
                del running[job]
            if not running and config.left_s() <= 0:
                break
            time.sleep(POLL_S)
    finally:
        for proc, _ in running.values():
            proc.kill()
        shutil.rmtree(scratch, ignore_errors=True)
    return results


def _start(job: int, variants: list[dict], config: StepConfig,
           scratch: Path) -> subprocess.Popen:
    (scratch / f"{job}.variants.json").write_text(json.dumps(variants))
    log = open(scratch / f"{job}.log", "wb")
    try:
        return subprocess.Popen(
            [sys.executable, "-c", _BOOT.format(root=_ROOT), config.warm_module,
             str(scratch / f"{job}.variants.json"), str(scratch / f"{job}.results")],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    finally:
        log.close()


def _results(job: int, scratch: Path) -> dict[int, dict]:
    """The job's finished variants by position (each written as it finished)."""
    done = {}
    for path in sorted((scratch / f"{job}.results").glob("*.json")):
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        result.setdefault("status", "ok")
        done[int(path.stem)] = result
    return done


def _failed(variant: dict, job: int, returncode: int, scratch: Path) -> dict:
    try:
        tail = (scratch / f"{job}.log").read_bytes()[-2000:].decode("utf-8", "replace")
    except OSError:
        tail = ""
    last = [line for line in tail.splitlines() if line.strip()][-1:] or [""]
    return {"variant": variant, "status": "failed",
            "note": f"exit status {returncode}: {last[0][:300]}", "output_tail": tail}


def _say(result: dict) -> None:
    variant = result.get("variant")
    name = variant.get("name") or variant.get("label") if isinstance(variant, dict) else None
    what = name or result.get("label") or json.dumps(variant, default=str)[:120]
    if result["status"] == "ok" and "launched" in result:  # the rehearsal: nothing compiles
        print(f"prewarm: {what}: {result['launched']} kernels launched in the interpreter "
              f"({float(result.get('launch_s') or 0):.1f} s; {result['process_s']:.1f} s with "
              "the process start)", flush=True)
    elif result["status"] == "ok":
        seconds = float(result.get("seconds") or 0)
        print(f"prewarm: {what}: {result.get('kernels')} kernels, {seconds:.1f} s compiling "
              f"({result['process_s']:.1f} s with the process start)"
              + (f"; {result['note']}" if result.get("note") else ""), flush=True)
    else:
        print(f"prewarm: {what}: {result['status']}: {result.get('note', '')}", flush=True)


def compile_child(argv: list[str]) -> int:
    """One process: ``MODULE VARIANTS_JSON RESULTS_DIR``; each variant's result is written as
    it finishes (``RESULTS_DIR/<position>.json``), so a kill keeps the ones before."""
    module, variants_path, results_dir = argv
    variants = json.loads(Path(variants_path).read_text())
    warm = importlib.import_module(module)
    Path(results_dir).mkdir()
    for n, variant in enumerate(variants):
        try:
            result = dict(warm.compile_variant(variant))
        except Exception as exc:  # noqa: BLE001 - this variant fails; the next ones still run
            result = {"variant": variant, "status": "failed",
                      "note": exception_summary(exc)[:300],
                      "output_tail": traceback.format_exc()[-2000:]}
        result.setdefault("variant", variant)
        if callable(getattr(warm, "label", None)) and isinstance(variant, dict):
            try:  # a short name for the step's output (the variant itself is a long dict)
                result.setdefault("label", str(warm.label(variant))[:200])
            except Exception:  # noqa: BLE001 - a name is a nicety, never a failure
                pass
        Path(results_dir, f"{n}.json").write_text(json.dumps(result, default=str))
    return 0
