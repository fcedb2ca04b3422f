"""Every dtype a case may have, declared once: names, spellings, bytes, outputs, peaks.

One frozen :class:`Dtype` per dtype (nvbench's ``NVBENCH_DECLARE_TYPE_STRINGS`` in spirit):
the sweep's names and aliases (:mod:`attnbench.sweep.case`), bytes per element (the work model,
:mod:`attnbench.sweep.flops`), the dtype of the output (an fp8 case's is :data:`FP8_OUTPUT`),
the dtype whose accuracy bounds apply (:mod:`attnbench.accuracy.bounds`), the datasheet column
of its peak (:mod:`attnbench.hardware.peaks`), and an fp8 format's grid
(:mod:`attnbench.problem.fp8`). Plain data, no torch: the client reads it too; the rank side
turns :attr:`Dtype.torch_name` into a torch dtype in one place
(:func:`attnbench.problem.fp8.torch_dtype`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Fp8Grid:
    """The plain numbers of an fp8 format's grid (:func:`attnbench.problem.fp8.round_to_fp8`)."""

    mantissa_bits: int
    min_normal_exp: int
    """The exponent of the smallest normal value; below it the spacing stops shrinking."""
    max_finite: float
    """The largest finite value: quantization saturates there."""


@dataclass(frozen=True)
class Dtype:
    name: str
    """As sweeps, records and reports spell it."""
    torch_name: str
    """The attribute of ``torch`` that is this dtype (``torch.<torch_name>``)."""
    bytes: int
    """Bytes per element."""
    aliases: tuple[str, ...] = ()
    """Other spellings a sweep may use (torch's names); records store :attr:`name`."""
    output: str = ""
    """The dtype of the output (and dout): the dtype itself unless declared."""
    bound: str = ""
    """The dtype whose accuracy bounds a case is held to: its output's unless declared. An fp8
    case's baselines (naive in the output dtype, the fused fp8 model) run on the same inputs,
    so the fp8 roundings show up in the baselines' errors, not in the floors."""
    family: str = ""
    """The name dtypes rated and tabulated as one share: a datasheet's peak column
    (:mod:`attnbench.hardware.peaks`), a column of the selftest's table. The name unless
    declared."""
    fp8: Optional[Fp8Grid] = None
    """An fp8 format's grid; None for the others."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "output", self.output or self.name)
        object.__setattr__(self, "bound", self.bound or self.output)
        object.__setattr__(self, "family", self.family or self.name)

    @property
    def is_fp8(self) -> bool:
        return self.fp8 is not None


FP8_OUTPUT = "bf16"
FP8_WGMMA_K = 32
"""Products one fp8 wgmma instruction sums (its K): the finest promotion there is."""
"""The dtype an fp8 case's output (and dout) is in: what FA3's and our fp8 forwards return."""

DTYPES: tuple[Dtype, ...] = (
    Dtype("fp32", "float32", 4, aliases=("float32",)),
    Dtype("fp16", "float16", 2, aliases=("float16", "half")),
    Dtype("bf16", "bfloat16", 2, aliases=("bfloat16",)),
    # e4m3 is the OCP 'fn' variant (no infinities, max 448) that H100/H200 tensor cores and FA3
    # use; e5m2 keeps infinities (IEEE-like, max 57344).
    Dtype("fp8_e4m3", "float8_e4m3fn", 1, aliases=("float8_e4m3fn",), output=FP8_OUTPUT,
          family="fp8", fp8=Fp8Grid(mantissa_bits=3, min_normal_exp=-6, max_finite=448.0)),
    Dtype("fp8_e5m2", "float8_e5m2", 1, aliases=("float8_e5m2",), output=FP8_OUTPUT,
          family="fp8", fp8=Fp8Grid(mantissa_bits=2, min_normal_exp=-14, max_finite=57344.0)),
)
"""In the order sweeps list them (an error message's "expected one of ...")."""

BY_NAME: dict[str, Dtype] = {d.name: d for d in DTYPES}
NAMES: tuple[str, ...] = tuple(BY_NAME)
ALIASES: dict[str, str] = {alias: d.name for d in DTYPES for alias in d.aliases}
"""Spelling -> name, in declaration order (the sweep schema lists them so)."""
FP8_DTYPES: tuple[str, ...] = tuple(d.name for d in DTYPES if d.is_fp8)
FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(d.family for d in DTYPES))
"""fp32, fp16, bf16, fp8: each family once, in declaration order."""


def is_fp8(name: str) -> bool:
    """Whether ``name`` (a declared name; anything else is not) is an fp8 format."""
    return name in FP8_DTYPES
