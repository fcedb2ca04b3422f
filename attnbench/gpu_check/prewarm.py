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
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

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
    if not getattr(warm, "compiles_here", lambda: True)():
        # Triton's interpreter compiles nothing: a process per variant would only import torch
        # (seconds each on a loaded box) to report that, and run the step out of time.
        report.update(status="skipped", variants=[{"variant": v} for v in variants], kernels=0,
                      seconds=0.0, compile_seconds=0.0, note="no CUDA device: Triton's "
                      "interpreter compiles nothing (the parallel pre-warm runs on a GPU)")
        path.write_text(json.dumps(report, indent=1, default=str))
        print(f"prewarm: {len(variants)} variants; {report['note']}")
        return
    print(f"prewarm: {len(variants)} variants of {len(cases)} triton cases, up to "
          f"{max(1, min(config.cores, len(variants)))} compiling at once", flush=True)
    results = compile_parallel(variants, config)
    done = [r for r in results if r.get("status") == "ok"]
    report.update(
        status="ok" if len(done) == len(results) else "incomplete",
        seconds=round(time.perf_counter() - started, 2),
        compile_seconds=round(sum(float(r.get("seconds") or 0) for r in done), 2),
        kernels=sum(int(r.get("kernels") or 0) for r in done), variants=results)
    path.write_text(json.dumps(report, indent=1, default=str))
    print(f"prewarm: {len(done)}/{len(results)} variants, {report['kernels']} kernels, "
          f"{report['compile_seconds']:.1f} s of compiling in {report['seconds']:.1f} s")


def compile_parallel(variants: list[dict], config: StepConfig) -> list[dict]:
    """``compile_variant`` of each variant in its own process, at most ``config.cores`` at
    once; results in the variants' order."""
    slots = max(1, min(config.cores, len(variants)))
    scratch = Path(tempfile.mkdtemp(prefix="attnbench-prewarm-"))
    results: list[dict] = [{"variant": v, "status": "not started",
                            "note": "the step's time ran out first"} for v in variants]
    pending = list(range(len(variants)))
    running: dict[int, tuple[subprocess.Popen, float]] = {}
    try:
        while pending or running:
            while pending and len(running) < slots and config.left_s() > 0:
                index = pending.pop(0)
                running[index] = (_start(index, variants[index], config, scratch),
                                  time.perf_counter())
            for index, (proc, began) in list(running.items()):
                if proc.poll() is None and config.left_s() > 0:
                    continue
                if proc.returncode is None:
                    proc.kill()
                    proc.wait()
                    results[index] = {"variant": variants[index], "status": "timeout",
                                      "note": "killed: the step's time ran out"}
                else:
                    results[index] = _result(index, variants[index], proc.returncode, scratch)
                results[index]["process_s"] = round(time.perf_counter() - began, 2)
                del running[index]
                _say(results[index])
            if not running and config.left_s() <= 0:
                break
            time.sleep(POLL_S)
    finally:
        for proc, _ in running.values():
            proc.kill()
        shutil.rmtree(scratch, ignore_errors=True)
    return results


def _start(index: int, variant: dict, config: StepConfig, scratch: Path) -> subprocess.Popen:
    (scratch / f"{index}.variant.json").write_text(json.dumps(variant))
    log = open(scratch / f"{index}.log", "wb")
    try:
        return subprocess.Popen(
            [sys.executable, "-c", _BOOT.format(root=_ROOT), config.warm_module,
             str(scratch / f"{index}.variant.json"), str(scratch / f"{index}.result.json")],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    finally:
        log.close()


def _result(index: int, variant: dict, returncode: int, scratch: Path) -> dict:
    try:
        result = json.loads((scratch / f"{index}.result.json").read_text())
        result["status"] = "ok"
        return result
    except (OSError, ValueError):
        tail = (scratch / f"{index}.log").read_bytes()[-2000:].decode("utf-8", "replace")
        last = [line for line in tail.splitlines() if line.strip()][-1:] or [""]
        return {"variant": variant, "status": "failed",
                "note": f"exit status {returncode}: {last[0][:300]}", "output_tail": tail}


def _say(result: dict) -> None:
    variant = result.get("variant")
    name = variant.get("name") or variant.get("label") if isinstance(variant, dict) else None
    what = name or json.dumps(variant, default=str)[:120]
    if result["status"] == "ok":
        seconds = float(result.get("seconds") or 0)
        print(f"prewarm: {what}: {result.get('kernels')} kernels, {seconds:.1f} s compiling "
              f"({result['process_s']:.1f} s with the process start)"
              + (f"; {result['note']}" if result.get("note") else ""), flush=True)
    else:
        print(f"prewarm: {what}: {result['status']}: {result.get('note', '')}", flush=True)


def compile_child(argv: list[str]) -> int:
    """One variant's process: ``MODULE VARIANT_JSON RESULT_JSON``."""
    module, variant_path, result_path = argv
    variant = json.loads(Path(variant_path).read_text())
    result = dict(importlib.import_module(module).compile_variant(variant))
    result.setdefault("variant", variant)
    Path(result_path).write_text(json.dumps(result, default=str))
    return 0
