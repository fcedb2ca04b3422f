"""One single-device case, inside a rank process: inputs -> backend -> judgement -> timing.

Python exceptions become ``error`` (or ``oom``) records here, the backend's named by its frame and
ours as harness errors (:mod:`attnbench.execution.blame`); segfaults, aborts
and hangs kill or stall the process and are turned into records by the pool
(:mod:`attnbench.execution.pool`). Multi-rank cases run in :mod:`attnbench.execution.multi`;
:mod:`attnbench.execution.case_runner` sends each case to one of the two.
"""

from __future__ import annotations

from typing import Optional

import torch

from attnbench.accuracy import evaluate as evaluation
from attnbench.accuracy.contract import check_backward, check_forward
from attnbench.accuracy.rng import RngState
from attnbench.backends import Capabilities, Unsupported, get_backend, refusal
from attnbench.backends.masks import release_prepared
from attnbench.dtypes import is_fp8
from attnbench.errors import ContractBreach, is_oom
from attnbench.execution.blame import blame
from attnbench.hardware.device import (backend_env, device_env, device_peaks, interpreter_on_gpu,
                                       pick_device, release_memory, sync)
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.fp8 import with_descales
from attnbench.problem.inputs import make_fp8_inputs, make_inputs
from attnbench.results.records import RecordMaker, handled_crash
from attnbench.sweep.case import Case
from attnbench.sweep.options import RunOptions
from attnbench.timing.case import time_case


def run_single_case(case: Case, options: RunOptions,
                    device: Optional[torch.device] = None) -> dict:
    device = device or pick_device()
    record = RecordMaker(case, device_env(device))
    refused = interpreter_on_gpu(device)
    if refused:
        return record("error", refused)
    try:
        backend = get_backend(case.backend)
    except Exception as exc:
        return record.exception("error", exc, f"cannot load backend {case.backend!r}: ")
    record.env["backend"] = backend_env(case.backend, backend)
    reason = refusal(backend, case, device)
    if reason:
        return record("unsupported", reason)
    try:
        return _run(case, options, device, backend, record)
    except Unsupported as exc:
        return record("unsupported", str(exc))
    except Exception as exc:  # the backend's own failure is the measurement here
        verdict = "oom" if is_oom(exc) else "error"
        if device.type == "cuda" and verdict == "error" and not isinstance(exc, ContractBreach):
            # An illegal memory access leaves the CUDA context broken: ask for a fresh rank
            # rather than let the next cases inherit it.
            from attnbench.execution.child import recycle_after_call

            recycle_after_call(f"CUDA state unknown after {type(exc).__name__}")
        if verdict == "oom":
            return record.exception(verdict, exc)
        _, reason = blame(exc, backend)  # the backend's own error, or ours (a harness error)
        return record(verdict, reason, crash=handled_crash())
    finally:
        release_prepared(backend)
        release_memory(device)


def _run(case: Case, options: RunOptions, device: torch.device, backend,
         record: RecordMaker) -> dict:
    spec = AttnSpec.from_case(case)
    originals = None
    if is_fp8(case.dtype):  # fp8 values in, their descales in the spec (FA3's descale_q/k/v)
        fp8 = make_fp8_inputs(case, device)
        spec = with_descales(spec, fp8.q, fp8.k, fp8.v, case.dtype)
        q, k, v, dout = fp8.tensors
        originals = fp8.originals
    else:
        q, k, v, dout = make_inputs(case, device)
    compile_report = Capabilities.of(backend).compile_report
    if compile_report:
        compile_report()  # forget what an earlier case that failed midway compiled
    # A backend that hides its dropout mask draws it from the device's generator: set to the
    # case's own state, it lets the judge replay this very forward's mask
    # (attnbench.accuracy.dropout_probe), and a rerun of the case draws the same one.
    hidden = Capabilities.of(backend).keep_mask is None
    rng = None
    if spec.dropout_p > 0 and hidden:
        rng = RngState.for_call(device, spec.dropout_seed)
        rng.restore()
    fwd = backend.forward(q, k, v, spec)
    # The contract before any judging: a breach is the backend's error (ContractBreach).
    check_forward(case, q, k, v, fwd.out, fwd.lse)
    # A forward-only case (decode) asks for no gradient: none is computed, judged or timed.
    grads = backend.backward(fwd.ctx, dout) if case.backward else None
    if grads is not None:
        check_backward(q, k, v, grads)
    sync(device)
    if options.accuracy:
        judgement = evaluation.evaluate(case, backend, spec, q, k, v, dout, fwd.out, grads,
                                        device, rng, originals=originals, lse=fwd.lse)
        if Capabilities.of(backend).deterministic and grads is not None:
            judgement = evaluation.check_determinism(judgement, backend, fwd.ctx, dout, grads)
    else:
        judgement = evaluation.timed_only(fwd.out, grads)
    timing = None
    if options.timing.enabled:
        # What forward derived from the case (masks, bias) is prepared by now: the timed
        # callables hold the backend's calls only.
        timing = time_case(case, device, lambda: backend.forward(q, k, v, spec),
                           (lambda: backend.backward(fwd.ctx, dout)) if case.backward else None,
                           options.timing,
                           peaks=device_peaks(device, case.dtype))
    result = record(judgement.verdict, judgement.reason, timing=timing,
                    **judgement.record_fields())
    section = compile_report() if compile_report else None
    if section:  # a backend that compiles (torch.compile): its seconds, apart from timing
        result["compile"] = section
    return result
