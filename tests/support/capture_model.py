"""A tiny transformer for the capture tests: two attention layers that call
``torch.nn.functional.scaled_dot_product_attention`` as user models do (looked up on ``F`` at
call time), each remembering what it passed and what came back, so a test can compare the
capture with what the layers saw, bit for bit. Run as a script it does one training step (the
``attnbench capture -- SCRIPT`` test)."""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    """x: (batch, seq, dim) -> (batch, seq, dim); heads of dim // heads."""

    def __init__(self, dim: int = 32, heads: int = 4, causal: bool = True):
        super().__init__()
        self.qkv, self.out, self.heads, self.causal = nn.Linear(dim, 3 * dim), \
            nn.Linear(dim, dim), heads, causal
        self.seen: list[dict] = []

    def forward(self, x, mask=None):
        batch, seq, dim = x.shape
        # q, k, v: (batch, heads, seq, head_dim), non-contiguous views as in real models
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, dim // self.heads).permute(
            2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                           is_causal=self.causal and mask is None)
        entry = {"q": q.detach().clone(), "k": k.detach().clone(), "v": v.detach().clone()}
        if o.requires_grad:
            o.register_hook(lambda g: entry.__setitem__("dout", g.detach().clone()))
        self.seen.append(entry)
        return self.out(o.transpose(1, 2).reshape(batch, seq, dim))


class Block(nn.Module):
    def __init__(self, dim: int = 32):
        super().__init__()
        self.attn, self.norm = Attention(dim), nn.LayerNorm(dim)

    def forward(self, x, mask=None):
        return x + self.attn(self.norm(x), mask)


class TinyModel(nn.Module):
    def __init__(self, dim: int = 32, layers: int = 2):
        super().__init__()
        self.blocks = nn.ModuleList([Block(dim) for _ in range(layers)])

    def forward(self, x, mask=None):
        for block in self.blocks:
            x = block(x, mask)
        return x


def train_step(model: nn.Module, batch: int = 2, seq: int = 16, dim: int = 32,
               dtype=torch.float32, mask=None) -> None:
    x = torch.randn(batch, seq, dim, dtype=dtype)
    model(x, mask).square().mean().backward()


if __name__ == "__main__":
    torch.manual_seed(0)
    train_step(TinyModel())
    sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
