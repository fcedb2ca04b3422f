"""Which GPU this is: an exact kind (``H100-SXM5-80GB``) and a family (``H100``) for grouping.

The kind is what ``compare`` groups by and what a Dask worker advertises (resource
``kind-<KIND>``), so two cards whose speeds differ must never share one: H100 SXM and PCIe differ
by ~30 %, H100 NVL / H200 NVL run below the SXM clocks and power, GH200 is not an H200 (its GPU
shares power with a Grace CPU), and each GeForce card is its own kind.

Classification, in order: the PCI device id when the table knows it (it names the SKU, whatever
the driver version calls it); else the name, matched with word boundaries so ``L40`` never
matches ``L4`` or ``L40S``, and memory choosing between rows of one name (A100 40GB / 80GB);
else a kind made from the name itself. A row whose memory is more than 10 % off the measured
size becomes a derived kind with the measured size (``H100-SXM5-94GB``): an unknown variant is
named as such, never passed off as a known one. Derived and name-made kinds are ``known=False``
and have no datasheet peak.

PCI ids are from pci.ids (github.com/pciutils/pciids) and the supported-GPU table of NVIDIA's
driver README (open-gpu-kernel-modules 560.31.02 and 610.43.03), which lists NVML's names too.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import asdict, dataclass
from typing import Optional, Union

from attnbench.hardware.identity import GIB, DeviceIdentity

log = logging.getLogger("attnbench.hardware")

KIND_PATTERN = re.compile(r"^[A-Za-z0-9_.+-]+$")
"""Kinds become Dask resource names ``kind-<KIND>``."""
CPU_KIND = "cpu"
NVIDIA_VENDOR = 0x10DE
MEMORY_TOLERANCE = 0.10  # NVML reports 79.6 GiB for "80GB", 140.4 for "141GB": 0.5 % off


@dataclass(frozen=True)
class GpuKind:
    kind: str
    """Exact SKU: ``H100-SXM5-80GB``, ``L40S``, ``RTX-4090``; ``cpu`` for CPUs."""
    family: str
    """For grouping across SKUs of one line: ``H100``, ``L40``, ``GeForce-Ada``."""
    form_factor: Optional[str] = None
    known: bool = True
    """False for a kind derived from an unknown variant or made from the name: no peaks."""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Sku:
    kind: str
    family: str
    form_factor: str
    name: re.Pattern
    """Matched (search, case-insensitive) against the NVML / torch / nvidia-smi name."""
    pci_ids: tuple[int, ...] = ()
    memory_gb: Optional[float] = None
    """Nominal memory; chooses between rows of one name and flags unknown variants."""


def _sku(kind, family, form, pattern, pci_ids=(), memory_gb=None) -> Sku:
    return Sku(kind, family, form, re.compile(pattern, re.IGNORECASE), tuple(pci_ids), memory_gb)


_NOT_PCIE_NVL = r"(?!.*\b(?:PCIe|NVL)\b)"

SKUS: tuple[Sku, ...] = (
    # Hopper. NVML names: "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL",
    # "NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA GH200 480GB" / "120GB" (the Grace LPDDR5X size;
    # the GPU has 96GB HBM3), "NVIDIA GH200 144G HBM3e".
    _sku("H100-SXM5-80GB", "H100", "SXM", r"\bH100\b" + _NOT_PCIE_NVL, [0x2330], 80),
    _sku("H100-PCIe-80GB", "H100", "PCIe", r"\bH100\b.*\bPCIe\b", [0x2331], 80),
    _sku("H100-NVL-94GB", "H100", "NVL", r"\bH100\b.*\bNVL\b", [0x2321], 94),
    _sku("H200-SXM-141GB", "H200", "SXM", r"\bH200\b" + _NOT_PCIE_NVL, [0x2335], 141),
    _sku("H200-NVL-141GB", "H200", "NVL", r"\bH200\b.*\bNVL\b", [0x233B], 141),
    _sku("GH200-96GB", "GH200", "superchip", r"\bGH200\b(?!.*\b144G)", [0x2342], 96),
    _sku("GH200-144GB", "GH200", "superchip", r"\bGH200\b.*\b144G", [0x2348], 144),
    _sku("H800-SXM5-80GB", "H800", "SXM", r"\bH800\b" + _NOT_PCIE_NVL, [0x2324], 80),
    _sku("H800-PCIe-80GB", "H800", "PCIe", r"\bH800\b.*\bPCIe\b", [0x2322], 80),
    _sku("H800-NVL-94GB", "H800", "NVL", r"\bH800\b.*\bNVL\b", [0x233A], 94),
    _sku("H20-96GB", "H20", "SXM", r"\bH20\b(?!-)", [0x2329], 96),
    # Blackwell. 0x2909 (pci.ids: "HGX B200 168GB", README: "NVIDIA B200") is left to the name
    # fallback: a smaller-memory variant whose peaks we have not seen published.
    _sku("B200", "B200", "SXM", r"\bB200\b", [0x2901]),
    _sku("GB200", "GB200", "superchip", r"\bGB200\b", [0x2941]),
    # Ampere data centre. Names: "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB",
    # "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe".
    _sku("A100-SXM4-80GB", "A100", "SXM", r"\bA100\b(?!.*\bPCIE)", [0x20B2], 80),
    _sku("A100-SXM4-40GB", "A100", "SXM", r"\bA100\b(?!.*\bPCIE)", [0x20B0], 40),
    _sku("A100-PCIe-80GB", "A100", "PCIe", r"\bA100\b.*\bPCIE", [0x20B5], 80),
    # 0x20B1 in pci.ids and older driver READMEs, 0x20F1 in newer ones: both "A100-PCIE-40GB".
    _sku("A100-PCIe-40GB", "A100", "PCIe", r"\bA100\b.*\bPCIE", [0x20F1, 0x20B1], 40),
    _sku("A800-SXM4-80GB", "A800", "SXM", r"\bA800\b(?!.*\bPCIE)", [0x20F3], 80),
    _sku("A800-PCIe-80GB", "A800", "PCIe", r"\bA800\b.*\bPCIE", [0x20F5], 80),
    _sku("A10", "A10", "PCIe", r"\bA10\b", [0x2236]),
    _sku("A10G", "A10", "PCIe", r"\bA10G\b", [0x2237]),
    _sku("A40", "A40", "PCIe", r"\bA40\b", [0x2235]),
    # Ada data centre: \bL40\b does not match "L40S" or "L40G", \bL4\b does not match "L40".
    _sku("L40S", "L40", "PCIe", r"\bL40S\b", [0x26B9]),
    _sku("L40", "L40", "PCIe", r"\bL40\b", [0x26B5]),
    _sku("L4", "L4", "PCIe", r"\bL4\b", [0x27B8]),
    # Workstation and GeForce cards with a peak row; other GeForce cards get a name-made kind.
    _sku("RTX-6000-Ada", "RTX-Pro-Ada", "PCIe", r"\bRTX 6000 Ada\b", [0x26B1]),
    _sku("RTX-A6000", "RTX-Pro-Ampere", "PCIe", r"\bRTX A6000\b", [0x2230]),
    _sku("RTX-4090", "GeForce-Ada", "PCIe", r"\bRTX 4090\b(?!\s*(?:D|Laptop)\b)", [0x2684]),
    _sku("RTX-3090", "GeForce-Ampere", "PCIe", r"\bRTX 3090\b(?!\s*Ti\b)", [0x2204]),
    # Volta. Names: "Tesla V100-SXM2-32GB", "Tesla V100-PCIE-16GB".
    _sku("V100-SXM2-16GB", "V100", "SXM", r"\bV100-SXM2", [0x1DB1], 16),
    _sku("V100-SXM2-32GB", "V100", "SXM", r"\bV100-SXM2", [0x1DB5], 32),
    _sku("V100-PCIe-16GB", "V100", "PCIe", r"\bV100-PCIE", [0x1DB4], 16),
    _sku("V100-PCIe-32GB", "V100", "PCIe", r"\bV100-PCIE", [0x1DB6], 32),
    # AMD: NVML never sees it; torch names it "AMD Instinct MI300X".
    _sku("MI300X", "MI300", "OAM", r"\bMI300X\b"),
)
KINDS: tuple[str, ...] = tuple(s.kind for s in SKUS)
_BY_KIND = {s.kind: s for s in SKUS}
_BY_PCI = {pci: s for s in SKUS for pci in s.pci_ids}

# GeForce generations by the first two digits of the model number (NVIDIA's series naming).
_GEFORCE_GENERATIONS = {"10": "Pascal", "16": "Turing", "20": "Turing", "30": "Ampere",
                        "40": "Ada", "50": "Blackwell"}


def gpu_kind(identity: DeviceIdentity) -> GpuKind:
    """The kind of one device read by ``hardware.nvml`` (``cpu`` for a CPU identity)."""
    if identity.device_type == "cpu":
        return GpuKind(CPU_KIND, CPU_KIND, None)
    return classify(identity.name, identity.memory_total_bytes, identity.pci_device_id)


def kind_from_name(name: str, memory_mib: Union[int, float, str, None] = None,
                   pci_device_id: Union[int, str, None] = None) -> GpuKind:
    """The kind from what ``nvidia-smi --query-gpu=name,memory.total,pci.device_id`` prints
    (``"81559 MiB"`` or ``81559``; ``"0x233010DE"``), or from a torch device name alone."""
    if name.strip().lower() == CPU_KIND:
        return GpuKind(CPU_KIND, CPU_KIND, None)
    memory_bytes = None
    if memory_mib not in (None, ""):
        digits = re.match(r"\s*([\d.]+)", str(memory_mib))
        memory_bytes = int(float(digits.group(1)) * 1024 ** 2) if digits else None
    return classify(name, memory_bytes, _pci_device(pci_device_id))


def classify(name: str, memory_bytes: Optional[int] = None,
             pci_device_id: Optional[int] = None) -> GpuKind:
    """The kind of a GPU from its name, memory size and 16-bit PCI device id (each optional)."""
    base = name.strip()
    mig = re.search(r"\s+MIG\s+(\S+)$", base)
    if mig:  # "NVIDIA A100-SXM4-40GB MIG 1g.5gb": the parent's family, a peak-less own kind
        parent = classify(base[:mig.start()], None, pci_device_id)
        return GpuKind(_sanitize(f"{parent.kind}-MIG-{mig.group(1)}"), parent.family,
                       parent.form_factor, known=False)
    memory_gib = memory_bytes / GIB if memory_bytes else None
    by_pci = _BY_PCI.get(pci_device_id) if pci_device_id is not None else None
    by_name = [s for s in SKUS if s.name.search(base)]
    if by_pci is not None:
        if by_name and by_pci not in by_name:
            log.warning("PCI id 0x%04X says %s but the name %r says %s; trusting the PCI id",
                        pci_device_id, by_pci.kind, name, by_name[0].kind)
        sku = by_pci
    elif by_name:
        sku = _closest_memory(by_name, memory_gib or _memory_hint(base))
    else:
        return _from_name(base)
    if sku.memory_gb and memory_gib and abs(memory_gib / sku.memory_gb - 1) > MEMORY_TOLERANCE:
        derived = re.sub(r"-\d+GB$", f"-{round(memory_gib)}GB", sku.kind)
        log.info("%r has %.1f GiB, not the %s GB of %s: kind %s", name, memory_gib,
                 sku.memory_gb, sku.kind, derived)
        return GpuKind(derived, sku.family, sku.form_factor, known=False)
    return GpuKind(sku.kind, sku.family, sku.form_factor)


def form_factor(kind: str) -> Optional[str]:
    sku = _BY_KIND.get(kind)
    return sku.form_factor if sku else None


def _closest_memory(candidates: list[Sku], memory_gib: Optional[float]) -> Sku:
    """The row whose nominal memory is nearest (by ratio); the first listed when unknown."""
    sized = [s for s in candidates if s.memory_gb]
    if memory_gib is None or not sized:
        return candidates[0]
    return min(sized, key=lambda s: abs(math.log(memory_gib / s.memory_gb)))


def _memory_hint(name: str) -> Optional[float]:
    """``NVIDIA A100-PCIE-40GB`` -> 40: the size in the name, when no measured size is given."""
    found = re.search(r"(\d+)\s*GB\b", name, re.IGNORECASE)
    return float(found.group(1)) if found else None


def _from_name(name: str) -> GpuKind:
    """A kind made from an unknown card's name: ``NVIDIA GeForce RTX 4070 Ti SUPER`` ->
    ``RTX-4070-Ti-SUPER`` in family ``GeForce-Ada``; others are their own family."""
    short = re.sub(r"^(?:NVIDIA|Tesla|AMD|Radeon)\s+", "", name.strip(), flags=re.IGNORECASE)
    if re.match(r"GeForce\s+", short, re.IGNORECASE):
        short = re.sub(r"^GeForce\s+", "", short, flags=re.IGNORECASE)
        series = re.search(r"\b(?:RTX|GTX)\s*(\d{2})\d{2}\b", short, re.IGNORECASE)
        generation = _GEFORCE_GENERATIONS.get(series.group(1)) if series else None
        kind = _sanitize(short)
        return GpuKind(kind, f"GeForce-{generation}" if generation else "GeForce", "PCIe",
                       known=False)
    kind = _sanitize(short)
    return GpuKind(kind, kind, None, known=False)


def _sanitize(text: str) -> str:
    kind = re.sub(r"[^A-Za-z0-9_.+-]+", "-", text).strip("-")
    return re.sub(r"-{2,}", "-", kind) or "unknown"


def _pci_device(value: Union[int, str, None]) -> Optional[int]:
    """16-bit device id from ``0x2330``, ``0x233010DE`` (nvidia-smi, NVML) or an int."""
    if value in (None, ""):
        return None
    try:
        number = int(value, 16) if isinstance(value, str) else int(value)
    except ValueError:  # "N/A"
        return None
    if number > 0xFFFF:
        if number & 0xFFFF != NVIDIA_VENDOR:
            return None
        number >>= 16
    return number
