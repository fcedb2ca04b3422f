"""Input distributions (attnbench.problem.inputs): what each kind changes, and only that."""

from __future__ import annotations

import torch

from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.inputs import SHIFTED_V_MEAN, make_fp8_inputs, make_inputs
from attnbench.problem.reference import reference_forward
from attnbench.sweep.case import make_case

BASE = dict(backend="naive", batch=2, seqlen_q=96, heads_q=4, heads_kv=2, head_dim=32,
            dtype="fp32")


def test_shifted_v_moves_v_alone_and_every_output_row_to_its_mean():
    """V ~ N(1, 1): q, k and dout are normal's draws bit for bit, v is normal's plus the mean,
    so every output row (a convex mix of V's rows) averages near 1, not 0."""
    normal = make_inputs(make_case("t", BASE))
    shifted = make_inputs(make_case("t", dict(BASE, inputs="shifted_v")))
    for name, a, b in zip(("q", "k", "dout"), normal[:2] + normal[3:], shifted[:2] + shifted[3:]):
        assert torch.equal(a, b), name
    assert torch.equal(shifted[2], normal[2] + SHIFTED_V_MEAN)
    out, _ = reference_forward(*shifted[:3], AttnSpec.from_case(make_case("t", BASE)))
    assert 0.8 < out.mean() < 1.2 and out.mean(-1).min() > 0.3  # each row's mean
    out0, _ = reference_forward(*normal[:3], AttnSpec.from_case(make_case("t", BASE)))
    assert out0.abs().mean() < 0.3


def test_shifted_v_keeps_vs_fp8_scale_within_a_binade():
    """The fp8 descale of v moves by at most 2x (amax ~4.5 -> ~5.5), so fp8 cases judge the same
    quantization grid with values off zero."""
    fp8 = dict(BASE, dtype="fp8_e4m3")
    normal = make_fp8_inputs(make_case("t", fp8)).v.descale
    shifted = make_fp8_inputs(make_case("t", dict(fp8, inputs="shifted_v"))).v.descale
    assert torch.all(shifted / normal <= 2.0) and torch.all(shifted >= normal)


def test_a_sink_skips_documents_without_keys():
    case = make_case("t", dict(BASE, seqlens_q=[30, 0, 20], seqlens_kv=[40, 9, 0],
                               inputs="sink", batch=1, seqlen_q=50))
    q, k, v, dout = make_inputs(case)
    assert k.shape[2] == 49 and torch.isfinite(k).all()


def test_huge_tensors_are_drawn_in_seeded_chunks_on_threads(monkeypatch):
    """Issue 43 item 5: a 1M-key cache (2.1G values) was one generator's ~15 s per step. Past
    CHUNKED_DRAW values a tensor is drawn in chunks with their own seeds, in threads: the same
    values whatever the thread count, standard normal, different per tensor and seed; below
    it, the one generator's stream as before (every existing case's inputs unchanged)."""
    from attnbench.problem import inputs

    monkeypatch.setattr(inputs, "CHUNKED_DRAW", 1000)
    monkeypatch.setattr(inputs, "DRAW_CHUNK", 256)
    shape = (2, 3, 50, 16)  # 4800 values: 19 chunks, the last one short
    draws = []
    for threads in (1, 4):
        monkeypatch.setattr(inputs, "DRAW_THREADS", threads)
        draws.append(inputs._randn(shape, torch.Generator().manual_seed(0), 7, "k"))
    assert torch.equal(*draws) and draws[0].shape == shape
    assert abs(float(draws[0].mean())) < 0.1 and abs(float(draws[0].std()) - 1) < 0.1
    other = inputs._randn(shape, torch.Generator().manual_seed(0), 7, "v")
    reseeded = inputs._randn(shape, torch.Generator().manual_seed(0), 8, "k")
    assert not torch.equal(draws[0], other) and not torch.equal(draws[0], reseeded)
    small = inputs._randn((10, 10), torch.Generator().manual_seed(3), 3, "q")
    assert torch.equal(small, torch.randn((10, 10), generator=torch.Generator().manual_seed(3)))
