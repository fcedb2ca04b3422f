"""Our Triton kernels on packed batches (cu_seqlens, one launch per kernel): each sequence of
the pack must come out exactly as the same kernels give it alone, and match fp64.

Tiny shapes and 16 x 16 tiles (the interpreter is slow): the pack has a sequence of one token,
sequences shorter than a tile, one spanning several tiles after short ones (offsets of later
sequences), and Sq != Sk both ways (rows that see no key under causal)."""

from __future__ import annotations

import pytest
import torch

import attnbench.kernels  # noqa: F401  (TRITON_INTERPRET=1 without a GPU, before the kernels load)
from attnbench.backends.triton_backend import flash_params, triton_keep_mask
from attnbench.execution.case_runner import run_case
from attnbench.kernels.configs import BlockConfig
from attnbench.kernels.flash_bwd import flash_backward
from attnbench.kernels.flash_fwd import _attn_fwd, flash_forward
from attnbench.kernels.params import is_interpreted
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.inputs import make_inputs
from attnbench.problem.packing import segments, sequence_spec
from attnbench.problem.reference import reference_backward, reference_forward
from attnbench.sweep.case import make_case
from attnbench.sweep.options import RunOptions, TimingOptions

TILE = BlockConfig(block_m=16, block_n=16)
LENGTHS = dict(seqlens_q=[5, 40, 1, 19], seqlens_kv=[9, 17, 3, 19])


def run_kernels(q, k, v, dout, spec):
    params = flash_params(spec)
    out, lse = flash_forward(q, k, v, params, TILE)
    return (out, lse, *flash_backward(q, k, v, out, lse, dout, params, TILE, TILE))


@pytest.mark.parametrize("fields", [
    dict(mask="causal", bias="alibi", dropout=0.2, heads_kv=1, dtype="fp32"),
    dict(mask="window", window_left=4, window_right=2, softcap=5.0, heads_kv=2, dtype="bf16"),
])
def test_packed_kernels_equal_each_sequence_alone_and_match_fp64(fields):
    case = make_case("t", {"backend": "triton", "heads_q": 2, "head_dim": 16, **LENGTHS,
                           **fields})
    spec = AttnSpec.from_case(case)
    q, k, v, dout = make_inputs(case)
    packed = run_kernels(q, k, v, dout, spec)
    for seg in segments(spec.cu_seqlens_q, spec.cu_seqlens_kv):
        rows, keys = slice(seg.q0, seg.q1), slice(seg.k0, seg.k1)
        alone = run_kernels(q[:, :, rows], k[:, :, keys], v[:, :, keys], dout[:, :, rows],
                            sequence_spec(spec, seg))
        for name, whole, part, cut in zip(("out", "lse", "dq", "dk", "dv"), packed, alone,
                                          (rows, rows, rows, keys, keys)):
            assert torch.equal(whole[:, :, cut], part), (name, seg)
    out, lse = reference_forward(q, k, v, spec, triton_keep_mask)
    grads = reference_backward(q, k, v, out, lse, dout, spec, triton_keep_mask)
    bound = 1e-5 if case.dtype == "fp32" else 2e-2
    for name, got, want in zip(("out", "dq", "dk", "dv"), (packed[0], *packed[2:]),
                               (out, *grads)):
        assert ((got.double() - want).norm() / want.norm()).item() < bound, name
    seen = torch.isfinite(lse)
    assert torch.equal(seen, torch.isfinite(packed[1]))  # the same rows see no key
    assert (packed[1].double()[seen] - lse[seen]).abs().max() < 1e-4


# -- on a GPU ------------------------------------------------------------------------------------
HAS_GPU = torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU or is_interpreted(_attn_fwd),
                    reason="needs a CUDA device and compiled kernels (TRITON_INTERPRET unset or 0)")
@pytest.mark.parametrize("backend", ["triton", "flash_attn", "sdpa"])
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_gpu_packed_bf16_passes_harness(backend, mask):
    """The issue's mix on a GPU: every backend passes, or says why it cannot (flash_attn
    absent, sdpa's jagged tensors without causal)."""
    case = make_case("t", {"backend": backend, "seqlens_q": [4096, 1024, 77, 2999],
                           "heads_q": 8, "heads_kv": 8, "head_dim": 128, "mask": mask,
                           "dtype": "bf16"})
    record = run_case(case, RunOptions(timing=TimingOptions(max_seconds=0.5)),
                      device=torch.device("cuda"))
    assert record["verdict"] in ("pass", "unsupported"), record["reason"]
    if backend == "triton":
        assert record["verdict"] == "pass"
