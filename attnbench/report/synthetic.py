"""Synthetic run directories that follow the record schema, for tests and dashboard previews.

Cases come from a real sweep text through :func:`attnbench.sweep.load.parse_sweep` and records from
:func:`attnbench.results.records.make_record`, so ids, labels and features are the real ones; only
the numbers are made up (a plausible roofline for timings, dtype-sized errors for accuracy). The
three seed bugs of ``/work/shared/seeds`` are planted so the accuracy heatmap can be checked for
them:

* seeds/000: ``transformer_engine`` with CP > 1, no causal mask and dropout: the backward
  segfaults (the rng state for the dropout recompute is missing) -> ``crash`` SIGSEGV.
* seeds/001: ``transformer_engine`` bf16 without dropout: dQ is wrong (rel. error ~1.1), and its
  TP=2 result disagrees with TP=1 (parity error ~0.5) -> ``fail`` on dq only.
* seeds/004: ``triton`` with MQA and ALiBi: the bias is laid out [b, sq*np, sk] instead of
  [b, np*sq, sk] -> every tensor wrong -> ``fail``.

GPU names are either the coarse kinds of records written before exact identity (``H100``,
``A100``, ...: env with ``gpu_kind``/``torch``/``triton`` only, timing without ``noisy``, GB/s
or memory) or exact kinds (``H100-SXM5-80GB``, ``H100-PCIe-80GB``, ``H200-SXM-141GB``,
``A100-SXM4-80GB``: env with ``identity``/``software``/``backend``, timing with every field
:mod:`attnbench.timing.case` writes), so reports are tested on both.

Usage: ``python -m attnbench.report.synthetic OUT_DIR [--gpu H100 --gpu A100]``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path
from typing import Any, Sequence

from attnbench.hardware import kind_from_name, peak_tflops
from attnbench.results.records import TENSORS, make_record
from attnbench.sweep.case import Case
from attnbench.sweep.flops import case_bytes, case_flops
from attnbench.sweep.load import parse_sweep

PEAK_TFLOPS = {  # dense tensor-core peaks (bf16/fp16) from the vendor data sheets
    "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A6000": 155.0,
}
DEVICE_NAMES = {"H100": "NVIDIA H100 80GB HBM3", "A100": "NVIDIA A100-SXM4-80GB",
                "L40S": "NVIDIA L40S", "A6000": "NVIDIA RTX A6000"}
# Exact kinds: what NVML would say about one such card (public datasheets and nvidia-smi
# screens; tests/support/data/nvml holds the recorded answers). Kind, family and peaks come from
# attnbench.hardware, as in a real record.
IDENTITY_FIELDS = ("name", "pci_device_id", "sm_count", "memory_total_gib", "compute_capability",
                   "sm_clock_max_mhz", "memory_clock_max_mhz", "power_limit_w")
_CARDS = {  # kind: the IDENTITY_FIELDS, in order
    "H100-SXM5-80GB": ("NVIDIA H100 80GB HBM3", "0x2330", 132, 79.65, "9.0", 1980, 2619, 700.0),
    "H100-PCIe-80GB": ("NVIDIA H100 PCIe", "0x2331", 114, 79.65, "9.0", 1755, 1593, 350.0),
    "H200-SXM-141GB": ("NVIDIA H200", "0x2335", 132, 140.4, "9.0", 1980, 3201, 700.0),
    "A100-SXM4-80GB": ("NVIDIA A100-SXM4-80GB", "0x20B2", 108, 79.25, "8.0", 1410, 1593, 400.0),
}
IDENTITIES: dict[str, dict[str, Any]] = {kind: dict(zip(IDENTITY_FIELDS, facts))
                                         for kind, facts in _CARDS.items()}
SOFTWARE = {"python": "3.11.7", "triton": "3.1.0", "cuda_runtime": "12.4", "cudnn": "9.1.0",
            "nccl": "2.21.5", "driver_version": "550.54.15", "cuda_driver_version": "12.4",
            "attnbench": "0.1.0", "commit": "0123456789abcdef0123456789abcdef01234567",
            "dirty": False}
MEASURED_SHARE = 0.8  # measured matmul peak / datasheet peak (790 of 989 TFLOP/s on an H200)
# Fraction of peak each backend reaches at long sequences (forward, backward).
EFFICIENCY = {"naive": (0.18, 0.15), "sdpa_flash": (0.62, 0.48), "triton": (0.55, 0.40),
              "transformer_engine": (0.66, 0.52)}
# Relative L2 error of the same-dtype naive baseline against fp64 (rough orders of magnitude).
BASE_ERROR = {"bf16": 3.5e-3, "fp16": 4.5e-4, "fp32": 2e-6}


SIZES = {
    # size -> (seqlens crossed, dtypes crossed, seqlens of the feature cases, of the CP/TP cases)
    "full": ((1024, 2048, 4096, 8192, 16384), ("bf16", "fp16"), (1024, 4096, 16384), (4096, 16384)),
    "small": ((1024, 4096, 16384), ("bf16",), (4096,), (4096,)),
}


def sweep_text(gpus: Sequence[str], size: str = "full") -> str:
    seqlens, dtypes, feature_lens, parallel_lens = SIZES[size]
    includes = []
    for backend in ("triton", "transformer_engine", "sdpa_flash"):
        for s in feature_lens:
            for heads_kv in (16, 1):
                includes.append({"backend": backend, "seqlen_q": s, "heads_kv": heads_kv,
                                 "bias": "alibi", "mask": "causal"})
            includes.append({"backend": backend, "seqlen_q": s, "dropout": 0.1})
        includes.append({"backend": backend, "seqlen_q": seqlens[-1], "softcap": 30.0,
                         "mask": "causal"})
    for backend in ("triton", "transformer_engine"):
        for s in parallel_lens:
            for mask in ("none", "causal"):
                for dropout in (0.0, 0.1):
                    for cp in (2, 4):
                        includes.append({"backend": backend, "seqlen_q": s, "mask": mask,
                                         "dropout": dropout, "cp": cp})
                    includes.append({"backend": backend, "seqlen_q": s, "mask": mask,
                                     "dropout": dropout, "tp": 2})
    lines = [
        f"name: synthetic-{size}",
        "description: made-up numbers in the real record schema (attnbench.report.synthetic)",
        "defaults: {batch: 2, heads_q: 16, head_dim: 128, dtype: bf16, seed: 0}",
        "axes:",
        f"  gpu: [{', '.join(gpus)}]",
        "  backend: [naive, sdpa_flash, triton, transformer_engine]",
        f"  seqlen_q: {list(seqlens)}",
        "  heads_kv: [16, 4, 1]" if size == "full" else "  heads_kv: [16, 1]",
        "  mask: [none, causal]",
        f"  dtype: [{', '.join(dtypes)}]",
        "include:",
    ]
    # include entries are not crossed with the axes: one per GPU kind
    lines += ["  - " + json.dumps({**inc, "gpu": gpu}) for gpu in gpus for inc in includes]
    lines += ["options: {timeout_s: 120}", ""]
    return "\n".join(lines)


def _flops_fwd(c: Case) -> float:
    full = 4.0 * c.batch * c.heads_q * c.seqlen_q * c.seqlen_kv * c.head_dim
    return full * (0.5 if c.mask == "causal" else 1.0)


def _peak(gpu: str) -> float:
    return PEAK_TFLOPS[gpu] if gpu in PEAK_TFLOPS else peak_tflops(gpu, "bf16")


def _timing(c: Case, gpu: str, rng: random.Random, slowdown: float,
            noisy: bool = False) -> dict[str, Any]:
    """``rng`` is the run's: it moves the samples, not the case's true speed. ``noisy``: a
    wide spread, flagged as never settled."""
    truth = random.Random(f"{c.replace(gpu='any').id}/{gpu}/timing")
    peak = _peak(gpu)
    fwd_eff, bwd_eff = EFFICIENCY.get(c.backend, (0.3, 0.25))
    ramp = c.seqlen_q / (c.seqlen_q + 1500.0)  # short sequences cannot fill the chip
    out: dict[str, Any] = {"clock": "cuda_events", "flops_fwd": _flops_fwd(c),
                           "flops_bwd": 2.5 * _flops_fwd(c)}  # 2.0 (bwd) + 0.5 (recompute)
    exact = gpu in IDENTITIES
    if exact:  # the fields of attnbench.timing.case
        out.update(mode="eager", world_size=c.world_size, l2_flush_bytes=256 << 20)
        out["flops_fwd"], out["flops_bwd"] = case_flops(c)
        out["bytes_fwd"], out["bytes_bwd"] = case_bytes(c)
        out.update(peak_tflops=peak, measured_peak_tflops=round(peak * MEASURED_SHARE, 1))
    for d, eff in (("fwd", fwd_eff), ("bwd", bwd_eff)):
        eff *= ramp * truth.uniform(0.95, 1.05)
        if c.dropout:
            eff *= 0.8
        if c.world_size > 1:
            eff *= 0.82 if c.tp > 1 else 0.75  # communication not hidden behind compute
        flops = out[f"flops_{d}"] / max(c.world_size, 1)
        median = flops / (peak * eff * 1e12) * 1e3 * slowdown
        spread = rng.uniform(0.005, 0.03) * (8 if noisy else 1)
        n = rng.randint(8, 40)
        samples = sorted(median * abs(1 + rng.gauss(0, spread)) for _ in range(n))
        q1, q3 = samples[n // 4], samples[(3 * n) // 4]
        med = samples[n // 2]
        tflops = out[f"flops_{d}"] / (med * 1e-3) / 1e12
        out[d] = {"median_ms": med, "q1_ms": q1, "q3_ms": q3, "min_ms": samples[0], "n": n,
                  "samples_ms": [round(s, 5) for s in samples], "tflops": tflops,
                  "pct_peak": 100.0 * tflops / peak}
        if exact:
            traffic = out[f"bytes_{d}"]
            scores = 4.0 * c.batch * c.heads_q * c.seqlen_q * c.seqlen_kv  # fp32 S x S
            memory = traffic * (1.5 if d == "fwd" else 2.0) + (scores if c.backend == "naive"
                                                                 else 0.0)
            out[d].update(calls_per_sample=1 if med > 0.05 else 4, warmup_calls=25,
                          warmup_ms=round(max(25.0, 25 * med), 3), noisy=noisy,
                          pct_measured_peak=100.0 * tflops / out["measured_peak_tflops"],
                          gbps=traffic / (med * 1e-3) / 1e9,
                          peak_memory_bytes=int(memory / max(c.world_size, 1)))
    return out


def _env(gpu: str, host: str, versions: dict[str, str], software: dict[str, Any]) -> dict:
    """A record's env: the coarse fields of old records, or (exact kinds) what
    attnbench.hardware.device.device_env writes."""
    if gpu not in IDENTITIES:
        return {"host": host, "device": "cuda:0", "gpu_kind": gpu,
                "device_name": DEVICE_NAMES[gpu], **versions}
    facts = IDENTITIES[gpu]
    kind = kind_from_name(facts["name"], facts["memory_total_gib"] * 1024,
                          facts["pci_device_id"])
    assert kind.kind == gpu, (kind, gpu)  # the table agrees with attnbench.hardware
    soft = {**SOFTWARE, "torch": versions["torch"], **software}
    identity = {**facts, "device_type": "cuda", "index": 0, "form_factor": kind.form_factor,
                "uuid": f"GPU-{host}-0", "pci_bus_id": "00000000:18:00.0",
                "memory_total_bytes": int(facts["memory_total_gib"] * (1 << 30)),
                "sm_clock_app_mhz": facts["sm_clock_max_mhz"],
                "power_limit_enforced_w": facts["power_limit_w"], "ecc_enabled": True,
                "driver_version": soft["driver_version"],
                "cuda_driver_version": soft["cuda_driver_version"], "unreadable": []}
    return {"host": host, "python": soft["python"], "attnbench": soft["attnbench"], "pid": 4242,
            "device": "cuda:0", "device_name": facts["name"], "gpu_kind": kind.kind,
            "gpu_family": kind.family, "torch": soft["torch"], "triton": soft["triton"],
            "identity": identity, "software": soft}


def _accuracy(c: Case, broken: dict[str, float]) -> tuple[dict, list]:
    rng = random.Random(f"{c.replace(gpu='any').id}/accuracy")  # same inputs, same errors
    base = BASE_ERROR[c.dtype] * (1 + 0.15 * math.log2(c.seqlen_q / 1024))
    tensors, checks = {}, []
    for t in TENSORS:
        baseline = base * rng.uniform(0.8, 1.2) * (1.6 if t != "out" else 1.0)
        rel = broken.get(t, baseline * rng.uniform(0.7, 1.3))
        bound = 2.0 * baseline  # the flash-attn rule: at most twice the baseline's error
        tensors[t] = {"rel_l2": rel, "max_abs": rel * 8, "cosine": 1 - rel * rel / 2,
                      "nonfinite": 0, "baseline_rel_l2": baseline, "ratio": rel / baseline,
                      "bound": bound, "baseline": "fused"}
        checks.append({"check": "reference", "tensor": t, "metric": "rel_l2", "value": rel,
                       "bound": bound, "passed": rel <= bound})
    return {"reference": "exact-mask" if c.dropout else "exact", "tensors": tensors,
            "identities": {"dv_v": {"value": 1e-6, "bound": 1e-3},
                           "dq_q": {"value": 2e-6, "bound": 1e-3},
                           "dk_sum": {"value": 3e-7, "bound": 1e-3}}}, checks


def _record(c: Case, gpu: str, rng: random.Random, *, slowdown: float, extra_broken: bool,
            host: str, versions: dict[str, str], software: dict[str, Any],
            accuracy_on: bool = True, noisy_backend: str | None = None,
            code: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    env = _env(gpu, host, versions, software)
    if code and c.backend in code:  # env.backend, as attnbench.hardware.backend_fingerprint
        env["backend"] = code[c.backend]
    common = dict(env=env, started="2026-11-29T15:02:03Z", duration_s=round(rng.uniform(0.2, 3), 3))
    if c.backend == "sdpa_flash" and (c.bias != "none" or c.softcap):
        return make_record(c, verdict="unsupported", reason="flash sub-backend has no "
                           + ("bias" if c.bias != "none" else "softcap") + " support", **common)
    if c.backend == "transformer_engine" and c.softcap:
        return make_record(c, verdict="unsupported", reason="TransformerEngine has no softcap",
                           **common)
    if c.backend == "transformer_engine" and c.cp > 1 and c.mask == "none" and c.dropout:
        return make_record(c, verdict="crash", reason="rank 0 died with SIGSEGV in backward",
                           crash={"signal": "SIGSEGV", "exit_code": -11, "rank": 0,
                                  "stderr_tail": "Fatal Python error: Segmentation fault\n"
                                  "  File \"transformer_engine/pytorch/attention.py\", line 2871"
                                  " in backward\n  (rng_state missing for dropout recompute)",
                                  "traceback": ""}, **common)
    if c.backend == "naive" and c.seqlen_q >= 16384 and c.mask == "none" and c.heads_kv == 1:
        return make_record(c, verdict="oom", reason="CUDA out of memory: tried to allocate "
                           "32.00 GiB for the (B, H, S, S) score matrix", **common)
    if c.backend == "triton" and c.seqlen_q >= 16384 and c.softcap:
        return make_record(c, verdict="timeout", reason="no answer after 120 s (rank pool "
                           "killed and rebuilt)", **common)
    if c.backend == "sdpa_flash" and c.seqlen_q == 1024 and c.heads_kv == 1 and c.dtype == "bf16" \
            and c.mask == "none" and not c.dropout:
        return make_record(c, verdict="error", reason="RuntimeError: illustrative backend "
                           "exception in backward", **common)

    broken: dict[str, float] = {}
    if c.backend == "transformer_engine" and c.dtype == "bf16" and not c.dropout:
        broken["dq"] = 1.05 + 0.1 * random.Random(c.id).random()  # seeds/001
    if c.backend == "triton" and c.heads_kv == 1 and c.bias == "alibi":
        r = random.Random(c.id)
        broken.update({t: r.uniform(0.2, 0.8) for t in TENSORS})  # seeds/004
    if extra_broken and c.backend == "triton" and c.seqlen_q == 4096 and c.mask == "causal" \
            and c.heads_kv == 16 and c.dtype == "bf16" and c.features == "MHA causal":
        broken["dk"] = 0.05
    accuracy, checks = _accuracy(c, broken)
    timing = _timing(c, gpu, rng, slowdown if c.backend == "triton" else 1.0,
                     noisy=c.backend == noisy_backend)
    if not accuracy_on:  # `accuracy: false`: NaN/Inf checked only (evaluation.timed_only)
        checks = [{"check": "nonfinite", "tensor": t, "metric": "count", "value": 0.0,
                   "bound": 0.0, "passed": True} for t in TENSORS]
        return make_record(c, verdict="timed", reason="accuracy not checked (accuracy: false)",
                           checks=checks, accuracy={}, timing=timing, **common)
    if c.world_size > 1:
        for t in TENSORS:
            value = 0.5 if (t == "dq" and "dq" in broken and c.tp > 1) else \
                BASE_ERROR[c.dtype] * random.Random(f"{c.id}/{t}").uniform(0.2, 0.6)
            bound = BASE_ERROR[c.dtype] * 2
            checks.append({"check": "parity", "tensor": t, "metric": "rel_l2", "value": value,
                           "bound": bound, "passed": value <= bound})
    failed = [ch for ch in checks if not ch["passed"]]
    verdict = "fail" if failed else "pass"
    reason = ""
    if failed:
        worst = max(failed, key=lambda ch: ch["value"] / ch["bound"])
        reason = (f"{worst['check']} {worst['tensor']} {worst['metric']} {worst['value']:.3g} > "
                  f"bound {worst['bound']:.3g}")
    return make_record(c, verdict=verdict, reason=reason, checks=checks, accuracy=accuracy,
                       timing=timing, **common)


# Made-up compile costs of one variant in autotune mode: ~40 configs over the three kernels
# at ~2.5 s each (the estimate for a fresh H200), and ~6 s of benchmarking them.
SYNTHETIC_COMPILE = {"kernels": 40, "seconds": 100.0, "autotune_s": 6.0}


def _add_compile_sections(cases: Sequence[Case], records: list[dict[str, Any]]) -> None:
    """The ``compile`` section of the triton records that ran: the first case of each variant
    (dtype, head dim, MHA/GQA, mask, features) on each GPU pays, the others compile nothing."""
    paid: set[tuple] = set()
    for case, rec in zip(cases, records):
        if case.backend != "triton" or rec["verdict"] not in ("pass", "fail", "timed"):
            continue
        group = "mha" if case.heads_kv == case.heads_q else "gqa"
        label = " ".join(p for p in (case.dtype, f"d{case.head_dim}", group,
                                     "window" if case.mask != "none" else "",
                                     "softcap" if case.softcap else "",
                                     "alibi" if case.bias == "alibi" else "",
                                     "dropout" if case.dropout else "", "fwd+bwd autotune") if p)
        first = (case.gpu, label) not in paid
        paid.add((case.gpu, label))
        cost = SYNTHETIC_COMPILE if first else {"kernels": 0, "seconds": 0.0, "autotune_s": 0.0}
        rec["compile"] = {"mode": "autotune", "interpreted": False, **cost, "variant": label,
                          "configs": {"_attn_fwd": {"BLOCK_M": 128, "BLOCK_N": 64,
                                                    "num_warps": 8, "num_stages": 3}}}


def write_synthetic_run(out_dir: str | Path, *, gpus: Sequence[str] = ("H100",),
                        run_id: str | None = None, seed: int = 0, slowdown: float = 1.0,
                        extra_broken: bool = False, torch_version: str = "2.5.1+cu124",
                        size: str = "full", accuracy: bool = True,
                        noisy_backend: str | None = None,
                        software: dict[str, Any] | None = None,
                        code: dict[str, dict[str, Any]] | None = None,
                        created: str = "2026-11-29T15:00:00Z") -> Path:
    """Write ``records.jsonl`` and ``manifest.json`` of a made-up run; returns the directory.

    ``slowdown`` multiplies every ``triton`` time (a performance regression to find);
    ``extra_broken`` makes one more triton case fail (a verdict change to find);
    ``accuracy=False`` is a speed-only run (verdict ``timed`` where accuracy would judge);
    ``noisy_backend``'s timings never settle; ``software`` overrides the exact kinds'
    software facts (``driver_version``, ``cuda_runtime``, ``commit``, ...); ``code``: backend
    -> its ``env.backend`` (``module``, ``version``, ``source_sha256``); ``created``: the
    manifest's start time.
    """
    rng = random.Random(seed)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    run_id = run_id or out_dir.name
    versions = {"torch": torch_version, "triton": "3.1.0", "attnbench": "0.1.0",
                "python": "3.11.7"}
    name = "-".join(g.lower() for g in gpus)
    sweep = parse_sweep(sweep_text(gpus, size), f"sweeps/synthetic-{size}-{name}.yaml",
                        backend_check=lambda backend: None)
    hosts = {gpu: f"node{g + 1:02d}" for g, gpu in enumerate(gpus)}
    records = [_record(case, case.gpu, rng, slowdown=slowdown, extra_broken=extra_broken,
                       host=hosts[case.gpu], versions=versions, software=software or {},
                       accuracy_on=accuracy, noisy_backend=noisy_backend, code=code)
               for case in sweep.cases]
    _add_compile_sections(sweep.cases, records)
    with open(out_dir / "records.jsonl", "w") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
    manifest = {
        "run_id": run_id, "created": created,
        "command": ["attnbench", "run", sweep.path],
        "sweep": {"name": sweep.name, "path": sweep.path, "digest": sweep.digest,
                  "cases": len(records), "source": sweep.source},
        "options": sweep.options.to_dict(), "attnbench": "0.1.0",
        "hosts": [f"node{g + 1:02d}" for g in range(len(gpus))],
        "devices": [{"host": f"node{g + 1:02d}", "device": "cuda:0", "gpu_kind": gpu,
                     "device_name": _env(gpu, "", versions, {})["device_name"]}
                    for g, gpu in enumerate(gpus)],
        "versions": {"torch": torch_version, "triton": "3.1.0", "dask": "2024.8.0",
                     "distributed": "2024.8.0", "python": "3.11.7"},
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return out_dir


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnbench.report.synthetic",
                                     description="Write a synthetic run directory.")
    parser.add_argument("out_dir")
    parser.add_argument("--gpu", action="append", choices=sorted(PEAK_TFLOPS) + sorted(IDENTITIES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slowdown", type=float, default=1.0)
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    args = parser.parse_args(argv)
    print(write_synthetic_run(args.out_dir, gpus=args.gpu or ["H100"], seed=args.seed,
                              slowdown=args.slowdown, size=args.size))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
