"""fp8 quantization inside a kernel, in fp32 arithmetic (see :mod:`attnbench.problem.fp8` for the
model).

Triton 3.9's interpreter casts fp32 -> fp8 wrongly when the rounding carries into the exponent
(-1.965 becomes -1.0, not -2.0); a compiled kernel's ``cvt`` rounds correctly. Rounding to the
grid first, then casting a value that is already on the grid, is right on both, so CI checks the
numbers the GPU computes.
"""

import os

import triton
import triton.language as tl

from attnbench.dtypes import FP8_WGMMA_K
from attnbench.resources import ENV_FP8_MAX_IMPRECISE_ACC

# Adding then subtracting 1.5 * 2^23 rounds an fp32 |y| < 2^22 to an integer, ties to even
# (IEEE round-to-nearest addition); the quotients below are at most 2^(mantissa_bits + 1).
_RINT_MAGIC = tl.constexpr(12582912.0)


@triton.jit
def round_to_fp8_grid(x, MANTISSA_BITS: tl.constexpr, MIN_NORMAL_EXP: tl.constexpr,
                      MAX_FINITE: tl.constexpr):
    """fp32 ``x`` rounded to the fp8 grid (nearest, ties to even, saturating), still fp32."""
    bits = x.to(tl.int32, bitcast=True)
    exp = ((bits >> 23) & 0xFF) - 127  # zero and fp32 subnormals give -127: clamped below
    exp = tl.maximum(exp, MIN_NORMAL_EXP)
    spacing = ((exp - MANTISSA_BITS + 127) << 23).to(tl.float32, bitcast=True)
    # Multiply by 1 / spacing, built from its bits too: exact (a power of two, normal for every
    # fp32 exponent). Not x / spacing: a compiled kernel's fp32 `/` is div.full.f32, an
    # approximation (up to 2 ulp), which could move y off its integer and misround.
    y = x * ((MANTISSA_BITS - exp + 127) << 23).to(tl.float32, bitcast=True)
    y = (y + _RINT_MAGIC) - _RINT_MAGIC
    return tl.minimum(tl.maximum(y * spacing, -MAX_FINITE), MAX_FINITE)


@triton.jit
def round_to_grid(x, MANTISSA_BITS: tl.constexpr):
    """fp32 ``x`` rounded to the grid of a format with fp32's exponent range and
    ``MANTISSA_BITS`` stored mantissa bits (bf16: 7), nearest, ties to even, still fp32.

    Integer rounding of the fp32 bits: add half an ulp of the target minus one, plus the lowest
    kept bit (ties go to even), then clear the dropped bits (unsigned: no overflow). A carry into
    the exponent is the correct result (1.99 -> 2.0; the largest values round to inf, as a cast
    does), and fp32 subnormals are handled alike (bf16 shares them). Used before fp32 -> bf16 casts
    under Triton 3.9's interpreter, which truncates them (kernels/flash_fwd.py).
    """
    DROP: tl.constexpr = 23 - MANTISSA_BITS
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + ((1 << (DROP - 1)) - 1) + ((bits >> DROP) & 1)
    bits = (bits >> DROP) << DROP
    return bits.to(tl.float32, bitcast=True)


def max_imprecise_acc() -> int:
    """The fp8 dots' promotion interval from ATTNBENCH_FP8_MAX_IMPRECISE_ACC: 0 (unset: Triton's
    default, which on sm_90 never promotes: 2^30) or a power of two, raised to FP8_WGMMA_K --
    every that many products the tensor cores' partial sum is added into the fp32 accumulator
    by ordinary fp32 adds (tl.dot's ``max_num_imprecise_acc``; the kernel caps it at each dot's
    K, so any value >= the key tile promotes the running accumulator once per key block)."""
    raw = os.environ.get(ENV_FP8_MAX_IMPRECISE_ACC) or "0"
    value = int(raw) if raw.isdigit() else -1
    if value < 0 or value & (value - 1):
        raise ValueError(f"{ENV_FP8_MAX_IMPRECISE_ACC}={raw!r}: expected 0 (Triton's default) or "
                         "a power of two")
    return max(value, FP8_WGMMA_K) if value else 0
