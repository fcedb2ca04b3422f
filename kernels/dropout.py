"""The dropout keep-mask of the flash kernels, materialized for the fp64 reference.

Legend: nb / nh / ni / nj = how many batch / query-head / query / key indices are asked for.

:func:`keep_mask` runs the very device function the forward and both backward kernels call
(:func:`attnbench.kernels.common.dropout_keep`) on global (batch, head, query, key) indices, so the mask it
returns is the one they used by construction. :func:`keep_mask_torch` is an independent
re-implementation of Philox-4x32-10 in torch integer arithmetic; tests check the two agree bit
for bit, which pins down the random stream itself (a change to the counter layout or the
threshold shows up there, not only as a drifting error ratio).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnbench.kernels import configs
from attnbench.kernels.common import dropout_keep, specialization
from attnbench.kernels.compile_watch import note_launch
from attnbench.kernels.params import is_interpreted


@triton.jit
def mask_offsets(pid_bh, rows, cols, n_i, n_j):
    """Element offsets of rows x cols in the (nb * nh, ni, nj) mask: int64 throughout -- a
    (batch, head) slice alone has ni * nj elements, past 2^31 from 46341 x 46341 on."""
    return (pid_bh.to(tl.int64) * n_i + rows[:, None].to(tl.int64)) * n_j + cols[None, :]


@triton.jit(**specialization("_keep_mask_kernel"))
def _keep_mask_kernel(b_ptr, h_ptr, i_ptr, j_ptr, out_ptr, n_h, n_i, n_j, seed, threshold,
                      BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr):
    pid_bh = tl.program_id(0)
    b = tl.load(b_ptr + pid_bh // n_h)
    h = tl.load(h_ptr + pid_bh % n_h)
    rows = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    cols = tl.program_id(2) * BLOCK_J + tl.arange(0, BLOCK_J)
    i = tl.load(i_ptr + rows, mask=rows < n_i, other=0)
    j = tl.load(j_ptr + cols, mask=cols < n_j, other=0)
    keep = dropout_keep(seed, b, h, i[:, None], j[None, :], threshold)
    ptrs = out_ptr + mask_offsets(pid_bh, rows, cols, n_i, n_j)
    tl.store(ptrs, keep.to(tl.int8), mask=(rows[:, None] < n_i) & (cols[None, :] < n_j))


def _positions(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    x = x.to(device=device, dtype=torch.int64).reshape(-1)
    if x.numel() and (int(x.min()) < 0 or int(x.max()) >= 2**32):
        raise ValueError("dropout positions must lie in [0, 2^32)")
    return x.to(torch.int32) if x.numel() == 0 or int(x.max()) < 2**31 else x


def keep_mask(seed: int, threshold: int, b: torch.Tensor, h: torch.Tensor, i: torch.Tensor,
              j: torch.Tensor) -> torch.Tensor:
    """Bool (nb, nh, ni, nj), True = kept, for global indices, exactly as the kernels draw it.

    Runs where the kernels run: on the GPU when there is one (CPU index tensors are moved there
    and the mask moved back), in the interpreter otherwise.
    """
    out_device = b.device
    device = b.device
    if not is_interpreted(_keep_mask_kernel) and device.type != "cuda":
        device = torch.device("cuda")
    b, h, i, j = (_positions(x, device) for x in (b, h, i, j))
    out = torch.empty((len(b), len(h), len(i), len(j)), dtype=torch.int8, device=device)
    if out.numel():
        c = configs.DROPOUT_MASK_TILE
        grid = (len(b) * len(h), triton.cdiv(len(i), c.block_m), triton.cdiv(len(j), c.block_n))
        _keep_mask_kernel[grid](b, h, i, j, out, len(h), len(i), len(j), seed, threshold,
                                BLOCK_I=c.block_m, BLOCK_J=c.block_n, num_warps=c.num_warps,
                                num_stages=c.num_stages)
        note_launch("_keep_mask_kernel", c.to_dict())
    return out.to(device=out_device, dtype=torch.bool)


# -- Philox-4x32-10 in torch (int64 holding uint32 values) -------------------------------------
_M32 = 0xFFFFFFFF
_PHILOX_ROUND_A, _PHILOX_ROUND_B = 0xD2511F53, 0xCD9E8D57
_PHILOX_KEY_A, _PHILOX_KEY_B = 0x9E3779B9, 0xBB67AE85


def _mulhilo(a: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # a, x < 2^32: the int64 product wraps, but its bit pattern is the exact 64-bit product.
    prod = a * x
    return (prod >> 32) & _M32, prod & _M32


def philox4x32(seed: int, c0, c1, c2, c3, rounds: int = 10):
    """Philox-4x32 as ``triton.language.philox`` computes it, for int64 tensors of uint32s."""
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    for _ in range(rounds):
        hi_b, lo_b = _mulhilo(_PHILOX_ROUND_B, c2)
        hi_a, lo_a = _mulhilo(_PHILOX_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _PHILOX_KEY_A) & _M32, (k1 + _PHILOX_KEY_B) & _M32
    return c0, c1, c2, c3


def keep_mask_torch(seed: int, threshold: int, b: torch.Tensor, h: torch.Tensor, i: torch.Tensor,
                    j: torch.Tensor) -> torch.Tensor:
    """Same contract as :func:`keep_mask`, in plain torch (any device, no Triton)."""
    shape = (len(b), len(h), len(i), len(j))
    b = b.to(torch.int64).reshape(-1, 1, 1, 1)
    h = h.to(torch.int64).reshape(1, -1, 1, 1)
    i = i.to(torch.int64).reshape(1, 1, -1, 1)
    j = j.to(torch.int64).reshape(1, 1, 1, -1)
    zero = torch.zeros(shape, dtype=torch.int64, device=b.device)
    r0, _, _, _ = philox4x32(seed, zero + j, zero + i, zero + h, zero + b)
    return (r0 >> 1) >= threshold
