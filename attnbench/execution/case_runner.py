"""Run one case to a record, inside a rank process: inputs -> backend -> accuracy -> timing.

Called by the rank pool as ``attnbench.execution.case_runner:run_payload``. Python exceptions of
the backend become ``error`` records here; segfaults, aborts and hangs kill or stall the process
and are turned into records by the pool (:mod:`attnbench.execution.pool`).
"""

from __future__ import annotations

import os
import time
import traceback
from typing import Any, Optional

import torch

from attnbench import accuracy as acc
from attnbench.backends import Unsupported, get_backend
from attnbench.flops import case_flops, gpu_kind, peak_tflops
from attnbench.inputs import make_inputs
from attnbench.invariants import identity_residuals
from attnbench.problem import AttnSpec
from attnbench.records import TENSORS, host_env, make_record, utc_now
from attnbench.reference import reference_backward, reference_forward
from attnbench.spec import Case, RunOptions
from attnbench.timing import make_clock, measure


def run_payload(payload: dict) -> dict:
    """Entry point for the rank pool: payload = {"case": dict, "options": dict}."""
    return run_case(Case.from_dict(payload["case"]), RunOptions.from_dict(payload["options"]))


def pick_device() -> torch.device:
    # The worker leases devices by setting CUDA_VISIBLE_DEVICES for this process: cuda:0 is ours.
    if os.environ.get("ATTNBENCH_DEVICE"):
        return torch.device(os.environ["ATTNBENCH_DEVICE"])
    return torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")


def device_env(device: torch.device) -> dict[str, Any]:
    env = host_env()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = "cpu"
    try:
        # The installed version, without importing triton: kernels must choose the interpreter
        # (TRITON_INTERPRET) before anything imports triton.
        from importlib.metadata import version

        triton_version = version("triton")
    except Exception:  # triton is optional at run time for non-triton backends
        triton_version = None
    env.update(device=str(device), device_name=name, gpu_kind=gpu_kind(name),
               torch=str(torch.__version__), triton=triton_version)
    return env


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError))):
        return True
    return isinstance(exc, RuntimeError) and ("out of memory" in str(exc).lower()
                                              or "can't allocate memory" in str(exc).lower())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_case(case: Case, options: RunOptions, device: Optional[torch.device] = None) -> dict:
    device = device or pick_device()
    started, t0 = utc_now(), time.perf_counter()
    env = device_env(device)

    def record(verdict: str, reason: str = "", **fields) -> dict:
        return make_record(case, verdict=verdict, reason=reason, env=env, started=started,
                           duration_s=time.perf_counter() - t0, **fields)

    # The kind this rank serves: what `attnbench worker --kind` advertised (inherited from the
    # worker process), else the hardware's own.
    served = os.environ.get("ATTNBENCH_KIND") or env["gpu_kind"]
    if case.gpu not in ("any", served):
        return record("skipped", f"case asks for gpu {case.gpu!r}, this worker serves "
                                 f"{served!r}")
    if case.world_size > 1:
        from attnbench.parallel.runner import run_parallel_case  # every rank of the pool runs it

        return run_parallel_case(case, options)
    try:
        backend = get_backend(case.backend)
    except Exception as exc:
        return record("error", f"cannot load backend {case.backend!r}: {exc}",
                      crash={"traceback": traceback.format_exc()[-4000:]})
    reason = backend.supports(case, device)
    if reason:
        return record("unsupported", reason)

    spec = AttnSpec.from_case(case)
    try:
        q, k, v, dout = make_inputs(case, device)
        fwd = backend.forward(q, k, v, spec)
        grads = backend.backward(fwd.ctx, dout)
        _sync(device)
        accuracy, checks, verdict, reason = None, [], "pass", ""
        if options.accuracy:
            accuracy, checks, verdict, reason = evaluate(case, backend, spec, q, k, v, dout,
                                                         fwd.out, grads)
            if getattr(backend, "deterministic", False):
                verdict, reason = check_determinism(backend, fwd.ctx, dout, grads, accuracy,
                                                    checks, verdict, reason)
        timing = time_case(case, backend, spec, q, k, v, dout, fwd.ctx, device, options) \
            if options.timing.enabled else None
    except Unsupported as exc:
        return record("unsupported", str(exc))
    except Exception as exc:  # the backend's own failure is the measurement here
        verdict = "oom" if _is_oom(exc) else "error"
        if device.type == "cuda" and verdict == "error":
            # An illegal memory access leaves the CUDA context broken: ask for a fresh rank
            # rather than let the next cases inherit it.
            from attnbench.execution.child import recycle_after_call

            recycle_after_call(f"CUDA state unknown after {type(exc).__name__}")
        return record(verdict, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}",
                      crash={"traceback": traceback.format_exc()[-4000:]})
    return record(verdict, reason, checks=[c.to_dict() for c in checks], accuracy=accuracy,
                  timing=timing)


def _reference(q, k, v, dout, spec, keep_mask):
    out, lse = reference_forward(q, k, v, spec, keep_mask=keep_mask)
    dq, dk, dv = reference_backward(q, k, v, out, lse, dout, spec, keep_mask=keep_mask)
    return {"out": out, "dq": dq, "dk": dk, "dv": dv, "lse": lse}


