"""The fp8 forward of our Triton kernel (``flash_forward_fp8``) against an fp64 reference on the
dequantized inputs, held to a Python model of the same roundings.

The model (:func:`model_forward`, FA3's fp8 precision): fp32 scores of the dequantized values,
online softmax in fp32 over key blocks of the kernel's BLOCK_N, P (relative to the running max)
rounded to v's fp8 grid before P·V, an fp32 accumulator, one rounding of the output. It takes
fp32 dequantized q, k, v: with power-of-two descales (what :func:`attnbench.problem.fp8.quantize`
makes) (q8 * dq)·(k8 * dk) = dq * dk * (q8·k8) exactly, so this is the kernel's arithmetic, not an
approximation of it. The kernel's relative L2 error of ``out`` must be within
``ERROR_RATIO_TOL`` of the model's and the two must be far closer to each other than either is
to fp64.

Tiny shapes and 16 x 16 tiles (16 x 32 on a GPU; the interpreter is slow): multi-block rows, partial
blocks and all three key ranges. Legend: B = batch, Hq / Hkv = heads, Sq / Sk = lengths, D = head
dim.
"""

from __future__ import annotations

import attnbench.kernels  # noqa: F401  (first: TRITON_INTERPRET=1 without a GPU)

import importlib.util
from pathlib import Path

import pytest
import torch

from attnbench.accuracy.fused_baseline import FusedBaseline
from attnbench.backends.triton_backend import flash_params
from attnbench.kernels import flash_fwd
from attnbench.kernels.configs import BlockConfig
from attnbench.kernels.flash_fwd import flash_forward_fp8
from attnbench.kernels.params import is_interpreted
from attnbench.problem.attn_spec import AttnSpec, alibi_slopes
from attnbench.problem.fp8 import FORMATS, Fp8Format, Quantized, quantize
from attnbench.problem.reference import reference_forward

REPO = Path(__file__).resolve().parents[2]
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
INTERPRETED = is_interpreted(flash_fwd._attn_fwd)
# On a GPU an fp8 tl.dot needs K >= 32: P·V's K is BLOCK_N.
TILE = BlockConfig(block_m=16, block_n=16 if INTERPRETED else 32)
E4M3, E5M2 = FORMATS["fp8_e4m3"], FORMATS["fp8_e5m2"]
ERROR_RATIO_TOL = 0.01
"""|err_kernel / err_model - 1| allowed; measured at most 1.2e-4 (docs/fp8.md). P rounded to
the wrong fp8 format moves the error by +83 % (the P-format mutant below)."""
CLOSENESS = 0.05
"""rel L2 (kernel - model) allowed, as a fraction of the model's error against fp64; measured
at most 1.2e-2 (mostly 0: bit for bit)."""


# -- the model ---------------------------------------------------------------------------------
def model_forward(q, k, v, spec: AttnSpec, p_format: Fp8Format, out_dtype: torch.dtype,
                  block_n: int = TILE.block_n):
    """fp32 q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv) holding the dequantized
    values. Returns out (B, Hq, Sq, Dv) in ``out_dtype`` and lse (B, Hq, Sq) fp32: the fused
    fp8 model (FA3's roundings, P pre-scaled by P_PRESCALE) with the kernel's key tile."""
    return FusedBaseline(block_k=block_n, p_format=p_format, out_dtype=out_dtype).forward(
        q, k, v, spec)


