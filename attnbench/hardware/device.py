"""The device a rank process runs cases on, and what every record says about it.

Used by the single-rank and the multi-rank case runners alike (rank side only: imports torch).
The worker leases devices by setting ``CUDA_VISIBLE_DEVICES`` per rank, so ``cuda:0`` is this
rank's own GPU; ``ATTNBENCH_DEVICE`` forces another (tests, ``selftest --device cpu``).
"""

from __future__ import annotations

import gc
import os
from typing import Any, Callable, Optional

import torch

from attnbench.hardware.identity import host_env
from attnbench.resources import ENV_DEVICE


def pick_device(local_rank: int = 0) -> torch.device:
    """``ATTNBENCH_DEVICE`` if set, else GPU ``local_rank`` modulo the visible GPUs, else CPU."""
    if os.environ.get(ENV_DEVICE):
        return torch.device(os.environ[ENV_DEVICE])
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interpreter_on_gpu(device: torch.device) -> Optional[str]:
    """Why this rank must not run cases: ``TRITON_INTERPRET=1`` inherited on a CUDA device would
    run every Triton kernel in the (CPU, ~1000x slower) interpreter. None when all is well."""
    if device.type == "cuda" and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return ("TRITON_INTERPRET=1 is set on a CUDA worker: Triton kernels would run in the CPU "
                "interpreter; unset it in the environment that starts the worker")
    return None


def release_memory(device: torch.device) -> None:
    """Between cases on a GPU: drop garbage and hand cached CUDA blocks back, so the next case
    (maybe in another process on the same GPU) starts from the same free memory. Nothing on the
    CPU, where a gc pass per case would only cost time."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def peak_memory(device: torch.device, fn: Callable[[], Any]) -> Optional[int]:
    """Bytes of device memory one call of ``fn`` needs beyond what was allocated before it; None
    on the CPU (torch keeps no such count there, and ``fn`` is not called)."""
    if device.type != "cuda":
        return None
    sync(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    result = fn()
    sync(device)
    del result
    return int(torch.cuda.max_memory_allocated(device) - before)


_identity: dict[str, dict[str, Any]] = {}
_software: Optional[dict[str, Any]] = None
_measured: dict[str, dict[str, float]] = {}


def device_env(device: torch.device) -> dict[str, Any]:
    """The ``env`` of a record: host, the exact device (:mod:`attnbench.hardware`) and the
    software between the kernel and the number. Read once per rank process."""
    from attnbench.hardware import cpu_identity, gpu_kind, read_identity, software_environment

    global _software
    key = str(device)
    if key not in _identity:
        if device.type == "cuda":
            # The SM count is torch's alone (NVML has none) and read_identity takes it only
            # where CUDA is started; a rank's first record comes before any tensor, so hand
            # torch's properties over: the rank is where CUDA runs (never a Dask worker).
            index = device.index or 0
            identity = read_identity(index, properties=torch.cuda.get_device_properties(index))
        else:
            identity = cpu_identity()
        _identity[key] = {"identity": identity.to_dict(), "kind": gpu_kind(identity)}
    if _software is None:
        _software = software_environment()
    seen, kind = _identity[key]["identity"], _identity[key]["kind"]
    env = host_env()
    env.update(device=str(device), device_name=device_name(device) if device.type == "cuda"
               else "cpu", gpu_kind=kind.kind, gpu_family=kind.family,
               torch=_software.get("torch"), triton=_software.get("triton"),
               identity=seen, software=dict(_software))
    return env


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def device_peaks(device: torch.device, dtype: str) -> dict[str, Optional[float]]:
    """{"datasheet": TFLOP/s, "measured": TFLOP/s, "bandwidth_gbs": datasheet memory GB/s} of
    one device in ``dtype`` (None unknown).
    The matmul peak is measured once per rank process, on its first timed GPU case (a few
    seconds); the CPU has none."""
    from attnbench.hardware import measure_matmul_peak, peak_bandwidth_gbs, peak_tflops

    env = device_env(device)
    key = str(device)
    if device.type == "cuda" and key not in _measured:
        _measured[key] = measure_matmul_peak(device, seconds=0.3)
    return {"datasheet": peak_tflops(env["gpu_kind"], dtype),
            "measured": _measured.get(key, {}).get(dtype),
            "bandwidth_gbs": peak_bandwidth_gbs(env["gpu_kind"])}


_fingerprints: dict[str, dict[str, Any]] = {}


def backend_env(name: str, backend: Any) -> dict[str, Any]:
    """Which code the backend is (module, version, source hash), once per rank process."""
    from attnbench.hardware import backend_fingerprint

    if name not in _fingerprints:
        _fingerprints[name] = backend_fingerprint(backend)
    return _fingerprints[name]
