"""Read a GPU's identity through NVML (``nvidia-ml-py``, imported as ``pynvml``).

The NVML module is passed in (``nvml=``), so tests drive this with a recording
(``hardware.nvml_replay.ReplayNvml``); by default ``pynvml`` is imported, and where it is absent
or finds no driver the device is the host CPU. Every field is read on its own: one the driver
refuses (``Not Supported`` on GeForce ECC, a missing function in an old driver) is None and
named in ``unreadable``; reading never raises.

The SM count comes from torch device properties, and only where CUDA is already started in
this process (a Dask worker must not start it before it spawns rank processes): pass
``properties`` to supply them. Which NVML device is CUDA ordinal ``device``: by UUID when torch's
properties give one, else through ``CUDA_VISIBLE_DEVICES`` (indices there count in
``CUDA_DEVICE_ORDER``; set ``PCI_BUS_ID`` so they match NVML's and nvidia-smi's).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Optional

from attnbench.hardware.identity import DeviceIdentity, cpu_identity
from attnbench.hardware.kinds import classify

log = logging.getLogger("attnbench.hardware")

MILLIWATTS_PER_WATT = 1000  # NVML reports power limits in mW


def load_nvml(nvml: Any = None) -> Any:
    """``nvml`` itself, else the ``pynvml`` module, else None when it is not installed."""
    if nvml is not None:
        return nvml
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def read_identity(device: int = 0, *, nvml: Any = None,
                  properties: Any = None) -> DeviceIdentity:
    """Identity of CUDA ordinal ``device`` as this process sees it; the CPU's when there is no
    GPU. ``properties``: torch-like device properties (``name``, ``multi_processor_count``,
    ``major``, ``minor``, ``uuid``); default: torch's, if CUDA is already started here."""
    properties = properties if properties is not None else _started_cuda_properties(device)
    nvml = load_nvml(nvml)
    if nvml is None or not _init(nvml):
        return _from_properties(properties) if properties is not None else cpu_identity()
    try:
        handle = _handle(nvml, device, properties)
        if handle is None:
            return _from_properties(properties) if properties is not None else cpu_identity()
        return _read(nvml, handle, properties)
    finally:
        _shutdown(nvml)


def read_identities(*, nvml: Any = None) -> list[DeviceIdentity]:
    """Every GPU NVML sees, in NVML order (no torch, no CUDA); [] where there is none."""
    nvml = load_nvml(nvml)
    if nvml is None or not _init(nvml):
        return []
    try:
        count = _call(nvml, "nvmlDeviceGetCount") or 0
        handles = [(i, _call(nvml, "nvmlDeviceGetHandleByIndex", i)) for i in range(count)]
        return [_read(nvml, h, None, index=i) for i, h in handles if h is not None]
    finally:
        _shutdown(nvml)


def read_driver(*, nvml: Any = None) -> tuple[Optional[str], Optional[str]]:
    """(driver version, newest CUDA the driver supports), or Nones without NVML."""
    nvml = load_nvml(nvml)
    if nvml is None or not _init(nvml):
        return None, None
    try:
        return _driver_versions(nvml, [])
    finally:
        _shutdown(nvml)


def _read(nvml: Any, handle: Any, properties: Any, index: Optional[int] = None) -> DeviceIdentity:
    unreadable: list[str] = []

    def get(field: str, call: str, *args) -> Any:
        try:
            return getattr(nvml, call)(handle, *args)
        except Exception as exc:  # any refusal, also a call an old pynvml lacks: None
            unreadable.append(f"{field}: {_reason(exc)}")
            return None

    name = _text(get("name", "nvmlDeviceGetName"))
    pci = get("pci", "nvmlDeviceGetPciInfo")
    memory = get("memory_total_bytes", "nvmlDeviceGetMemoryInfo")
    capability = get("compute_capability", "nvmlDeviceGetCudaComputeCapability")
    ecc = get("ecc_enabled", "nvmlDeviceGetEccMode")
    persistence = get("persistence_mode", "nvmlDeviceGetPersistenceMode")
    sm, mem = getattr(nvml, "NVML_CLOCK_SM", 1), getattr(nvml, "NVML_CLOCK_MEM", 2)
    driver, cuda_driver = _driver_versions(nvml, unreadable)
    pci_device_id = _pci_field(pci, "pciDeviceId")
    memory_total = getattr(memory, "total", None)
    if properties is not None and capability is None:
        capability = (properties.major, properties.minor)
    name = name or (str(properties.name) if properties is not None else "unknown GPU")
    return DeviceIdentity(
        name=name, device_type="cuda",
        index=index if index is not None else get("index", "nvmlDeviceGetIndex"),
        uuid=_text(get("uuid", "nvmlDeviceGetUUID")),
        pci_bus_id=_text(getattr(pci, "busId", None)),
        pci_device_id=pci_device_id >> 16 if pci_device_id is not None else None,
        pci_subsystem_id=_pci_field(pci, "pciSubSystemId"),
        form_factor=classify(name, memory_total,
                             pci_device_id >> 16 if pci_device_id else None).form_factor,
        memory_total_bytes=memory_total,
        sm_count=getattr(properties, "multi_processor_count", None),
        compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
        sm_clock_mhz=get("sm_clock_mhz", "nvmlDeviceGetClockInfo", sm),
        sm_clock_max_mhz=get("sm_clock_max_mhz", "nvmlDeviceGetMaxClockInfo", sm),
        sm_clock_app_mhz=get("sm_clock_app_mhz", "nvmlDeviceGetApplicationsClock", sm),
        memory_clock_mhz=get("memory_clock_mhz", "nvmlDeviceGetClockInfo", mem),
        memory_clock_max_mhz=get("memory_clock_max_mhz", "nvmlDeviceGetMaxClockInfo", mem),
        memory_clock_app_mhz=get("memory_clock_app_mhz",
                                 "nvmlDeviceGetApplicationsClock", mem),
        power_limit_w=_watts(get("power_limit_w", "nvmlDeviceGetPowerManagementLimit")),
        power_limit_default_w=_watts(get("power_limit_default_w",
                                         "nvmlDeviceGetPowerManagementDefaultLimit")),
        power_limit_enforced_w=_watts(get("power_limit_enforced_w",
                                          "nvmlDeviceGetEnforcedPowerLimit")),
        ecc_enabled=bool(ecc[0]) if ecc is not None else None,
        persistence_mode=bool(persistence) if persistence is not None else None,
        driver_version=driver, cuda_driver_version=cuda_driver,
        unreadable=tuple(unreadable))


