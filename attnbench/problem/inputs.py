"""Input tensors for a case: the same numbers on every device and every rerun.

Drawn in fp32 on the CPU from a generator seeded by the case seed, rounded to the case's dtype,
then moved to the device; the fp64 reference starts from those same rounded values. fp8 cases
quantize q, k and v with a power-of-two scale (:mod:`attnbench.problem.fp8`) and keep the fp32 draws
for the end-to-end error.

Distributions:
  normal        q, k, v, dout ~ N(0, 1)
  large_logits  q and k ~ N(0, 3^2): scaled scores have std ~9 and reach ~40, where an
                exp() without the running max overflows fp16 (max e^11) and strains bf16 sums
  outliers      N(0, 1) with a few whole channels (feature dims) scaled, like the activation
                outliers of large language models: x20 in v (stresses the P @ V accumulation)
                and x4 in q and k (logits ~16x larger on those channels; x20 there made
                logits of several hundred, where even bf16 inputs carry no usable softmax)
  loud_heads    q, k, v heads scaled x1/2, x1, x2 (head h by 2^(h % 3 - 1)), alike in q, k, v
  sink          one key per sequence every query leans to (SINK_GAP above the rest)
  kv_apart      k's heads x1/2, x1, x2 and v's KV_APART times k's, head by head: K and V
                (and heads) 4x apart, so their power-of-two fp8 scales differ -- under
                normal inputs K and V draw the same scale and a kernel that swaps their
                descales is right by luck (issue 26)
  shifted_v     q, k, dout ~ N(0, 1), v ~ N(SHIFTED_V_MEAN, 1): every output row sits near
                the mean, so an accumulator that drops low bits of the running P @ V (a bf16
                or unpromoted fp8 accumulator, a rescale rounded in low precision) loses
                them on a value of size ~1, where around zero it loses little (issue 39)
  captured      q, k, v and dout as one call of a user's model saw them (``case.captured``,
                :mod:`attnbench.capture`), checked against the digest the case names; a call
                captured without a backward gets dout ~ N(0, 1) from the seed
"""

from __future__ import annotations

import concurrent.futures
import math
import zlib
from dataclasses import dataclass

import torch

from attnbench.capture.replay import parse_reference, replay_tensors
from attnbench.dtypes import is_fp8
from attnbench.problem.fp8 import FORMATS, Quantized, output_dtype, quantize, torch_dtype
from attnbench.sweep.capture_rules import CAPTURED
from attnbench.sweep.case import Case


