"""Datasheet peaks per exact kind: dense TFLOP/s per dtype and memory bandwidth.

Dense means no 2:4 structured sparsity: where a datasheet prints only the sparsity figure
(marked ``*`` there), the dense one is half of it. Tensor-core rates for bf16 / fp16 / tf32 / fp8;
``fp32`` is the non-tensor (CUDA core) rate, which is what fp32 cases run at (IEEE fp32 matmuls,
TF32 off). GeForce cards run fp16/bf16 tensor cores at half rate when accumulating in fp32, and
attention kernels (and torch's matmuls) accumulate in fp32, so their rows give the
fp32-accumulate figure (RTX 4090: 165.2, not the 330.3 of fp16 accumulation). A kind without a
row, or a dtype a chip lacks (fp8 before Hopper/Ada), has no peak: None, never 0.

Sources, cited per row below:
  H100 WP  NVIDIA H100 Tensor Core GPU Architecture whitepaper, Table 3 (dense column)
  H100 DS  NVIDIA H100 datasheet (SXM / PCIe / NVL columns, sparsity figures halved)
  H200 DS  NVIDIA H200 datasheet (H200 SXM / H200 NVL columns, sparsity figures halved)
  GH200 DS NVIDIA GH200 Grace Hopper Superchip datasheet
  HGX B    NVIDIA HGX B200 / GB200 NVL72 specification tables (per GPU, sparsity halved)
  A100 DS  NVIDIA A100 datasheet; A800 DS likewise (same SM rates, narrower NVLink)
  L40 DS / L40S DS / L4 DS / A10 DS / A40 DS / RTX A6000 DS  NVIDIA product datasheets
  Ada WP   NVIDIA Ada GPU Architecture whitepaper, Appendix A (GeForce RTX 4090)
  GA102 WP NVIDIA Ampere GA102 GPU Architecture whitepaper (GeForce RTX 3090)
  V100 DS  NVIDIA V100 datasheet;  MI300X DS  AMD Instinct MI300X datasheet
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Union

from attnbench.dtypes import DTYPES as CASE_DTYPES
from attnbench.hardware.kinds import GpuKind

DTYPES = ("bf16", "fp16", "fp32", "tf32", "fp8")
"""The columns of a datasheet: a case dtype's family (:attr:`attnbench.dtypes.Dtype.family`), or
tf32, which no case has."""
_ALIASES = {**{spelling: d.family for d in CASE_DTYPES
               for spelling in (d.name, d.torch_name, *d.aliases)},
            "float": "fp32", "tensorfloat32": "tf32", "e4m3": "fp8", "e5m2": "fp8"}
"""Spelling -> column: every case dtype's name and spellings, and the datasheets' own."""


@dataclass(frozen=True)
class Peak:
    tflops: Mapping[str, float]
    """Dense TFLOP/s by dtype (see the module docstring for what each means)."""
    bandwidth_gbs: Optional[float]
    """Peak memory bandwidth, GB/s (10^9 bytes)."""
    source: str
    unsure: tuple[str, ...] = field(default=())
    """Entries whose source we could not confirm: dtype names or ``bandwidth``."""


def _peak(bf16, fp16, fp32, tf32=None, fp8=None, *, bw, source, unsure=()) -> Peak:
    rates = dict(bf16=bf16, fp16=fp16, fp32=fp32, tf32=tf32, fp8=fp8)
    return Peak({k: v for k, v in rates.items() if v is not None}, bw, source, tuple(unsure))


_H100_SXM = dict(bf16=989.4, fp16=989.4, fp32=66.9, tf32=494.7, fp8=1978.9)  # H100 WP
_H100_PCIE = dict(bf16=756.0, fp16=756.0, fp32=51.2, tf32=378.0, fp8=1513.0)  # H100 WP
_NVL = dict(bf16=835.5, fp16=835.5, fp32=60.0, tf32=417.5, fp8=1670.5)  # 1,671*/835*/3,341* halved
_A100 = dict(bf16=312.0, fp16=312.0, fp32=19.5, tf32=156.0)  # A100 DS

PEAKS: dict[str, Peak] = {
    "H100-SXM5-80GB": _peak(**_H100_SXM, bw=3350, source="H100 WP; 3.35 TB/s H100 DS"),
    "H100-PCIe-80GB": _peak(**_H100_PCIE, bw=2000, source="H100 WP; 2 TB/s H100 DS"),
    "H100-NVL-94GB": _peak(**_NVL, bw=3900, source="H100 DS (NVL column); 3.9 TB/s"),
    # Same GH100 and SXM clocks as the H100 SXM: H200 DS prints 1,979* bf16 = 2 x 989.4.
    "H200-SXM-141GB": _peak(**_H100_SXM, bw=4800, source="H200 DS, H100 WP; 4.8 TB/s"),
    "H200-NVL-141GB": _peak(**_NVL, bw=4800, source="H200 DS (NVL column); 4.8 TB/s"),
    # GH200 DS prints the H100 SXM rates (990 | 1,979* bf16); its GPU shares the module's power
    # with the Grace CPU, so sustained clocks depend on the module's power setting.
    "GH200-96GB": _peak(**_H100_SXM, bw=4000, source="GH200 DS; 96GB HBM3 4 TB/s"),
    "GH200-144GB": _peak(**_H100_SXM, bw=4900, source="GH200 DS; 144GB HBM3e 4.9 TB/s"),
    # H800: H100 silicon and clocks, NVLink cut to 400 GB/s (H800 product brief).
    "H800-SXM5-80GB": _peak(**_H100_SXM, bw=3350, source="as H100 SXM5 (H800 brief)"),
    "H800-PCIe-80GB": _peak(**_H100_PCIE, bw=2000, source="as H100 PCIe (H800 brief)"),
    "H20-96GB": _peak(148.0, 148.0, 44.0, 74.0, 296.0, bw=4000,
                      source="H20 product brief as quoted in the press",
                      unsure=("bf16", "fp16", "fp32", "tf32", "fp8", "bandwidth")),
    "B200": _peak(2250.0, 2250.0, 75.0, 1100.0, 4500.0, bw=7700,
                  source="HGX B: 4.5 PF* bf16, 2.2 PF* tf32, 9 PF* fp8, 75 TF fp32; "
                         "180GB HBM3e 7.7 TB/s (the 192GB part: 8 TB/s)"),
    "GB200": _peak(2500.0, 2500.0, 80.0, 1250.0, 5000.0, bw=8000,
                   source="HGX B (GB200 NVL72 per GPU): 5 PF* bf16, 2.5 PF* tf32, 10 PF* fp8"),
    "A100-SXM4-80GB": _peak(**_A100, bw=2039, source="A100 DS; 2,039 GB/s"),
    "A100-SXM4-40GB": _peak(**_A100, bw=1555, source="A100 DS; 1,555 GB/s"),
    "A100-PCIe-80GB": _peak(**_A100, bw=1935, source="A100 DS; 1,935 GB/s"),
    "A100-PCIe-40GB": _peak(**_A100, bw=1555, source="A100 DS; 1,555 GB/s"),
    "A800-SXM4-80GB": _peak(**_A100, bw=2039, source="A800 DS"),
    "A800-PCIe-80GB": _peak(**_A100, bw=1935, source="A800 DS"),
    "A10": _peak(125.0, 125.0, 31.2, 62.5, bw=600, source="A10 DS (125|250* bf16)"),
    "A40": _peak(149.7, 149.7, 37.4, 74.8, bw=696, source="A40 DS (149.7|299.4* bf16)"),
    "L40S": _peak(362.05, 362.05, 91.6, 183.0, 733.0, bw=864,
                  source="L40S DS (362.05|733* bf16, 733|1,466* fp8)"),
    "L40": _peak(181.05, 181.05, 90.5, 90.5, 362.0, bw=864,
                 source="L40 DS (181.05|362.1* bf16, 362|724* fp8)"),
    "L4": _peak(121.0, 121.0, 30.3, 60.0, 242.5, bw=300,
                source="L4 DS (prints 242* bf16, 120* tf32, 485* fp8 only)"),
    "RTX-A6000": _peak(154.8, 154.8, 38.7, bw=768, source="RTX A6000 DS (309.7* tensor)"),
    "RTX-4090": _peak(165.2, 165.2, 82.6, 82.6, 330.3, bw=1008,
                      source="Ada WP: fp16/bf16 with fp32 accumulate 165.2 (fp16 accumulate "
                             "330.3); fp8 with fp32 accumulate", unsure=("fp8",)),
    "RTX-3090": _peak(71.0, 71.0, 35.6, 35.6, bw=936,
                      source="GA102 WP: fp16/bf16 with fp32 accumulate 71 (fp16 acc. 142)"),
    "V100-SXM2-16GB": _peak(None, 125.0, 15.7, bw=900, source="V100 DS (SXM2)"),
    "V100-SXM2-32GB": _peak(None, 125.0, 15.7, bw=900, source="V100 DS (SXM2)"),
    "V100-PCIe-16GB": _peak(None, 112.0, 14.0, bw=900, source="V100 DS (PCIe)"),
    "V100-PCIe-32GB": _peak(None, 112.0, 14.0, bw=900, source="V100 DS (PCIe)"),
    "MI300X": _peak(1307.4, 1307.4, 163.4, 653.7, 2614.9, bw=5300, source="MI300X DS"),
}


def normalize_dtype(dtype: Any) -> str:
    """``bf16`` from ``bf16``, ``bfloat16``, ``torch.bfloat16``; other spellings pass through."""
    name = str(dtype).lower().removeprefix("torch.")
    return _ALIASES.get(name, name)


def peak_tflops(kind: Union[str, GpuKind], dtype: Any) -> Optional[float]:
    """Dense datasheet TFLOP/s of ``kind`` in ``dtype``; None when unknown."""
    peak = PEAKS.get(kind.kind if isinstance(kind, GpuKind) else kind)
    return peak.tflops.get(normalize_dtype(dtype)) if peak else None


def peak_bandwidth_gbs(kind: Union[str, GpuKind]) -> Optional[float]:
    """Datasheet memory bandwidth of ``kind`` in GB/s; None when unknown."""
    peak = PEAKS.get(kind.kind if isinstance(kind, GpuKind) else kind)
    return peak.bandwidth_gbs if peak else None