def evaluate(case, backend, spec, q, k, v, dout, out, grads):
    """Errors against fp64 (when a reference applies), baseline errors and identities."""
    results = dict(zip(TENSORS, (out, *grads)))
    dropout = spec.dropout_p > 0
    keep_mask = getattr(backend, "keep_mask", None)
    errors = baseline_errors = None
    reference_cache: dict[Any, dict] = {}

    def reference_for(mask_fn):
        key = mask_fn if dropout else None  # without dropout one reference serves everyone
        if key not in reference_cache:
            reference_cache[key] = _reference(q, k, v, dout, spec, mask_fn)
        return reference_cache[key]

    if dropout and keep_mask is None:
        note = "none: the backend does not expose its dropout mask; identities decide"
    else:
        note = "exact-mask" if dropout else "exact"
        ref = reference_for(keep_mask)
        errors = {t: acc.tensor_errors(results[t], ref[t]) for t in TENSORS}
    if case.backend not in ("naive", "reference"):
        # The naive baseline on the same inputs: the error scale a backend is allowed, and how
        # ill-conditioned these inputs are in this dtype (which scales the identity bounds).
        baseline_errors = _baseline(q, k, v, dout, spec, reference_for)
    scale = acc.conditioning(errors if case.backend == "naive" else baseline_errors)

    identities = identity_residuals(q, k, v, out, dout, *grads, softcap=spec.softcap)
    bounds = acc.identity_bounds(case.dtype, scale)
    verdict, reason, checks, table = acc.judge(
        dtype=case.dtype, backend=case.backend, errors=errors, baseline=baseline_errors,
        identities=identities, softcap=spec.softcap, reference_note=note,
        identity_bound=bounds, logit_scale=_logit_scale(reference_cache))
    accuracy = {
        "reference": note,
        "tensors": table,
        "identities": {name: {"value": acc._finite_or_none(value), "bound": bounds[name]}
                       for name, value in identities.items()},
    }
    return accuracy, checks, verdict, reason


def _logit_scale(reference_cache: dict) -> float:
    """Largest finite |lse| of the fp64 reference (any entry: dropout does not change lse)."""
    for ref in reference_cache.values():
        lse = ref["lse"]
        finite = lse[torch.isfinite(lse)]
        return float(finite.abs().max()) if finite.numel() else 0.0
    return 0.0


DETERMINISM_CALLS = 3
"""Backward calls compared bit for bit (the checked one and two more): a dQ summed in a random
order differs from another order in only a few bf16 elements of a small case, so one extra call
can miss it where two rarely do."""


def check_determinism(backend, ctx, dout, grads, accuracy, checks, verdict, reason):
    """A backend that declares ``deterministic = True`` must return bit-identical gradients from
    repeated backward calls on one forward context; appends the checks, returns the verdict."""
    runs = [tuple(grads)] + [tuple(backend.backward(ctx, dout))
                             for _ in range(DETERMINISM_CALLS - 1)]
    found = acc.determinism_checks(runs)
    checks.extend(found)
    accuracy["determinism"] = {c.tensor: int(c.value) for c in found}
    failed = [c for c in found if not c.passed]
    if failed:
        text = "; ".join(c.describe() for c in failed)
        return "fail", (f"{reason}; {text}" if reason and verdict == "fail" else text)
    return verdict, reason


def _baseline(q, k, v, dout, spec, reference_for) -> Optional[dict]:
    """Errors of the naive baseline on the same inputs, against its own exact reference."""
    naive = get_backend("naive")
    try:
        fwd = naive.forward(q, k, v, spec)
        grads = naive.backward(fwd.ctx, dout)
    except Exception as exc:
        if _is_oom(exc):  # the S x S baseline may not fit where a fused kernel does
            return None
        raise
    ref = reference_for(naive.keep_mask)
    return {t: acc.tensor_errors(x, ref[t]) for t, x in zip(TENSORS, (fwd.out, *grads))}


def time_case(case, backend, spec, q, k, v, dout, ctx, device, options) -> dict:
    clock = make_clock(device)
    flops_fwd, flops_bwd = case_flops(case)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = peak_tflops(device_name, case.dtype)

    def sync_after(fn):
        def call():
            fn()
            _sync(device)
        return call

    fwd_stats = measure(sync_after(lambda: backend.forward(q, k, v, spec)), clock, options.timing)
    bwd_stats = measure(sync_after(lambda: backend.backward(ctx, dout)), clock, options.timing)

    def entry(stats, flops):
        tflops = flops / (stats.median_ms * 1e-3) / 1e12 if stats.median_ms > 0 else None
        return {**stats.to_dict(), "tflops": tflops,
                "pct_peak": (100.0 * tflops / peak) if (tflops and peak) else None}

    return {"clock": clock.name, "flops_fwd": flops_fwd, "flops_bwd": flops_bwd,
            "fwd": entry(fwd_stats, flops_fwd), "bwd": entry(bwd_stats, flops_bwd)}
