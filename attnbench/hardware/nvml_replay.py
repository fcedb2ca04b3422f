"""Record NVML's answers on a GPU machine as JSON, and replay them as a pynvml-like object.

A recording holds what each NVML call returned (or the error it raised), keyed by the pynvml
function's name, plus the torch device properties where CUDA was available::

    {"source": "...", "system": {"nvmlSystemGetDriverVersion": "565.57.01", ...},
     "devices": [{"nvmlDeviceGetName": "NVIDIA H100 80GB HBM3",
                  "nvmlDeviceGetPciInfo": {"busId": "00000000:18:00.0",
                                           "pciDeviceId": "0x233010DE", ...},
                  "nvmlDeviceGetClockInfo": {"sm": 345, "mem": 2619},
                  "nvmlDeviceGetEccMode": {"error": 3, "message": "Not Supported"}, ...}],
     "torch": [{"name": ..., "multi_processor_count": 132, "major": 9, "minor": 0}]}

``ReplayNvml(recording)`` answers ``hardware.nvml``'s calls from it, so the reader is tested on
CPU against real cards' answers (``tests/support/data/nvml/``). On a GPU machine,
``python -m attnbench.hardware.nvml_replay > tests/support/data/nvml/<kind>.json`` records a new
one.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any, Iterable, Optional

NVML_ERROR_NOT_SUPPORTED = 3  # pynvml's error codes
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
_MESSAGES = {NVML_ERROR_NOT_SUPPORTED: "Not Supported", NVML_ERROR_NOT_FOUND: "Not Found",
             NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
             NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found"}
_CLOCKS = {0: "graphics", 1: "sm", 2: "mem"}  # pynvml's NVML_CLOCK_GRAPHICS, _SM, _MEM
_CLOCK_CALLS = ("nvmlDeviceGetClockInfo", "nvmlDeviceGetMaxClockInfo",
                "nvmlDeviceGetApplicationsClock")
_HANDLE_CALLS = ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetIndex",
                 "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetPowerManagementLimit",
                 "nvmlDeviceGetPowerManagementDefaultLimit", "nvmlDeviceGetEnforcedPowerLimit",
                 "nvmlDeviceGetEccMode", "nvmlDeviceGetPersistenceMode")
_SYSTEM_CALLS = ("nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion")
_TORCH_FIELDS = ("name", "multi_processor_count", "major", "minor", "total_memory")


class ReplayNvmlError(Exception):
    """Raised like pynvml's NVMLError: ``.value`` is the NVML error code."""

    def __init__(self, value: int):
        super().__init__(_MESSAGES.get(value, f"NVML error {value}"))
        self.value = value


class ReplayNvml:
    """A pynvml stand-in answering from a recording. ``fail``: names of calls that raise
    ``Not Supported`` whatever was recorded; ``init_error``: nvmlInit raises this code."""

    NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM, NVML_CLOCK_MEM = 0, 1, 2
    NVMLError = ReplayNvmlError

    def __init__(self, recording: dict, *, fail: Iterable[str] = (),
                 init_error: Optional[int] = None):
        self.system = recording.get("system", {})
        self.devices = recording.get("devices", [])
        self.fail = frozenset(fail)
        self.init_error = init_error
        self.open = 0
        """nvmlInit calls not yet matched by nvmlShutdown."""

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise ReplayNvmlError(self.init_error)
        self.open += 1

    def nvmlShutdown(self) -> None:
        self.open -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.devices):
            raise ReplayNvmlError(NVML_ERROR_NOT_FOUND)
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: Any) -> int:
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for index, device in enumerate(self.devices):
            if device.get("nvmlDeviceGetUUID") == uuid:
                return index
        raise ReplayNvmlError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:
        pci = self._answer(self.devices[handle], "nvmlDeviceGetPciInfo")
        return SimpleNamespace(**{k: int(v, 16) if k.startswith("pci") else v
                                  for k, v in pci.items()})

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(**self._answer(self.devices[handle], "nvmlDeviceGetMemoryInfo"))

    def __getattr__(self, call: str):
        if call in _SYSTEM_CALLS:
            return lambda: self._answer(self.system, call)
        if call in _CLOCK_CALLS:
            return lambda handle, clock: self._unwrap(
                self._answer(self.devices[handle], call).get(_CLOCKS[clock]), call)
        if call in _HANDLE_CALLS:
            return lambda handle: self._answer(self.devices[handle], call)
        raise AttributeError(call)

    def _answer(self, answers: dict, call: str) -> Any:
        if call in self.fail:
            raise ReplayNvmlError(NVML_ERROR_NOT_SUPPORTED)
        if call not in answers:
            raise ReplayNvmlError(NVML_ERROR_FUNCTION_NOT_FOUND)
        return self._unwrap(answers[call], call)

    @staticmethod
    def _unwrap(answer: Any, call: str) -> Any:
        if answer is None:
            raise ReplayNvmlError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if isinstance(answer, dict) and "error" in answer:
            raise ReplayNvmlError(int(answer["error"]))
        return answer


