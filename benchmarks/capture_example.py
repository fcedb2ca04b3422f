"""The shipped capture example: train a tiny transformer on CPU, capture its attention calls,
and compare a kernel's error on them with the synthetic input kinds at the same shape.

A 2-layer causal transformer (d_model 64, 4 heads of 16, 128 tokens, seed 0) learns an
induction task (the second half of each sequence repeats the first: predict it) for
:data:`STEPS` Adam steps (loss 3.47 -> 0.20; about a minute of CPU). Its trained keys have
structure Gaussian inputs lack -- the rows share a direction (mean cosine 0.12 in layer 0,
about 0 for Gaussian keys) and layer 1's induction head attends sharply -- which is what an
unsmoothed int8 K cannot carry. One bf16 step is then captured (both layers, with dout).

    python benchmarks/capture_example.py [--out DIR]     # writes DIR/captured_example.safetensors
    attnbench run sweeps/captured_example.yaml --out RUN  # from the repository root

Printed: the mean cosine between key rows of each captured call (Gaussian keys: about 0), and
the largest value / bound of ``naive``, ``sdpa`` and ``mutant.k_int8_unsmoothed`` on each
captured call and on the synthetic kinds at the same shape. The committed capture,
``tests/support/data/captured_example.safetensors``, is this script's output.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import attnbench.execution.case_runner  # noqa: F401,I001  (attnbench.kernels before triton)
import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, HEADS, LAYERS, SEQ = 32, 64, 4, 2, 128
STEPS, BATCH = 1000, 8
FILE = "captured_example.safetensors"
ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "tests" / "support" / "data" / FILE


class Attention(nn.Module):
    """x: (batch, seq, dim) -> (batch, seq, dim), causal, heads of dim // heads."""

    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)

    def forward(self, x):
        batch, seq, _ = x.shape
        # q, k, v: (batch, heads, seq, head_dim), looked up on F at call time as models do
        q, k, v = self.qkv(x).view(batch, seq, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(o.transpose(1, 2).reshape(batch, seq, DIM))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(DIM), Attention()
        self.norm2 = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    """tokens: (batch, seq) -> logits (batch, seq, VOCAB)."""

    def __init__(self):
        super().__init__()
        self.embed, self.position = nn.Embedding(VOCAB, DIM), nn.Parameter(
            0.02 * torch.randn(SEQ, DIM))
        self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position[:tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def induction_batch(generator: torch.Generator, batch: int = BATCH) -> torch.Tensor:
    """(batch, SEQ + 1) tokens whose second half repeats the first (the model reads SEQ)."""
    half = torch.randint(0, VOCAB, (batch, SEQ // 2), generator=generator)
    return torch.cat([half, half, half[:, :1]], dim=1)


def loss_of(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    # only the repeated half is predictable: the first half is noise
    return F.cross_entropy(logits[:, SEQ // 2 - 1:].reshape(-1, VOCAB).float(),
                           tokens[:, SEQ // 2:].reshape(-1))


def train(steps: int = STEPS, seed: int = 0) -> tuple[nn.Module, float]:
    """The trained model and its last loss (chance is ln 32 = 3.47)."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = Transformer()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss = torch.zeros(())
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_of(model, induction_batch(generator))
        loss.backward()
        optimizer.step()
    return model, float(loss.detach())


def capture(path: Path, model: nn.Module, seed: int = 0) -> str:
    """One bf16 step of ``model`` on one sequence, both layers' attention with dout, into
    ``path``; returns the capture's summary line."""
    from attnbench.capture import capture_attention

    model = model.to(torch.bfloat16)
    tokens = induction_batch(torch.Generator().manual_seed(seed + 1), batch=1)
    with capture_attention(path, model=model, max_calls=LAYERS) as cap:
        loss_of(model, tokens).backward()
    return cap.summary()


def key_correlation(k: torch.Tensor) -> float:
    """Mean cosine between distinct key rows, over batch and heads. k: (batch, heads, seq, D)."""
    unit = F.normalize(k.double(), dim=-1)
    cos = unit @ unit.transpose(-1, -2)
    n = k.shape[-2]
    return float((cos.sum((-1, -2)) - n).mean() / (n * (n - 1)))


def margins(path: Path) -> list[tuple[str, str, float]]:
    """(backend, inputs, largest value / bound of any check) on each captured call and each
    synthetic kind at the same shape."""
    from attnbench.execution.case_runner import run_case
    from attnbench.sweep.case import make_case
    from attnbench.sweep.options import RunOptions, TimingOptions

    options = RunOptions(timeout_s=120, timing=TimingOptions(enabled=False))
    rows = []
    for backend in ("naive", "sdpa", "mutant.k_int8_unsmoothed"):
        inputs = [dict(inputs="captured", captured=f"{path}:{call}") for call in range(LAYERS)]
        inputs += [dict(inputs=kind, batch=1, seqlen_q=SEQ, heads_q=HEADS,
                        head_dim=DIM // HEADS, mask="causal", dtype="bf16")
                   for kind in ("normal", "large_logits", "outliers")]
        for fields in inputs:
            record = run_case(make_case("example", dict(backend=backend, seed=0, **fields)),
                              options)
            worst = max((c["value"] / c["bound"] for c in record["checks"]
                         if c["bound"]), default=float("nan"))  # (determinism's is 0)
            label = fields.get("captured", fields["inputs"]).rsplit("/", 1)[-1]
            rows.append((backend, f"{label} ({record['verdict']})", worst))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for the capture")
    args = parser.parse_args(argv)
    model, loss = train()
    print(f"trained {STEPS} steps: loss {loss:.3f} (chance {torch.log(torch.tensor(VOCAB)):.3f})")
    path = args.out / FILE
    print(capture(path, model))
    from attnbench.capture import load_capture

    for call in load_capture(path):
        print(f"{call.meta['layer']}: mean cosine between key rows "
              f"{key_correlation(call.tensors['k']):.2f}")
    for backend, inputs, worst in margins(path):
        print(f"{backend:28s} {inputs:44s} worst value/bound {worst:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
