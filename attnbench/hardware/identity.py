"""What one device is, exactly: a frozen record of its identity, clocks and limits.

Built by ``hardware.nvml`` (GPUs) or ``cpu_identity`` (CPUs); it only holds facts. Any field the
driver would not give is None, and ``unreadable`` says which and why, so a None reads as "not
known" and never as a value. ``to_dict``/``from_dict`` are the forms stored in records and
manifests (PCI ids as hex strings, memory in bytes and GiB).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import socket
from dataclasses import dataclass
from typing import Any, Optional

GIB = 1024 ** 3
_HEX_FIELDS = ("pci_device_id", "pci_subsystem_id")


@dataclass(frozen=True)
class DeviceIdentity:
    name: str
    """As the driver names it: ``NVIDIA H100 80GB HBM3``, ``NVIDIA GeForce RTX 4090``."""
    device_type: str = "cuda"
    """``cuda`` for an NVIDIA GPU, ``cpu`` for the host CPU."""
    index: Optional[int] = None
    """NVML index (PCI bus order, as nvidia-smi counts), not the CUDA ordinal."""
    uuid: Optional[str] = None
    pci_bus_id: Optional[str] = None
    pci_device_id: Optional[int] = None
    """16-bit PCI device id: 0x2330 is an H100 SXM5 80GB (pci.ids, NVIDIA driver README)."""
    pci_subsystem_id: Optional[int] = None
    """32-bit, as NVML gives it: subsystem device << 16 | subsystem vendor (0x16C110DE)."""
    form_factor: Optional[str] = None
    """``SXM``, ``PCIe``, ``NVL``, ``superchip``, ``OAM``; from the kind table (NVML has none)."""
    memory_total_bytes: Optional[int] = None
    sm_count: Optional[int] = None
    """Multiprocessors, from torch (NVML does not give it): a rank's records have it
    (:func:`attnbench.hardware.device.device_env` passes torch's properties); None where no
    properties were given and CUDA was not started (a process that only reads NVML)."""
    compute_capability: Optional[str] = None
    """``9.0`` for Hopper, ``8.9`` for Ada."""
    sm_clock_mhz: Optional[int] = None
    """At the moment of reading: idle cards report a low clock, this is no setting."""
    sm_clock_max_mhz: Optional[int] = None
    sm_clock_app_mhz: Optional[int] = None
    """Applications clock: what a busy SM runs at unless power or heat holds it back."""
    memory_clock_mhz: Optional[int] = None
    memory_clock_max_mhz: Optional[int] = None
    memory_clock_app_mhz: Optional[int] = None
    power_limit_w: Optional[float] = None
    """Current power management limit (an admin may lower it: 310 W on a 400 W H100 NVL)."""
    power_limit_default_w: Optional[float] = None
    power_limit_enforced_w: Optional[float] = None
    """The limit actually applied (the lowest of the management, board and other limits)."""
    ecc_enabled: Optional[bool] = None
    persistence_mode: Optional[bool] = None
    driver_version: Optional[str] = None
    cuda_driver_version: Optional[str] = None
    """The newest CUDA the driver supports (``12.4``), not the runtime torch was built with."""
    unreadable: tuple[str, ...] = ()
    """``field: reason`` for every field the driver would not give."""

    @property
    def memory_total_gib(self) -> Optional[float]:
        if self.memory_total_bytes is None:
            return None
        return round(self.memory_total_bytes / GIB, 2)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for field in _HEX_FIELDS:
            if out[field] is not None:
                out[field] = f"0x{out[field]:04X}"
        out["memory_total_gib"] = self.memory_total_gib
        out["unreadable"] = list(self.unreadable)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DeviceIdentity":
        """Inverse of ``to_dict``; unknown keys (a newer writer's) are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        for field in _HEX_FIELDS:
            if isinstance(kwargs.get(field), str):
                kwargs[field] = int(kwargs[field], 16)
        kwargs["unreadable"] = tuple(kwargs.get("unreadable") or ())
        return cls(**kwargs)


def cpu_identity() -> DeviceIdentity:
    """The host CPU as a device: model name and memory; everything GPU-only is None."""
    return DeviceIdentity(name=_cpu_model(), device_type="cpu", memory_total_bytes=_host_memory())


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if line.lower().startswith(("model name", "hardware")):
                    return line.split(":", 1)[1].strip() or "cpu"
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _host_memory() -> Optional[int]:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def host_env() -> dict[str, Any]:
    """Environment fields that need no torch (the rank process adds device and versions)."""
    from attnbench import __version__

    return {"host": socket.gethostname(), "python": platform.python_version(),
            "attnbench": __version__, "pid": os.getpid()}
