"""The probe step: what this box is -- its device (NVML identity, software), the matmul peak it
measures, which kernel PyTorch's SDPA picks for each of the check's cases, and the precision
flags that change what a matmul computes (TF32, reduced-precision reductions). ``probe.json``.

Runs in its own process (torch imported here, never in the driver). Every part is read on its
own: one that fails is ``{"error": ...}`` in the file, and the rest is still there.
"""

from __future__ import annotations

# Before anything imports triton: on a machine without CUDA our kernels must be interpreted,
# and torch.nn.attention imports triton (see attnbench.execution.case_runner).
import attnbench.kernels  # noqa: F401,I001

import collections
import json
import warnings
from typing import Any, Callable

import torch

from attnbench.backends.sdpa import attention_mask
from attnbench.errors import exception_summary
from attnbench.gpu_check.folder import PROBE
from attnbench.gpu_check.plan import PROBE_MATMUL, PROBE_MATMUL_S
from attnbench.gpu_check.step_main import StepConfig
from attnbench.gpu_check.sweeps import load_check_sweeps
from attnbench.hardware.device import device_env, pick_device
from attnbench.hardware.matmul_peak import measure_matmul_peak
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.fp8 import torch_dtype
from attnbench.results.files import write_atomic
from attnbench.sweep.case import Case

PINNED = {"sdpa_flash": "flash", "sdpa_efficient": "efficient", "sdpa_cudnn": "cudnn"}
"""The pinned SDPA backends and the ``torch.backends.cuda.can_use_<x>_attention`` they ask."""


def run_probe(config: StepConfig) -> None:
    device = pick_device()
    if device.type == "cuda":
        torch.cuda.get_device_properties(device)  # starts CUDA here: NVML reads the SM count
    sweeps = load_check_sweeps(config.cpu, config.kernel_configs, config.sweeps_dir)
    cases = [c for c in sweeps.speed.cases + sweeps.accuracy.cases if c.backend.startswith("sdpa")]
    probe: dict[str, Any] = {"device": str(device), "cuda": torch.cuda.is_available(),
                             "complete": False}
    path = config.folder / PROBE

    def record(name: str, value: Any) -> None:
        # Written after every part: a step killed in a hang still leaves what it measured.
        probe[name] = value
        write_atomic(path, json.dumps(probe, indent=1, default=str))

    record("env", _part(lambda: device_env(device)))
    record("precision", _part(precision_flags))
    record("matmul_peak_tflops", _part(lambda: measure_matmul_peak(
        device, PROBE_MATMUL, seconds=PROBE_MATMUL_S) if device.type == "cuda" else
        {"note": "no CUDA device: CPU timings are for rehearsal, no peak to measure"}))
    probe["sdpa"] = []
    for case in cases:
        probe["sdpa"].append(_part(lambda c=case: sdpa_choice(c, device)))
        record("sdpa", probe["sdpa"])
    record("complete", True)
    env = probe["env"] if "error" not in probe["env"] else {}
    print(f"probe: {device} {env.get('device_name', '?')} ({env.get('gpu_kind', '?')}), torch "
          f"{env.get('torch')}, triton {env.get('triton')}; matmul peak "
          f"{probe['matmul_peak_tflops']}")
    picks = collections.Counter(str(e.get("sdpa_picks", e.get("error"))) for e in probe["sdpa"])
    refused = sorted({e["label"] for e in probe["sdpa"] if e.get("usable") is False})
    print(f"probe: unpinned sdpa picks {dict(picks)}; pinned kernels refusing their case: "
          f"{len(refused)}{': ' + '; '.join(refused[:4]) if refused else ''}")


def _part(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Exception as exc:  # noqa: BLE001 - one unreadable part must not lose the others
        return {"error": exception_summary(exc)}


def precision_flags() -> dict[str, Any]:
    """Flags that change what a matmul or SDPA computes, as this process sees them (a box's
    site customisation may have set them); those this torch lacks are absent."""
    cuda, cudnn = torch.backends.cuda, torch.backends.cudnn
    reads = {
        "float32_matmul_precision": torch.get_float32_matmul_precision,
        "matmul.allow_tf32": lambda: cuda.matmul.allow_tf32,
        "matmul.fp32_precision": lambda: cuda.matmul.fp32_precision,
        "matmul.allow_fp16_reduced_precision_reduction":
            lambda: cuda.matmul.allow_fp16_reduced_precision_reduction,
        "matmul.allow_bf16_reduced_precision_reduction":
            lambda: cuda.matmul.allow_bf16_reduced_precision_reduction,
        "cudnn.allow_tf32": lambda: cudnn.allow_tf32,
        "cudnn.enabled": lambda: cudnn.enabled,
        "sdp.flash_enabled": cuda.flash_sdp_enabled,
        "sdp.mem_efficient_enabled": cuda.mem_efficient_sdp_enabled,
        "sdp.cudnn_enabled": cuda.cudnn_sdp_enabled,
        "sdp.math_enabled": cuda.math_sdp_enabled,
        "sdp.fp16_bf16_reduction_math_allowed": cuda.fp16_bf16_reduction_math_sdp_allowed,
    }
    flags = {}
    for name, read in reads.items():
        try:
            value = read()
        except (AttributeError, RuntimeError):
            continue
        flags[name] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return flags


def sdpa_choice(case: Case, device: torch.device) -> dict[str, Any]:
    """Which kernel unpinned SDPA would run for ``case`` (``torch._fused_sdp_choice``, what
    F.scaled_dot_product_attention itself asks) and whether the pinned one the case names can
    run it, with PyTorch's reasons when not (``can_use_*_attention(params, debug=True)`` warns
    them). Tensors of the case's shapes, uninitialised (only shapes, dtypes and the device
    matter to the choice)."""
    out: dict[str, Any] = {"id": case.id, "label": case.label, "backend": case.backend}
    if case.is_packed or case.decode:
        out["sdpa_picks"] = "not probed: packed and decode calls take other paths"
        return out
    dtype = torch_dtype(case.dtype)
    q = torch.empty(case.batch, case.heads_q, case.seqlen_q, case.head_dim, dtype=dtype,
                    device=device)
    k = torch.empty(case.batch, case.heads_kv, case.seqlen_kv, case.head_dim, dtype=dtype,
                    device=device)
    v = torch.empty(case.batch, case.heads_kv, case.seqlen_kv, case.head_dim_v, dtype=dtype,
                    device=device)
    spec = AttnSpec.from_case(case)
    mask, is_causal = attention_mask(spec, q, k)
    gqa = case.heads_kv != case.heads_q
    if mask is not None and not isinstance(mask, torch.Tensor):  # causal_lower_right
        out["sdpa_picks"] = f"{type(mask).__name__}: chosen inside torch.nn.attention.bias"
    else:
        choice = torch._fused_sdp_choice(q, k, v, mask, case.dropout, is_causal,
                                         scale=spec.scale, enable_gqa=gqa)
        out["sdpa_picks"] = torch.nn.attention.SDPBackend(choice).name
    pinned = PINNED.get(case.backend)
    if device.type != "cuda":
        out["usable"] = "not asked: can_use_*_attention are CUDA's checks"
    elif pinned is not None and (mask is None or isinstance(mask, torch.Tensor)):
        params = torch.backends.cuda.SDPAParams(q, k, v, mask, case.dropout, is_causal, gqa)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out["usable"] = bool(getattr(torch.backends.cuda,
                                         f"can_use_{pinned}_attention")(params, True))
        out["reasons"] = [str(w.message).splitlines()[0][:300] for w in caught]
    return out
