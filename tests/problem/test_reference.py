"""The fp64 reference against dense autograd, and its memory bound."""

import itertools
import subprocess
import sys

import pytest
import torch

from attnbench.problem import reference as ref_mod
from attnbench.problem.attn_spec import AttnSpec, alibi_slopes
from attnbench.problem.dropout import hash_keep_mask, uniform01
from attnbench.problem.reference import reference_backward, reference_forward
from attnbench.sweep.case import make_case

F64 = torch.float64


def dense_attention(q, k, v, spec):
    """Textbook fp64 attention with autograd, written independently of
    attnbench.problem.reference."""
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    g = hq // hkv
    kr, vr = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ kr.transpose(-1, -2) * spec.scale
    if spec.softcap:
        s = spec.softcap * torch.tanh(s / spec.softcap)
    i = torch.arange(sq)[:, None] + (sk - sq)
    j = torch.arange(sk)[None, :]
    if spec.alibi_slopes is not None:
        slopes = torch.tensor(spec.alibi_slopes, dtype=F64)
        s = s - slopes[:, None, None] * (i - j).abs()
    allowed = torch.ones(sq, sk, dtype=torch.bool)
    if spec.window_right >= 0:
        allowed &= j - i <= spec.window_right
    if spec.window_left >= 0:
        allowed &= j - i >= -spec.window_left
    s = s.masked_fill(~allowed, float("-inf"))
    has_key = allowed.any(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(~has_key, 0.0), -1) * has_key
    if spec.dropout_p:
        keep = uniform01(spec.dropout_seed, torch.arange(b), torch.arange(hq), torch.arange(sq),
                         torch.arange(sk)) >= spec.dropout_p
        p = p * keep / (1 - spec.dropout_p)
    return p @ vr


CASES = list(itertools.product(
    [(4, 4), (4, 2), (4, 1)],                      # heads q/kv: MHA, GQA, MQA
    [(37, 37), (29, 70), (70, 29)],                 # odd lengths, Sq < Sk, Sq > Sk
    ["none", "causal", "window"],
    ["none", "alibi"],
    [0.0, 0.25],
    [0.0, 7.0],
))


@pytest.mark.parametrize("heads, lens, mask, bias, dropout, softcap", CASES)
def test_reference_matches_dense_autograd(heads, lens, mask, bias, dropout, softcap, monkeypatch):
    monkeypatch.setattr(ref_mod, "_BLOCK_ELEMS", 4 * 16 * 16)  # force many blocks
    window = {"window_left": 5, "window_right": 2} if mask == "window" else {}
    case = make_case("t", dict(backend="reference", batch=2, heads_q=heads[0], heads_kv=heads[1],
                               seqlen_q=lens[0], seqlen_kv=lens[1], head_dim=8, mask=mask,
                               bias=bias, dropout=dropout, softcap=softcap, **window))
    spec = AttnSpec.from_case(case)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, heads[0], lens[0], 8, generator=gen, dtype=F64, requires_grad=True)
    k = torch.randn(2, heads[1], lens[1], 8, generator=gen, dtype=F64, requires_grad=True)
    v = torch.randn(2, heads[1], lens[1], 8, generator=gen, dtype=F64, requires_grad=True)
    dout = torch.randn(2, heads[0], lens[0], 8, generator=gen, dtype=F64)
    expected = dense_attention(q, k, v, spec)
    grads = torch.autograd.grad(expected, (q, k, v), dout)
    out, lse = reference_forward(q, k, v, spec, keep_mask=hash_keep_mask)
    got = reference_backward(q, k, v, out, lse, dout, spec, keep_mask=hash_keep_mask)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    for g, e in zip(got, grads):
        torch.testing.assert_close(g, e, rtol=1e-11, atol=1e-11)
    if lens[0] > lens[1] and mask != "none":
        assert torch.isinf(lse).any()  # rows that see no key: out 0, lse -inf
        assert (out[torch.isinf(lse)] == 0).all()


def test_alibi_slopes_follow_the_paper():
    assert alibi_slopes(8) == [2 ** -(i + 1) for i in range(8)]
    six = alibi_slopes(6)  # not a power of two: the 4 slopes of n=4, then
    assert six[:4] == [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8]
    assert six[4:] == [2 ** -1, 2 ** -3]  # every other slope of n=8 (HF/Megatron get_slopes)


def test_dropout_mask_depends_on_global_position_only():
    spec = AttnSpec(scale=1.0, dropout_p=0.3, dropout_seed=7)
    full = hash_keep_mask(spec, torch.arange(2), torch.arange(3), torch.arange(50), torch.arange(60))
    part = hash_keep_mask(spec, torch.arange(1, 2), torch.arange(2, 3), torch.arange(20, 35),
                          torch.arange(40, 60))
    assert torch.equal(full[1:2, 2:3, 20:35, 40:60], part)
    assert abs(full.float().mean().item() - 0.7) < 0.02


MEMORY_SCRIPT = """
import resource, torch, time
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.reference import reference_forward
torch.manual_seed(0)
s = {s}
q, k, v = (torch.randn(1, 1, s, 64) for _ in range(3))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.time()
out, lse = reference_forward(q, k, v, AttnSpec(scale=0.125, seqlen_q_total=s, seqlen_kv_total=s))
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024, time.time() - t)
"""


def test_reference_memory_is_linear_in_sequence_length():
    # 4096 tokens would need a 128 MiB fp64 score matrix; the chunked reference stays near its
    # block size. (The 16384-token figure is in benchmarks/reference_memory.py.)
    proc = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT.format(s=4096)],
                          capture_output=True, text=True, check=True)
    peak_mib = float(proc.stdout.split()[0])
    assert peak_mib < 200, proc.stdout
