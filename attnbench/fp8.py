"""fp8 formats: scaled quantization as the fp8 attention APIs take it, and exact rounding in fp32.

The fp8 attention kernels (FlashAttention-3's ``descale_q/k/v``, cuDNN / TransformerEngine fp8
attention, Triton's fp8 ``tl.dot``) take q, k, v already quantized: ``x8 = fp8(x * scale)`` with
``scale = fp8_max / amax(x)`` per tensor (or per head), plus the inverse ``descale = 1 / scale``
to undo it inside the kernel. :func:`quantize` does exactly that, so the numbers a backend gets
are those a training framework would hand it.

:func:`round_to_fp8` rounds fp32 values to the fp8 grid *in fp32 arithmetic* (round to nearest,
ties to even, saturating at the format's largest finite value, subnormals included). It is the
model of a kernel's in-register fp8 quantization (P before P·V, FA3's choice), and it agrees
bit for bit with ``torch``'s cast for every finite value within range (tests/test_fp8.py). Why
not just cast: Triton 3.9's interpreter casts fp32 -> fp8 wrongly when rounding carries into
the exponent (-1.965 -> -1.0 instead of -2.0, a 50 % error, measured); the Triton kernels use
the same arithmetic (``kernels/fp8.py``) and only ever cast values already on the grid.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Fp8Format:
    name: str
    torch_dtype: torch.dtype
    mantissa_bits: int
    min_normal_exp: int
    max_finite: float

    @property
    def eps(self) -> float:
        """Unit roundoff: half the spacing of the grid just above 1."""
        return 2.0 ** -(self.mantissa_bits + 1)


FORMATS = {
    "fp8_e4m3": Fp8Format("fp8_e4m3", torch.float8_e4m3fn, 3, -6, 448.0),
    "fp8_e5m2": Fp8Format("fp8_e5m2", torch.float8_e5m2, 2, -14, 57344.0),
}
"""e4m3 is the OCP 'fn' variant (no infinities, max 448) that H100/H200 tensor cores and FA3 use."""


def is_fp8(dtype_name: str) -> bool:
    return dtype_name in FORMATS


def round_to_fp8(x: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """``x`` (any float dtype) rounded to ``fmt``'s grid, returned as fp32 values."""
    x = x.to(torch.float32)
    # The exponent of |x| (frexp: x = m * 2^e, 0.5 <= |m| < 1), clamped into the subnormal range
    # where the spacing stops shrinking.
    _, exp = torch.frexp(x)
    exp = torch.clamp(exp - 1, min=fmt.min_normal_exp)
    spacing = torch.ldexp(torch.ones_like(x), exp - fmt.mantissa_bits)
    # x / spacing is exact (a power of two) and below 2^24: round() is round-half-even.
    rounded = torch.round(x / spacing) * spacing
    return torch.clamp(rounded, -fmt.max_finite, fmt.max_finite)


@dataclass(frozen=True)
class Quantized:
    """One tensor as an fp8 kernel receives it: values and the factor that undoes the scaling."""

    values: torch.Tensor
    """fp8 tensor (B, H, S, D)."""
    descale: torch.Tensor
    """float32, shape (B, H) for per-head scaling or (1, 1) per tensor: x ~= values * descale."""

    def dequantized(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The exact real numbers the kernel is given (fp32 and fp64 hold them exactly)."""
        return self.values.to(dtype) * self.descale.to(dtype)[..., None, None]


def quantize(x: torch.Tensor, fmt: Fp8Format, per_head: bool = False) -> Quantized:
    """Scale ``x`` (B, H, S, D) so its largest magnitude lands on the format's largest finite
    value, then round. The scale is a power of two so that dequantizing is exact in any float
    dtype and the only error left is the fp8 rounding itself (TransformerEngine's delayed
    scaling also keeps power-of-two scales available; with a non-power-of-two scale the
    fp64 reference on the dequantized values would still be exact, this only keeps the numbers
    simple to read)."""
    x = x.to(torch.float32)
    dims = (-2, -1) if per_head else tuple(range(x.dim()))
    amax = x.abs().amax(dim=dims, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)
    scale = torch.exp2(torch.floor(torch.log2(fmt.max_finite / amax)))
    values = round_to_fp8(x * scale, fmt).to(fmt.torch_dtype)
    descale = (1.0 / scale).reshape(scale.shape[:2] if per_head else (1, 1))
    return Quantized(values, descale)