def torch_properties(recording: dict, device: int = 0) -> Optional[SimpleNamespace]:
    """The recorded torch device properties of ``device``, shaped like torch's; None if absent."""
    recorded = recording.get("torch") or []
    return SimpleNamespace(**recorded[device]) if device < len(recorded) else None


def record(nvml: Any = None, *, with_torch: bool = True) -> dict:
    """What NVML (and torch, if ``with_torch`` and CUDA works) answer on this machine."""
    if nvml is None:
        import pynvml as nvml
    nvml.nvmlInit()
    try:
        recording = {"source": "recorded by attnbench.hardware.nvml_replay",
                     "system": {call: _recorded(getattr(nvml, call)) for call in _SYSTEM_CALLS},
                     "devices": [_record_device(nvml, nvml.nvmlDeviceGetHandleByIndex(i))
                                 for i in range(nvml.nvmlDeviceGetCount())]}
    finally:
        nvml.nvmlShutdown()
    if with_torch:
        recording["torch"] = _record_torch()
    return recording


def _record_device(nvml: Any, handle: Any) -> dict:
    device = {call: _recorded(getattr(nvml, call), handle) for call in _HANDLE_CALLS}
    for call in _CLOCK_CALLS:
        device[call] = {label: _recorded(getattr(nvml, call), handle, clock)
                        for clock, label in _CLOCKS.items()}
    pci = _recorded(nvml.nvmlDeviceGetPciInfo, handle)
    device["nvmlDeviceGetPciInfo"] = pci if isinstance(pci, dict) and "error" in pci else {
        "busId": _text(pci.busId), "pciDeviceId": f"0x{pci.pciDeviceId:08X}",
        "pciSubSystemId": f"0x{pci.pciSubSystemId:08X}"}
    memory = _recorded(nvml.nvmlDeviceGetMemoryInfo, handle)
    device["nvmlDeviceGetMemoryInfo"] = memory if isinstance(memory, dict) else {
        "total": int(memory.total)}
    return device


def _recorded(fn, *args) -> Any:
    try:
        answer = fn(*args)
    except Exception as exc:  # recorded as the error it is, replayed as one
        return {"error": getattr(exc, "value", -1), "message": str(exc)}
    if isinstance(answer, (tuple, list)):
        return list(answer)
    return _text(answer) if isinstance(answer, bytes) else answer


def _record_torch() -> list[dict]:
    try:
        import torch

        if not torch.cuda.is_available():
            return []
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    except Exception as exc:
        print(f"no torch device properties: {exc}", file=sys.stderr)
        return []
    return [{field: getattr(p, field) for field in _TORCH_FIELDS} for p in props]


def _text(value: Any) -> Any:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


if __name__ == "__main__":
    json.dump(record(), sys.stdout, indent=1)
    sys.stdout.write("\n")
