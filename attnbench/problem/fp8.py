"""fp8 formats: scaled quantization as the fp8 attention APIs take it, and exact rounding in fp32.

The fp8 attention kernels (FlashAttention-3's ``descale_q/k/v``, cuDNN / TransformerEngine fp8
attention, Triton's fp8 ``tl.dot``) take q, k, v already quantized: ``x8 = fp8(x * scale)`` with
``scale = fp8_max / amax(x)`` per tensor (or per head), plus the inverse ``descale = 1 / scale``
to undo it inside the kernel. :func:`quantize` does exactly that, so the numbers a backend gets
are those a training framework would hand it.

:func:`round_to_fp8` rounds fp32 values to the fp8 grid *in fp32 arithmetic* (round to nearest,
ties to even, saturating at the format's largest finite value, subnormals included). It is the
model of a kernel's in-register fp8 quantization (P before P·V, FA3's choice), and it agrees
bit for bit with ``torch``'s cast for every finite value within range
(tests/kernels/test_fp8.py). Why
not just cast: Triton 3.9's interpreter casts fp32 -> fp8 wrongly when rounding carries into
the exponent (-1.965 -> -1.0 instead of -2.0, a 50 % error, measured); the Triton kernels use
the same arithmetic (``kernels/fp8.py``) and only ever cast values already on the grid.

The formats' numbers are declared with the other dtypes (:mod:`attnbench.dtypes`);
:func:`torch_dtype` is the one place a declared dtype becomes a torch dtype, and
:func:`output_dtype` the torch dtype of a case's output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from attnbench.dtypes import BY_NAME, DTYPES


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


P_PRESCALE = 256.0
"""What a correct fp8 forward multiplies P (softmax numerators in (0, 1], relative to the row
max) by before rounding it to fp8 for P·V, and divides out of the output: 2^8 keeps the diffuse
part of a softmax clear of fp8's subnormals and zero (e4m3's smallest normal is 2^-6, values
under 2^-10 round to 0), while the normaliser counts them unrounded. Without it a row whose
mass is spread over thousands of keys beside a few hot ones loses that mass from the output
only (flashinfer-ai/flashinfer#5020, ROCm/FlyDSL#1020; FlashAttention-4's fp8 ``max_offset =
8``). 256 < 448, e4m3's largest value, so the row max's P = 1 never saturates (a kernel that
keeps a stale max may exceed it: Dao-AILab/flash-attention#2717)."""


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of the declared dtype ``name`` (:data:`attnbench.dtypes.BY_NAME`)."""
    return getattr(torch, BY_NAME[name].torch_name)


def output_dtype(name: str) -> torch.dtype:
    """The torch dtype of the output (and dout) of a case of dtype ``name``: its own, or an fp8
    case's declared output (:data:`attnbench.dtypes.FP8_OUTPUT`)."""
    return torch_dtype(BY_NAME[name].output)


FORMATS = {d.name: Fp8Format(d.name, torch_dtype(d.name), d.fp8.mantissa_bits,
                             d.fp8.min_normal_exp, d.fp8.max_finite)
           for d in DTYPES if d.fp8 is not None}
"""The fp8 dtypes' grids (:data:`attnbench.dtypes.DTYPES`), with their torch dtypes."""


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
    """float32, (B, Hkv) for per-head scaling (FA3's ``descale_q/k/v`` layout: query head h
    shares the factor of its KV head h // (H / Hkv)) or (1, 1) per tensor:
    x ~= values * descale."""

    def per_head(self) -> torch.Tensor:
        """The descale of every head of ``values``: (B or 1, H) float32."""
        return self.descale.repeat_interleave(self.values.shape[1] // self.descale.shape[1],
                                              dim=1) if self.descale.shape[1] > 1 else \
            self.descale.expand(self.descale.shape[0], self.values.shape[1])

    def dequantized(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The exact real numbers the kernel is given (fp32 and fp64 hold them exactly)."""
        return self.values.to(dtype) * self.per_head().to(dtype)[..., None, None]


def quantize(x: torch.Tensor, fmt: Fp8Format, per_head: bool = False,
             heads_kv: Optional[int] = None) -> Quantized:
    """Scale ``x`` (B, H, S, D) so its largest magnitude lands on the format's largest finite
    value, then round. ``per_head``: one scale per (batch row, KV head) -- the H heads form
    ``heads_kv`` (default H) contiguous groups, as a GQA query tensor does. The scale is a power
    of two so that dequantizing is exact in any float dtype and the only error left is the fp8
    rounding itself (TransformerEngine's delayed scaling also keeps power-of-two scales
    available; with a non-power-of-two scale the fp64 reference on the dequantized values would
    still be exact, this only keeps the numbers simple to read)."""
    x = x.to(torch.float32)
    batch, heads = x.shape[:2]
    groups = heads_kv or heads
    if heads % groups:
        raise ValueError(f"quantize: {heads} heads do not form {groups} groups")
    if per_head:
        grouped = x.reshape(batch, groups, -1)
        amax = grouped.abs().amax(dim=-1)                                   # (B, Hkv)
    else:
        amax = x.abs().amax().reshape(1, 1)
    amax = amax.clamp(min=torch.finfo(torch.float32).tiny)
    scale = torch.exp2(torch.floor(torch.log2(fmt.max_finite / amax)))
    per = Quantized(x, 1.0 / scale).per_head()                              # (B|1, H)
    values = round_to_fp8(x / per[..., None, None], fmt).to(fmt.torch_dtype)
    return Quantized(values, 1.0 / scale)


def with_descales(spec, q: Quantized, k: Quantized, v: Quantized, fmt_name: str):
    """``spec`` (an :class:`attnbench.problem.attn_spec.AttnSpec`) carrying the fp8 format and the
    descales of quantized q, k, v as plain floats."""
    flat = tuple(tuple(float(x) for x in t.descale.flatten().tolist()) for t in (q, k, v))
    return spec.replace(fp8_format=fmt_name, descales=flat)


def descale_tensors(spec, batch: int, heads_kv: int, device) -> tuple[torch.Tensor, ...]:
    """The spec's descales as FA3 takes them: three float32 (B, Hkv) tensors (a per-tensor
    value broadcast)."""
    out = []
    for values in spec.descales:
        t = torch.tensor(values, dtype=torch.float32, device=device)
        out.append(t.expand(batch, heads_kv).contiguous() if t.numel() == 1
                   else t.reshape(batch, heads_kv))
    return tuple(out)


def dequantize_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec,
                    dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp8 q (B, Hq, Sq, D), k, v (B, Hkv, Sk, *) of an fp8 call as ``dtype`` values: exact in
    fp32/fp64, and in bf16 for power-of-two descales (e4m3/e5m2 have fewer mantissa bits)."""
    batch, heads_q = q.shape[:2]
    heads_kv = k.shape[1]
    dq, dk, dv = descale_tensors(spec, batch, heads_kv, q.device)
    dq = dq.repeat_interleave(heads_q // heads_kv, dim=1)
    return tuple((x.to(torch.float32) * d[..., None, None]).to(dtype)
                 for x, d in ((q, dq), (k, dk), (v, dv)))
