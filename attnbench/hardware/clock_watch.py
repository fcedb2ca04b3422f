"""What the GPU's clocks did while a case was timed: NVML read at the start and end of each
timed direction, no thread (a sampler waking during the window would add host work to the
launches it times).

Per direction (``timing.clocks_fwd`` / ``timing.clocks_bwd``)::

    {"sm_mhz": [1980, 1755],            # SM clock at the window's start and end
     "sm_mhz_max": 1980,                # the clock the card may run at (NVML's max SM clock)
     "reasons": "sw_power_cap",         # throttle reasons seen at either end, comma-separated
                                        #  ("" none; idle and the
                                        #  applications-clocks setting do not slow a busy GPU)
     "power_violation_ms": 12.0,        # time NVML counted in power / thermal violation during
     "thermal_violation_ms": 0.0,       #  the window (nvmlDeviceGetViolationStatus, cumulative)
     "energy_j": 3.1}                   # energy the board drew during the window (Volta+)

A field the driver does not answer is absent; without NVML (a CPU box, no ``nvidia-ml-py``)
there is no ``clocks`` section at all. A window with a reason or a violation is ``throttled``:
its times measure a slowed card (docs/results.md says how to lock clocks so it does not happen).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from attnbench.hardware.nvml import _call, _handle, _started_cuda_properties, load_nvml

log = logging.getLogger("attnbench.hardware")

REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
           0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
           0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
           0x100: "display_clock_setting"}
"""NVML's clock event (throttle) reason bits (nvml.h ``nvmlClocksEventReason*``)."""
NOT_THROTTLING = 0x1 | 0x2
"""Reasons that do not slow a busy GPU: idle (0x1), the applications-clocks setting (0x2); the
rest (power cap 0x4, hardware and thermal slowdowns 0x8, 0x20, 0x40, ...) count as throttled."""
NVML_CLOCK_SM = 1
PERF_POLICY_POWER, PERF_POLICY_THERMAL = 0, 1  # nvmlPerfPolicyType_t
_REASON_CALLS = ("nvmlDeviceGetCurrentClocksEventReasons",  # driver 535+
                 "nvmlDeviceGetCurrentClocksThrottleReasons")


def reason_names(bits: int) -> list[str]:
    """The throttling reasons in a bitmask (the harmless ones left out), by name."""
    return [name for bit, name in REASONS.items() if bits & bit and not bit & NOT_THROTTLING] + (
        [f"0x{bits & ~sum(REASONS):x}"] if bits & ~sum(REASONS) else [])


class ClockWatch:
    """NVML's view of one CUDA device, read around timed windows. ``nvml``: a pynvml-like
    module (tests pass a stand-in); None: ``pynvml`` if installed."""

    def __init__(self, device_index: int, nvml: Any = None):
        self.nvml = load_nvml(nvml)
        self.handle = None
        self.max_mhz: Optional[int] = None
        if self.nvml is None:
            return
        try:
            self.nvml.nvmlInit()
        except Exception as exc:  # no driver: no clocks section
            log.debug("NVML unavailable: %s", exc)
            self.nvml = None
            return
        self.handle = _handle(self.nvml, device_index, _started_cuda_properties(device_index))
        if self.handle is not None:
            self.max_mhz = _call(self.nvml, "nvmlDeviceGetMaxClockInfo", self.handle,
                                 NVML_CLOCK_SM)

    @property
    def available(self) -> bool:
        return self.handle is not None

    def read(self) -> dict[str, Any]:
        """One reading: SM clock, reason bits, violation counters (ns), energy (mJ)."""
        if not self.available:
            return {}
        reading = {"sm_mhz": _call(self.nvml, "nvmlDeviceGetClockInfo", self.handle,
                                   NVML_CLOCK_SM),
                   "energy_mj": _call(self.nvml, "nvmlDeviceGetTotalEnergyConsumption",
                                      self.handle)}
        for call in _REASON_CALLS:
            if hasattr(self.nvml, call):
                reading["reasons"] = _call(self.nvml, call, self.handle)
                break
        for name, policy in (("power", PERF_POLICY_POWER), ("thermal", PERF_POLICY_THERMAL)):
            status = _call(self.nvml, "nvmlDeviceGetViolationStatus", self.handle, policy)
            reading[f"{name}_ns"] = getattr(status, "violationTime", None)
        return reading

    def window(self, start: dict[str, Any], end: dict[str, Any]) -> Optional[dict[str, Any]]:
        """The ``clocks`` section of a window between two readings; None without NVML."""
        if not self.available:
            return None
        out: dict[str, Any] = {}
        if start.get("sm_mhz") is not None and end.get("sm_mhz") is not None:
            out["sm_mhz"] = [int(start["sm_mhz"]), int(end["sm_mhz"])]
        if self.max_mhz is not None:
            out["sm_mhz_max"] = int(self.max_mhz)
        bits = [r for r in (start.get("reasons"), end.get("reasons")) if r is not None]
        if bits:
            union = 0
            for b in bits:
                union |= int(b)
            out["reasons"] = ",".join(reason_names(union))
        for name in ("power", "thermal"):
            a, b = start.get(f"{name}_ns"), end.get(f"{name}_ns")
            if a is not None and b is not None:
                out[f"{name}_violation_ms"] = round(max(0, int(b) - int(a)) / 1e6, 3)
        a, b = start.get("energy_mj"), end.get("energy_mj")
        if a is not None and b is not None:
            out["energy_j"] = round(max(0, int(b) - int(a)) / 1e3, 3)
        out["throttled"] = bool(out.get("reasons") or out.get("power_violation_ms")
                                or out.get("thermal_violation_ms"))
        return out

    def close(self) -> None:
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception as exc:
                log.debug("nvmlShutdown: %s", exc)
            self.nvml = self.handle = None


_WATCHES: dict[int, ClockWatch] = {}


def watch_for(device: Any) -> Optional[ClockWatch]:
    """The rank process's watch of a CUDA ``device`` (one NVML session per process); None for
    any other device."""
    if getattr(device, "type", None) != "cuda":
        return None
    index = device.index if device.index is not None else 0
    if index not in _WATCHES:
        _WATCHES[index] = ClockWatch(index)
    return _WATCHES[index]
