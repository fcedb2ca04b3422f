"""A dropout keep-mask that is a pure function of (seed, batch, head, query, key) positions.

The ``naive`` backend draws its dropout mask from here, so the fp64 reference can rebuild the
exact mask block by block (no S x S tensor ever needs to exist), and a context-parallel run that
keys the mask by *global* positions gets bit-identical masks to the single-device run.

The hash is murmur3's 32-bit finaliser applied twice, computed in int64 with explicit masking to
32 bits (torch has no uint32 arithmetic; int64 products of two 32-bit values wrap, but their low
32 bits are exact, which is all the finaliser uses).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from attnbench.problem.attn_spec import AttnSpec

_M32 = 0xFFFFFFFF


def _fmix32(h: "torch.Tensor") -> "torch.Tensor":
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def uniform01(seed: int, b: "torch.Tensor", h: "torch.Tensor", i: "torch.Tensor",
              j: "torch.Tensor") -> "torch.Tensor":
    """Uniform [0, 1) float64 numbers, shape (len(b), len(h), len(i), len(j))."""
    import torch

    b = b.to(torch.int64)[:, None, None, None]
    h = h.to(torch.int64)[None, :, None, None]
    i = i.to(torch.int64)[None, None, :, None]
    j = j.to(torch.int64)[None, None, None, :]
    # Two rounds keyed by (seed, batch, head) then (query, key): positions up to 2^32 each.
    row = _fmix32(((b * 0x9E3779B1) ^ (h * 0x7FEB352D) ^ seed) & _M32)
    x = _fmix32((row ^ (i * 0x85EBCA77)) & _M32)
    x = _fmix32((x ^ ((j * 0xC2B2AE3D) & _M32)) & _M32)
    return x.to(torch.float64) * (1.0 / 4294967296.0)


def hash_keep_mask(spec: "AttnSpec", b: "torch.Tensor", h: "torch.Tensor", i: "torch.Tensor",
                   j: "torch.Tensor") -> "torch.Tensor":
    """Keep-mask (True = kept) for global batch/head/query/key indices."""
    return uniform01(spec.dropout_seed, b, h, i, j) >= spec.dropout_p
