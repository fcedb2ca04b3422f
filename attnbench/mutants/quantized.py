"""A bug of quantized attention that only inputs with real structure show.

Trained keys share a large common direction (the mean key over the sequence, channels that are
large in every row); Gaussian keys do not. Quantizing K to int8 with a scale set by the largest
magnitude spends the 8 bits on that shared part, which softmax ignores (a shift of all keys
shifts each score row by a constant), and rounds away the differences between keys, which is
all softmax sees. SageAttention (Zhang et al., ICLR 2025, arXiv:2410.02367, "smoothing K")
subtracts the mean key before quantizing for this reason; this mutant skips it.
"""

from __future__ import annotations

import torch

from attnbench.backends.naive import NaiveBackend

INT8_MAX = 127.0


def int8_per_channel(k: torch.Tensor) -> torch.Tensor:
    """k quantized to int8 and back, one scale per (batch, head, channel) from its largest
    magnitude over the sequence; k: (batch, heads, seq, head_dim), fp32 math."""
    k32 = k.float()
    scale = k32.abs().amax(dim=-2, keepdim=True).clamp_min(1e-30) / INT8_MAX
    return ((k32 / scale).round().clamp(-INT8_MAX, INT8_MAX) * scale).to(k.dtype)


class KInt8Unsmoothed(NaiveBackend):
    """Extra -- K quantized to int8 per channel without subtracting the mean key first
    (SageAttention's smoothing, arXiv:2410.02367). Within the bound on Gaussian
    keys; on trained keys, whose rows share a large mean, the scores' differences are rounded
    away. Backward is naive's at the quantized K (a straight-through estimator, as quantized
    kernels use)."""

    name = "mutant.k_int8_unsmoothed"
    supports_packed = False

    def attend(self, q_in, k_in, v_in, spec, masks):
        quantized = k_in + (int8_per_channel(k_in.detach()) - k_in.detach())  # BUG: no k - mean
        return super().attend(q_in, quantized, v_in, spec, masks)