def _draw(case: Case) -> dict[str, torch.Tensor]:
    """q, k, v, dout in fp32 on the CPU (shapes (B, H, S, D); a packed case (1, H, T, D))."""
    gen = torch.Generator(device="cpu").manual_seed(case.seed)
    batch = case.tensor_batch  # a packed case is one buffer of seqlen_q tokens
    shapes = {
        "q": (batch, case.heads_q, case.seqlen_q, case.head_dim),
        "k": (batch, case.heads_kv, case.seqlen_kv, case.head_dim),
        "v": (batch, case.heads_kv, case.seqlen_kv, case.head_dim_v),
        "dout": (batch, case.heads_q, case.seqlen_q, case.head_dim_v),
    }
    tensors = {name: _randn(shape, gen, case.seed, name) for name, shape in shapes.items()}
    if case.inputs == "large_logits":
        tensors["q"] *= 3.0
        tensors["k"] *= 3.0
    elif case.inputs == "outliers":
        for name, factor in (("q", 4.0), ("k", 4.0), ("v", 20.0)):
            t = tensors[name]
            n_out = max(1, t.shape[-1] // 32)
            channels = torch.randperm(t.shape[-1], generator=gen)[:n_out]
            t[..., channels] *= factor
    elif case.inputs == "sink":
        _add_sink(case, tensors, gen)
    elif case.inputs == "loud_heads":
        for name in ("q", "k", "v"):
            heads = tensors[name].shape[1]
            tensors[name] *= (2.0 ** (torch.arange(heads) % 3 - 1.0))[None, :, None, None]
    elif case.inputs == "shifted_v":
        tensors["v"] += SHIFTED_V_MEAN
    elif case.inputs == "kv_apart":
        heads = 2.0 ** (torch.arange(case.heads_kv) % 3 - 1.0)[None, :, None, None]
        tensors["k"] *= heads
        tensors["v"] *= heads * KV_APART
    return tensors


CHUNKED_DRAW = 1 << 26
"""A tensor of more values than this (67M: only GPU-sized caches, a 1M-key decode's K is 1.07G)
is drawn in chunks of :data:`DRAW_CHUNK` values, each from its own generator seeded by (case
seed, tensor, chunk), on several threads: one generator drew 2.1G values in ~15 s per step. The
values depend on the chunk size, never on the thread count; smaller tensors keep the one
generator's stream (every existing case's inputs unchanged)."""
DRAW_CHUNK = 1 << 24
DRAW_THREADS = 8


def _randn(shape: tuple[int, ...], gen: torch.Generator, seed: int, name: str) -> torch.Tensor:
    numel = math.prod(shape)
    if numel <= CHUNKED_DRAW:
        return torch.randn(shape, generator=gen)
    out = torch.empty(numel)
    salt = zlib.crc32(name.encode())

    def draw(chunk: int) -> None:
        part = torch.Generator(device="cpu").manual_seed(
            (seed * 1_000_003 + salt * 7_919 + chunk) % (1 << 63))
        start = chunk * DRAW_CHUNK
        torch.randn(min(DRAW_CHUNK, numel - start), generator=part,
                    out=out[start:start + DRAW_CHUNK])

    chunks = range(-(-numel // DRAW_CHUNK))
    with concurrent.futures.ThreadPoolExecutor(DRAW_THREADS) as pool:  # torch frees the GIL
        list(pool.map(draw, chunks))
    return out.view(shape)


def _captured(case: Case) -> dict[str, torch.Tensor]:
    """The captured call's tensors, in the capture's dtype (the case's: the sweep took it)."""
    path, call, digest = parse_reference(case.captured)
    q, k, v, dout = replay_tensors(path, call, digest)
    if dout is None:
        gen = torch.Generator(device="cpu").manual_seed(case.seed)
        dout = torch.randn((case.batch, case.heads_q, case.seqlen_q, case.head_dim_v),
                           generator=gen)
    return {"q": q, "k": k, "v": v, "dout": dout}


KV_APART = 4.0
"""How much larger v is than k in ``kv_apart``, head by head: 4 = 2^2, two binades, so the
power-of-two fp8 scales differ however the two tensors' largest draws happen to fall (a
draw's amax varies by well under 2x at these sizes: one binade of slack)."""


SHIFTED_V_MEAN = 1.0
"""The mean of v in ``shifted_v``: as large as its spread, so out = P @ V ~ 1 + O(1/sqrt(S))
in every row -- the mean a rounded accumulator must carry -- while v's fp8 scale stays within a
binade of ``normal``'s (amax ~4.5 -> ~5.5)."""


SINK_GAP = 8.0
"""How far (in logits) the sink key scores above a typical key: e^-8 ~ 3e-4, under e4m3's
2^-10 rounding-to-zero threshold, so without pre-scaling every other key's P is lost."""


def _add_sink(case: Case, tensors: dict, gen: torch.Generator) -> None:
    """Every query leans towards one direction u (|u|^2 = D); the first key of each sequence
    is u * SINK_GAP / sqrt(D), so its scaled score is ~SINK_GAP for every query."""
    d = case.head_dim
    u = torch.sign(torch.randn(d, generator=gen))
    tensors["q"] = tensors["q"] * 0.5 + u
    starts = [0]
    if case.is_packed:  # the first key of every packed sequence
        starts = [sum(case.seqlens_kv[:i]) for i in range(len(case.seqlens_kv))
                  if case.seqlens_kv[i] > 0]
    tensors["k"][:, :, starts, :] = u * (SINK_GAP / d ** 0.5)


def make_inputs(case: Case, device: torch.device | str = "cpu"):
    """Return (q, k, v, dout) in the case's dtype on ``device``; shapes (B, H, S, D), for a
    packed case (1, H, total tokens, D) (:mod:`attnbench.problem.packing`). fp8 cases: q, k, v are
    the fp8 values of :func:`make_fp8_inputs` (their descales are there), dout bf16."""
    if is_fp8(case.dtype):
        return make_fp8_inputs(case, device).tensors
    tensors = _captured(case) if case.inputs == CAPTURED else _draw(case)
    dtype = torch_dtype(case.dtype)
    return tuple(tensors[n].to(dtype).to(device) for n in ("q", "k", "v", "dout"))


@dataclass(frozen=True)
class Fp8Inputs:
    """An fp8 case's inputs: q, k, v quantized as the fp8 APIs take them, and the fp32 values
    they were quantized from (the end-to-end error is measured against those)."""

    q: Quantized
    k: Quantized
    v: Quantized
    dout: torch.Tensor
    originals: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    """q, k, v in fp32 before quantization, on the same device."""

    @property
    def tensors(self):
        return self.q.values, self.k.values, self.v.values, self.dout

    def dequantized(self, dtype: torch.dtype = torch.float64):
        """(q, k, v) as the exact real numbers the kernel is given."""
        return tuple(x.dequantized(dtype) for x in (self.q, self.k, self.v))


def make_fp8_inputs(case: Case, device: torch.device | str = "cpu") -> Fp8Inputs:
    """The case's fp32 draws quantized with :func:`attnbench.problem.fp8.quantize`: one power-of-two
    scale per tensor, or per (batch row, KV head) with ``fp8_scaling: head``."""
    tensors = _draw(case)
    fmt = FORMATS[case.dtype]
    per_head = case.fp8_scaling == "head"
    quantized = [quantize(tensors[n], fmt, per_head=per_head, heads_kv=case.heads_kv)
                 for n in ("q", "k", "v")]
    quantized = [Quantized(x.values.to(device), x.descale.to(device)) for x in quantized]
    return Fp8Inputs(*quantized, tensors["dout"].to(output_dtype(case.dtype)).to(device),
                     tuple(tensors[n].to(device) for n in ("q", "k", "v")))
