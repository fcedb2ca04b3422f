"""fp8 rounding and scaled quantization: bit-exact against torch's casts, in torch and in Triton."""

import pytest
import torch

import attnbench.kernels  # noqa: F401  (sets TRITON_INTERPRET when there is no GPU, before triton loads)
import triton
import triton.language as tl

from attnbench.kernels.fp8 import round_to_fp8_grid
from attnbench.problem.fp8 import FORMATS, quantize, round_to_fp8


@triton.jit
def _round_kernel(x_ptr, y_ptr, n, MANT: tl.constexpr, MINEXP: tl.constexpr,
                  MAXF: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, round_to_fp8_grid(x, MANT, MINEXP, MAXF), mask=offs < n)


def _values(fmt, n=20000, seed=0):
    """Random magnitudes across the whole range, ties, subnormals, exact grid points, zero."""
    gen = torch.Generator().manual_seed(seed)
    exps = torch.randint(fmt.min_normal_exp - fmt.mantissa_bits - 2,
                         int(torch.log2(torch.tensor(fmt.max_finite))) + 1, (n,), generator=gen)
    x = torch.ldexp(1 + torch.rand(n, generator=gen), exps)
    grid = torch.arange(0, 256, dtype=torch.uint8).view(fmt.torch_dtype).float()
    grid = grid[torch.isfinite(grid)]
    ties = (grid[:-1] + grid[1:]) / 2  # halfway between neighbours (of one sign's sorted run)
    x = torch.cat([x, -x, grid, ties[torch.isfinite(ties)], torch.tensor([0.0, -0.0])])
    return x[x.abs() <= fmt.max_finite]


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_rounding_matches_torch_cast(name):
    fmt = FORMATS[name]
    x = _values(fmt)
    expected = x.to(fmt.torch_dtype).float()
    got = round_to_fp8(x, fmt)
    bad = got != expected
    assert not bad.any(), list(zip(x[bad][:5].tolist(), got[bad][:5].tolist(),
                                   expected[bad][:5].tolist()))


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_rounding_saturates(name):
    fmt = FORMATS[name]
    x = torch.tensor([fmt.max_finite * 1.01, -fmt.max_finite * 4])
    assert round_to_fp8(x, fmt).tolist() == [fmt.max_finite, -fmt.max_finite]


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("per_head", [False, True])
def test_quantize_scales_to_the_format_range(name, per_head):
    fmt = FORMATS[name]
    x = torch.randn(2, 3, 64, 16, generator=torch.Generator().manual_seed(1))
    x[1, 2] *= 100  # one loud head: per-head scaling keeps the others' precision
    qx = quantize(x, fmt, per_head=per_head)
    assert qx.values.dtype == fmt.torch_dtype
    assert qx.descale.shape == ((2, 3) if per_head else (1, 1))
    deq = qx.dequantized(torch.float64)
    scaled_max = (qx.values.float().abs().amax(dim=(-2, -1)) if per_head
                  else qx.values.float().abs().max())
    assert (scaled_max >= fmt.max_finite / 2).all() and (scaled_max <= fmt.max_finite).all()
    rel = ((deq - x.double()).abs() / x.double().abs().clamp(min=1e-30))
    normal = x.double().abs() * (1 / qx.descale.double()[..., None, None]) >= 2.0 ** fmt.min_normal_exp
    assert rel[normal].max() <= fmt.eps * (1 + 1e-6)
    if per_head:  # the quiet heads were not scaled by the loud one
        assert qx.descale[0, 0] < qx.descale[1, 2] / 32


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_triton_rounding_matches_torch_cast(name):
    fmt = FORMATS[name]
    x = _values(fmt, n=4000)
    y = torch.empty_like(x)
    _round_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), fmt.mantissa_bits,
                                            fmt.min_normal_exp, fmt.max_finite, BLOCK=1024)
    expected = x.to(fmt.torch_dtype).float()
    bad = y != expected
    assert not bad.any(), list(zip(x[bad][:5].tolist(), y[bad][:5].tolist()))