# -- inputs --------------------------------------------------------------------------------------
def quantize_grouped(q: torch.Tensor, heads_kv: int, fmt: Fp8Format, per_head: bool) -> Quantized:
    """q (B, Hq, Sq, D) quantized with one factor per (batch row, kv head): the query heads of a
    GQA group share their kv head's descale (FA3's layout)."""
    b, hq, sq, d = q.shape
    grouped = quantize(q.reshape(b, heads_kv, (hq // heads_kv) * sq, d), fmt, per_head=per_head)
    return Quantized(grouped.values.reshape(b, hq, sq, d), grouped.descale)


def make_fp8(b, hq, hkv, sq, sk, d, fmt, per_head, dv=None, seed=0, loud_head=True):
    """fp8 q, k, v and their (B, Hkv) descales. ``loud_head``: the last kv head's values (and
    its query heads) 16x louder and its keys 16x quieter, the second batch row scaled too, so
    per-head descales differ between kv heads and batch rows."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, sq, d, generator=gen)
    k = torch.randn(b, hkv, sk, d, generator=gen)
    v = torch.randn(b, hkv, sk, dv or d, generator=gen)
    if loud_head:  # q up, k down by the same factor: the same scores, other descales
        q[:, hq - hq // hkv:] *= 16
        k[:, -1] /= 16
        v[:, -1] *= 16
        q[1:] *= 2
        k[1:] /= 2
        v[1:] /= 4
    quant = (quantize_grouped(q, hkv, fmt, per_head), quantize(k, fmt, per_head),
             quantize(v, fmt, per_head))
    return [Quantized(x.values, torch.broadcast_to(x.descale, (b, hkv)).contiguous())
            for x in quant]


def dequantized(x: Quantized) -> torch.Tensor:
    """fp64 real values of a (B, H, S, D) tensor whose descale is (B, Hkv): query heads use
    their kv head's factor."""
    descale = x.descale.double()
    return x.values.double() * descale.repeat_interleave(
        x.values.shape[1] // descale.shape[1], 1)[..., None, None]


def make_spec(sq, sk, d, hq, *, mask="none", window=(-1, -1), alibi=False, softcap=0.0,
              **extra) -> AttnSpec:
    left, right = {"none": (-1, -1), "causal": (-1, 0), "window": window}[mask]
    return AttnSpec(scale=d ** -0.5, window_left=left, window_right=right, softcap=softcap,
                    alibi_slopes=tuple(alibi_slopes(hq)) if alibi else None,
                    seqlen_q_total=sq, seqlen_kv_total=sk, **extra)


def rel_l2(x, ref):
    x, ref = x.double().cpu(), ref.double().cpu()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def run_kernel(qkv, spec, out_dtype=torch.bfloat16, descales=None):
    q, k, v = qkv
    descales = descales or (q.descale, k.descale, v.descale)
    return flash_forward_fp8(q.values.to(DEVICE), k.values.to(DEVICE), v.values.to(DEVICE),
                             flash_params(spec), *(d.to(DEVICE) for d in descales),
                             out_dtype=out_dtype, config=TILE)


def errors(qkv, spec, fmt, out_dtype=torch.bfloat16, deq=None):
    """(kernel's error, model's error, kernel vs model), all rel L2 of ``out``; asserts lse
    and the rows that see no key. ``deq``: the fp64 real values when the descales are not
    (B, H) per-head factors (packed per-sequence descales)."""
    deq = deq or [dequantized(x) for x in qkv]
    ref_out, ref_lse = reference_forward(*deq, spec)
    out, lse = run_kernel(qkv, spec, out_dtype)
    model_out, _ = model_forward(*(x.float() for x in deq), spec, fmt, out_dtype)
    assert out.dtype == out_dtype and torch.isfinite(out).all()
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse).cpu(), seen), "lse is -inf exactly where no key is seen"
    assert (lse.double().cpu()[seen] - ref_lse[seen]).abs().max().item() < 1e-4
    assert torch.all(out.cpu()[~seen] == 0)
    return rel_l2(out, ref_out), rel_l2(model_out, ref_out), rel_l2(out, model_out)


def assert_like_model(err, err_model, gap):
    assert abs(err / err_model - 1) < ERROR_RATIO_TOL, (err, err_model)
    assert gap < CLOSENESS * err_model, (gap, err_model)


# -- against fp64, held to the model -------------------------------------------------------------
# (name, format, per-head descales, B, Hq, Hkv, Sq, Sk, D, spec options)
SCENARIOS = [
    ("e4m3-tensor-mha", E4M3, False, 1, 2, 2, 48, 48, 32, {}),
    ("e5m2-tensor-mha", E5M2, False, 1, 2, 2, 48, 48, 32, {}),
    ("e4m3-head-gqa-causal-sq<sk", E4M3, True, 2, 4, 2, 29, 45, 16, dict(mask="causal")),
    ("e5m2-head-gqa-causal-sq<sk", E5M2, True, 2, 4, 2, 29, 45, 16, dict(mask="causal")),
    ("e4m3-head-window-sq>sk", E4M3, True, 1, 4, 2, 45, 37, 16,
     dict(mask="window", window=(9, 4))),
    ("e4m3-head-gqa-alibi-causal", E4M3, True, 1, 4, 2, 40, 40, 16,
     dict(mask="causal", alibi=True)),
    ("e5m2-tensor-softcap", E5M2, False, 1, 2, 1, 40, 40, 16, dict(softcap=5.0)),
    ("e4m3-head-everything", E4M3, True, 2, 4, 2, 37, 45, 16,
     dict(mask="window", window=(11, 2), alibi=True, softcap=8.0)),
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_fp8_forward_matches_model(scenario):
    _, fmt, per_head, b, hq, hkv, sq, sk, d, options = scenario
    qkv = make_fp8(b, hq, hkv, sq, sk, d, fmt, per_head)
    if per_head:  # really one factor per kv head (and per batch row)
        assert len(set(qkv[1].descale.flatten().tolist())) == b * hkv
    assert_like_model(*errors(qkv, make_spec(sq, sk, d, hq, **options), fmt))


def test_rows_that_see_no_key():
    """Causal, Sq > Sk, bottom-right: the first Sq - Sk queries see no key: out 0, lse -inf."""
    sq, sk = 40, 19
    qkv = make_fp8(1, 2, 1, sq, sk, 16, E4M3, True)
    spec = make_spec(sq, sk, 16, 2, mask="causal", alibi=True)
    assert_like_model(*errors(qkv, spec, E4M3))
    out, lse = run_kernel(qkv, spec)
    assert torch.all(out[:, :, :sq - sk] == 0) and torch.all(lse[:, :, :sq - sk] == float("-inf"))
    assert torch.isfinite(lse[:, :, sq - sk:]).all()


@pytest.mark.parametrize("fmt,per_sequence", [(E4M3, False), (E5M2, True)])
def test_packed_varlen(fmt, per_sequence):
    """Three sequences in one (1, H, T, D) buffer (one shorter than a tile, Sq != Sk both ways,
    causal: rows that see no key). Descales (1, Hkv), or one row per sequence and kv head
    (FA3's varlen layout: (number of sequences, Hkv))."""
    lens_q, lens_k = (5, 30, 12), (9, 21, 12)
    cu_q = tuple(sum(lens_q[:i]) for i in range(4))
    cu_k = tuple(sum(lens_k[:i]) for i in range(4))
    spec = make_spec(cu_q[-1], cu_k[-1], 16, 4, mask="causal", alibi=True, cu_seqlens_q=cu_q,
                     cu_seqlens_kv=cu_k)
    qkv = make_fp8(1, 4, 2, cu_q[-1], cu_k[-1], 16, fmt, True)
    deq = None
    if per_sequence:  # k's sequences get factors 1, 1/4, 2 on top of the per-head ones
        q, k, v = qkv
        factors = torch.tensor([1.0, 0.25, 2.0])
        per_token = factors.repeat_interleave(torch.tensor(lens_k))
        qkv = [q, Quantized(k.values, k.descale * factors[:, None]), v]
        deq = [dequantized(q),
               dequantized(k) * per_token.double()[:, None],
               dequantized(v)]
    assert_like_model(*errors(qkv, spec, fmt, deq=deq))


def test_non_power_of_two_descales():
    """Any float factor works (FA3's descales are arbitrary): the fold into the scale and the
    final multiply cost no more than fp32 roundings."""
    qkv = make_fp8(1, 4, 2, 32, 32, 16, E4M3, True)
    odd = [Quantized(x.values, x.descale * f) for x, f in zip(qkv, (0.37, 1.9, 0.61))]
    assert_like_model(*errors(odd, make_spec(32, 32, 16, 4, mask="causal"), E4M3))


# -- on a GPU: the tile the sweeps time ---------------------------------------------------------
PRODUCTION_LENGTH = 8192
"""Keys of the production-tile test: 128 key blocks of 64 per row at the end of a causal 8k
(the accumulator operand of P·V is carried through all of them), fp64 reference on the GPU in
well under a second."""


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETED or not torch.cuda.is_available(),
                    reason="needs a CUDA device and compiled kernels (TRITON_INTERPRET unset or 0)")
@pytest.mark.parametrize("promote", [0, 256], ids=["triton-default", "promoted-per-key-block"])
@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_gpu_production_tile_matches_model(monkeypatch, fmt, promote):
    """The pinned tile the fp8 sweeps time (128 x 64, 8 warps: wgmma on sm_90, where the 16-row
    tiles above run mma.sync) over 8k causal keys, held to the same model and bounds. Triton's
    sm_90 default sums P·V into the running accumulator at the tensor cores' reduced precision
    over the whole key loop (``triton-default``); ``promoted-per-key-block`` adds each key
    block's P·V to it in fp32 (max_num_imprecise_acc). If only the first fails, that is the
    finding: make promotion the default and time its cost (docs/fp8.md)."""
    from attnbench.kernels.compile_watch import CompileWatch
    from attnbench.kernels.configs import PINNED_REFERENCE
    from attnbench.resources import ENV_FP8_MAX_IMPRECISE_ACC, ENV_KERNEL_CONFIGS

    monkeypatch.setenv(ENV_KERNEL_CONFIGS, "pinned")
    monkeypatch.setenv(ENV_FP8_MAX_IMPRECISE_ACC, str(promote))
    n, d = PRODUCTION_LENGTH, 128
    qkv = make_fp8(1, 4, 2, n, n, d, fmt, per_head=True)
    spec = make_spec(n, n, d, 4, mask="causal")
    deq = [dequantized(x).to(DEVICE) for x in qkv]
    ref_out, _ = reference_forward(*deq, spec)
    with CompileWatch() as watch:
        out, _ = flash_forward_fp8(*(x.values.to(DEVICE) for x in qkv), flash_params(spec),
                                   *(x.descale.to(DEVICE) for x in qkv))
    tile = PINNED_REFERENCE["fwd"]
    assert watch.configs["_attn_fwd"] == tile.to_dict()
    model_out, _ = model_forward(*(x.float() for x in deq), spec, fmt, torch.bfloat16,
                                 block_n=tile.block_n)
    assert_like_model(rel_l2(out, ref_out), rel_l2(model_out, ref_out), rel_l2(out, model_out))


def test_bf16_output_is_rounded_to_nearest():
    """out in bf16 equals the fp32 out of the same kernel rounded by torch, bit for bit: the
    interpreter's truncating cast is worked around (round_to_grid), a GPU rounds natively."""
    qkv = make_fp8(1, 2, 2, 32, 32, 16, E4M3, False)
    spec = make_spec(32, 32, 16, 2)
    out16, lse16 = run_kernel(qkv, spec, torch.bfloat16)
    out32, lse32 = run_kernel(qkv, spec, torch.float32)
    assert torch.equal(out16, out32.to(torch.bfloat16)) and torch.equal(lse16, lse32)
    half, _ = run_kernel(qkv, spec, torch.float16)
    assert torch.equal(half, out32.to(torch.float16))


# -- mutants: the bound must catch these bugs ----------------------------------------------------
# (name, how the kernel is given the bug, required error / bound): descale bugs are passed in as
# the descales a buggy kernel would use; the P-format bug is the kernel itself with its P grid
# constexprs swapped. Measured margins in docs/fp8.md.
MUTANTS = [("descale_v twice", 10.0), ("descale_k of the other kv head", 10.0),
           ("P on the e5m2 grid with e4m3 inputs", 1.3)]


def run_p_format_mutant(qkv, spec, fmt: Fp8Format):
    out, lse, args = flash_fwd.forward_args(
        *(x.values.to(DEVICE) for x in qkv), flash_params(spec), interpreted=INTERPRETED,
        descales=tuple(x.descale.to(DEVICE) for x in qkv), out_dtype=torch.bfloat16)
    args.update(P_MANT=fmt.mantissa_bits, P_MIN_EXP=fmt.min_normal_exp, P_MAX=fmt.max_finite)
    flash_fwd._launch(args, flash_params(spec), qkv[0].values, INTERPRETED, TILE)
    return out


@pytest.mark.parametrize("mutant,margin", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_mutants_are_caught(mutant, margin):
    qkv = make_fp8(1, 4, 2, 32, 32, 16, E4M3, True)
    spec = make_spec(32, 32, 16, 4, mask="causal")
    deq = [dequantized(x) for x in qkv]
    ref, _ = reference_forward(*deq, spec)
    model, _ = model_forward(*(x.float() for x in deq), spec, E4M3, torch.bfloat16)
    bound = rel_l2(model, ref) * (1 + ERROR_RATIO_TOL)
    dq, dk, dv = (x.descale for x in qkv)
    if mutant == "descale_v twice":
        out, _ = run_kernel(qkv, spec, descales=(dq, dk, dv * dv))
    elif mutant == "descale_k of the other kv head":
        out, _ = run_kernel(qkv, spec, descales=(dq, dk.flip(1), dv))
    else:
        out = run_p_format_mutant(qkv, spec, E5M2)
    err = rel_l2(out, ref)
    assert err > margin * bound, (mutant, err, bound)


# -- refusals ------------------------------------------------------------------------------------
def test_refusals():
    q, k, v = make_fp8(1, 2, 1, 16, 16, 16, E4M3, False)
    params = flash_params(make_spec(16, 16, 16, 2))
    args = (q.values, k.values, v.values)
    descales = (q.descale, k.descale, v.descale)
    with pytest.raises(ValueError, match="dropout"):
        flash_forward_fp8(*args, flash_params(make_spec(16, 16, 16, 2, dropout_p=0.1)),
                          *descales)
    with pytest.raises(ValueError, match="all be float8_e4m3fn or all float8_e5m2"):
        flash_forward_fp8(q.values, k.values, v.values.to(torch.float8_e5m2), params, *descales)
    with pytest.raises(ValueError, match="must all be float8"):
        flash_forward_fp8(*(x.float() for x in args), params, *descales)
    with pytest.raises(ValueError, match="descale_k: shape"):
        flash_forward_fp8(*args, params, q.descale, torch.ones(3, 2), v.descale)
    with pytest.raises(ValueError, match="out_dtype"):
        flash_forward_fp8(*args, params, *descales, out_dtype=torch.float8_e4m3fn)


def test_old_gpus_get_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    with pytest.raises(RuntimeError, match=r"compute capability >= 8.9.*A100 is 8.0"):
        flash_fwd.check_fp8_device(torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    flash_fwd.check_fp8_device(torch.device("cuda", 0))  # Ada: fine
    flash_fwd.check_fp8_device(torch.device("cpu"))  # the interpreter: fine


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without GPU")
def test_benchmark_says_it_needs_a_gpu(capsys):
    spec = importlib.util.spec_from_file_location("bench_fp8", REPO / "benchmarks" / "bench_fp8.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.run(bench.parse_args([])) == 2
    err = capsys.readouterr().err
    assert "no GPU" in err and "8.9" in err, err