def _from_properties(properties: Any) -> DeviceIdentity:
    """A GPU that torch sees but NVML cannot read: what torch knows."""
    name = str(properties.name)
    memory = getattr(properties, "total_memory", None)
    return DeviceIdentity(
        name=name, device_type="cuda", form_factor=classify(name, memory).form_factor,
        memory_total_bytes=memory, sm_count=getattr(properties, "multi_processor_count", None),
        compute_capability=f"{properties.major}.{properties.minor}",
        unreadable=("nvml: not available",))


def _driver_versions(nvml: Any, unreadable: list[str]) -> tuple[Optional[str], Optional[str]]:
    driver = cuda = None
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
    except Exception as exc:
        unreadable.append(f"driver_version: {_reason(exc)}")
    try:
        version = int(nvml.nvmlSystemGetCudaDriverVersion())  # 12040 -> "12.4"
        cuda = f"{version // 1000}.{version % 1000 // 10}"
    except Exception as exc:
        unreadable.append(f"cuda_driver_version: {_reason(exc)}")
    return driver, cuda


def _handle(nvml: Any, device: int, properties: Any) -> Any:
    """The NVML handle of CUDA ordinal ``device``; None when there is no such device."""
    uuid = str(getattr(properties, "uuid", "") or "")
    if uuid:
        full = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"  # torch omits it
        found = _call(nvml, "nvmlDeviceGetHandleByUUID", full)
        if found is not None:
            return found
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return _call(nvml, "nvmlDeviceGetHandleByIndex", device)
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if "-1" in entries:  # CUDA stops at the first invalid entry
        entries = entries[:entries.index("-1")]
    if device >= len(entries):
        return None
    entry = entries[device]
    if entry.isdigit():
        return _call(nvml, "nvmlDeviceGetHandleByIndex", int(entry))
    found = _call(nvml, "nvmlDeviceGetHandleByUUID", entry)
    return found if found is not None else _by_uuid_prefix(nvml, entry)


def _by_uuid_prefix(nvml: Any, prefix: str) -> Any:
    """CUDA accepts a unique UUID prefix in CUDA_VISIBLE_DEVICES; NVML wants the whole UUID."""
    for index in range(_call(nvml, "nvmlDeviceGetCount") or 0):
        handle = _call(nvml, "nvmlDeviceGetHandleByIndex", index)
        uuid = _text(_call(nvml, "nvmlDeviceGetUUID", handle)) if handle is not None else None
        if uuid and uuid.startswith(prefix):
            return handle
    return None


def _started_cuda_properties(device: int) -> Any:
    """torch's device properties, only if torch is imported and CUDA started in this process."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return torch.cuda.get_device_properties(device)
    except Exception as exc:
        log.debug("no torch device properties for device %s: %s", device, exc)
    return None


def _init(nvml: Any) -> bool:
    try:
        nvml.nvmlInit()
        return True
    except Exception as exc:  # no driver, no library: a CPU box
        log.debug("NVML unavailable: %s", _reason(exc))
        return False


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception as exc:
        log.debug("nvmlShutdown: %s", _reason(exc))


def _call(nvml: Any, call: str, *args) -> Any:
    try:
        return getattr(nvml, call)(*args)
    except Exception as exc:
        log.debug("%s%r: %s", call, args, _reason(exc))
        return None


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _text(value: Any) -> Optional[str]:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value if value is None else str(value)


def _pci_field(pci: Any, field: str) -> Optional[int]:
    value = getattr(pci, field, None)
    return int(value) if value is not None else None


def _watts(milliwatts: Optional[int]) -> Optional[float]:
    return milliwatts / MILLIWATTS_PER_WATT if milliwatts is not None else None
