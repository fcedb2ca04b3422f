"""fp8 cases end to end on CPU: the case rules, the quantized inputs and their descales, the
fused fp8 baseline, records with the quantization / kernel split, and the fp8 mutants.

Legend: B = batch, Hq / Hkv = heads, S = length, D = head dim. Shapes stay tiny.
"""

from __future__ import annotations

import pytest
import torch

from attnbench.accuracy.bounds import tensor_errors
from attnbench.accuracy.fused_baseline import FusedBaseline
from attnbench.errors import SweepError
from attnbench.execution.case_runner import run_case
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.fp8 import FORMATS, dequantize_call, round_to_fp8, with_descales
from attnbench.problem.inputs import make_fp8_inputs
from attnbench.problem.reference import reference_forward
from attnbench.results.schema import check_record
from attnbench.sweep.case import make_case
from attnbench.sweep.flops import case_bytes
from attnbench.sweep.load import parse_sweep
from attnbench.sweep.options import RunOptions, TimingOptions

NO_TIMING = RunOptions(timeout_s=120, timing=TimingOptions(enabled=False))
FP8 = dict(batch=2, seqlen_q=64, heads_q=4, heads_kv=2, head_dim=32, dtype="fp8_e4m3")


def _sweep(fields: str) -> str:
    return f"name: t\ndefaults: {{backend: naive, heads_q: 4, head_dim: 32}}\naxes: {{{fields}}}\n"


@pytest.mark.parametrize("fields, expected", [
    ("dtype: [fp8_e4m3], backward: [true]", "backward: got True, expected false for an fp8 case"),
    ("dtype: [fp8_e5m2], cp: [2]", "cp: got 2, expected 1 for an fp8 case (fp8 cases run on one"),
    ("dtype: [fp8_e4m3], dropout: [0.1]", "dropout: got 0.1, expected 0.0 for an fp8 case"),
    ("dtype: [bf16], fp8_scaling: [head]", "fp8_scaling: got 'head', expected tensor (the "
     "default) unless dtype is one of fp8_e4m3, fp8_e5m2"),
    ("dtype: [fp8], seqlen_q: [8]", "dtype"),
    ("dtype: [fp8_e4m3], fp8_scaling: [row]", "fp8_scaling"),
])
def test_fp8_case_rules_name_the_field(fields, expected):
    with pytest.raises(SweepError) as err:
        parse_sweep(_sweep(fields), "t.yaml")
    assert expected in str(err.value), str(err.value)


def test_fp8_cases_are_forward_only_and_keep_other_ids():
    sweep = parse_sweep(_sweep("dtype: [float8_e4m3fn, bf16]"), "t.yaml")
    fp8, bf16 = sweep.cases
    assert fp8.dtype == "fp8_e4m3" and not fp8.backward and bf16.backward
    assert "fp8_scaling" not in bf16.to_dict() or bf16.id == make_case("t", dict(
        backend="naive", heads_q=4, head_dim=32, dtype="bf16")).id
    # inputs 1 byte, output bf16: the forward's minimal traffic
    case = make_case("t", dict(backend="naive", **FP8))
    q = 2 * 4 * 64 * 32
    kv = 2 * 2 * 64 * 32
    assert case_bytes(case)[0] == (q + 2 * kv) * 1 + q * 2 + 2 * 4 * 64 * 4


@pytest.mark.parametrize("scaling", ["tensor", "head"])
def test_quantized_inputs_and_descales(scaling):
    case = make_case("t", dict(backend="naive", **FP8, fp8_scaling=scaling, inputs="loud_heads"))
    fp8 = make_fp8_inputs(case)
    assert fp8.q.values.dtype == torch.float8_e4m3fn
    assert fp8.q.descale.shape == ((2, 2) if scaling == "head" else (1, 1))
    spec = with_descales(AttnSpec.from_case(case), fp8.q, fp8.k, fp8.v, case.dtype)
    q, k, v = dequantize_call(*fp8.tensors[:3], spec, torch.float64)
    assert torch.equal(q, fp8.q.dequantized()) and torch.equal(v, fp8.v.dequantized())
    # per-head scales follow the heads' sizes (loud_heads: x1/2, x1, x2 by head)
    if scaling == "head":
        assert fp8.k.descale[0, 1] > fp8.k.descale[0, 0]
    for deq, original in zip(fp8.dequantized(), fp8.originals):
        assert tensor_errors(deq, original)["rel_l2"] < FORMATS["fp8_e4m3"].eps


def test_fused_fp8_baseline_rounds_p_to_the_format():
    """P in e4m3 before P·V costs far more than bf16 P: the baseline's error is the fp8 one."""
    case = make_case("t", dict(backend="naive", **FP8))
    fp8 = make_fp8_inputs(case)
    spec = with_descales(AttnSpec.from_case(case), fp8.q, fp8.k, fp8.v, case.dtype)
    q, k, v = dequantize_call(*fp8.tensors[:3], spec, torch.float32)
    exact, _ = reference_forward(q.double(), k.double(), v.double(), spec)
    errors = {}
    for name, fmt in (("e4m3", FORMATS["fp8_e4m3"]), ("e5m2", FORMATS["fp8_e5m2"]), ("bf16", None)):
        baseline = FusedBaseline(p_format=fmt, out_dtype=torch.bfloat16)
        out, _ = baseline.forward(q, k, v, spec)
        assert out.dtype == torch.bfloat16
        errors[name] = tensor_errors(out, exact)["rel_l2"]
    assert errors["bf16"] < errors["e4m3"] < errors["e5m2"], errors
    assert torch.equal(round_to_fp8(torch.tensor([0.3]), FORMATS["fp8_e4m3"]),
                       torch.tensor([0.3125]))


@pytest.mark.parametrize("backend", ["naive", "reference", "mutant.fused_base"])
def test_fp8_records_split_quantization_from_kernel_error(backend):
    case = make_case("t", dict(backend=backend, **FP8, mask="causal", fp8_scaling="head",
                               inputs="loud_heads"))
    record = run_case(case, NO_TIMING)
    check_record("r", record)
    assert record["verdict"] == "pass", record["reason"]
    split = record["accuracy"]["fp8"]
    assert record["accuracy"]["backward"].startswith("not applicable")
    assert split["kernel_rel_l2"] == record["accuracy"]["tensors"]["out"]["rel_l2"]
    # quantizing q, k, v to e4m3 costs several times what the computation does
    assert split["quantization_rel_l2"] > 3 * split["kernel_rel_l2"]
    assert abs(split["end_to_end_rel_l2"] - split["quantization_rel_l2"]) < split["kernel_rel_l2"] * 2
    assert set(split["inputs"]) == {"q", "k", "v"}


def test_backends_without_fp8_say_so():
    record = run_case(make_case("t", dict(backend="sdpa", **FP8)), NO_TIMING)
    assert record["verdict"] == "unsupported"
    assert "no fp8 path" in record["reason"]


@pytest.mark.parametrize("mutant, fields", [
    ("mutant.fp8_descale_v_twice", {}),
    ("mutant.fp8_descale_k_by_query_head", dict(fp8_scaling="head", inputs="loud_heads")),
])
def test_fp8_mutants_are_caught(mutant, fields):
    case = make_case("t", dict(backend=mutant, **FP8, **fields))
    record = run_case(case, NO_TIMING)
    assert record["verdict"] == "fail", record["reason"]
    out = record["accuracy"]["tensors"]["out"]
    assert out["rel_l2"] > 5 * out["bound"]


def test_kv_apart_gives_k_and_v_descales_apart():
    """Normal inputs give K and V the same per-tensor power-of-two scale (a swapped pair is
    invisible); kv_apart's v is 4x k, so its descale is 4x k's; per head, every v descale is
    at least 2x its k's (amax of each head's draws varies: one binade of slack)."""
    def descales(inputs, scaling):
        fp8 = make_fp8_inputs(make_case("t", dict(backend="naive", **FP8, inputs=inputs,
                                                  fp8_scaling=scaling)))
        return fp8.k.descale, fp8.v.descale
    k, v = descales("normal", "tensor")
    assert torch.equal(v, k)
    k, v = descales("kv_apart", "tensor")
    assert torch.equal(v, 4 * k)
    k, v = descales("kv_apart", "head")
    assert bool((v >= 2 * k).all()), (k, v)


@pytest.mark.parametrize("inputs, verdict, margin", [("normal", "pass", None),
                                                     ("kv_apart", "fail", 10.0)])
def test_swapped_k_v_descales_hide_under_normal_inputs_and_show_under_kv_apart(inputs, verdict,
                                                                              margin):
    """Per-tensor scaling, the mutant's out rel_l2 over its bound: 0.50 under normal inputs
    (K and V share a scale: it is the correct kernel, bit for bit), 16.6 under kv_apart
    (scores / 4, out x 4) -- measured, seed 0."""
    case = make_case("t", dict(backend="mutant.fp8_descale_kv_swapped", **FP8, inputs=inputs))
    record = run_case(case, NO_TIMING)
    out = record["accuracy"]["tensors"]["out"]
    assert record["verdict"] == verdict, record["reason"]
    if margin:
        assert out["rel_l2"] > margin * out["bound"]


def test_descale_by_query_head_hides_under_per_tensor_scaling():
    """Why the sweep has per-head, loud-head cases: with one descale the bug is invisible."""
    case = make_case("t", dict(backend="mutant.fp8_descale_k_by_query_head", **FP8))
    assert run_case(case, NO_TIMING)["verdict"] == "pass"


def test_fp8_panel_splits_the_error_and_pairs_fp8_with_bf16(tmp_path):
    from attnbench.report.page.dashboard import load_dashboard
    from attnbench.report.read.reader import run_of_records
    from attnbench.report.page.figures import Context
    from attnbench.report.page.panels import draw_panel
    from attnbench.report.page.panels.fp8 import speedups
    from helpers import ROOT

    one_sample = RunOptions(timeout_s=120, timing=TimingOptions(
        warmup=0, warmup_ms=0, min_samples=1, max_samples=1, max_seconds=0.2))
    records = [run_case(make_case("t", dict(backend="naive", **{**FP8, "dtype": dtype})),
                        one_sample) for dtype in ("fp8_e4m3", "fp8_e5m2", "bf16")]
    run = run_of_records(tmp_path, {"run_id": "t"}, records, "t")
    assert run.frame.fp8_quantization_rel_l2.notna().sum() == 2
    pairs = speedups(run.frame)
    assert sorted(pairs.dtype) == ["fp8_e4m3", "fp8_e5m2"] and (pairs.speedup > 0).all()
    panel = next(p for p in load_dashboard(ROOT / "dashboards" / "default.yaml").panels
                 if p.kind == "fp8")
    out = draw_panel(panel, run, Context(out_dir=tmp_path))
    assert [f.png.name for f in out.figures] == [f"p{panel.index:02d}-fp8-cpu.png"], out.notes
    svg = (tmp_path / f"p{panel.index:02d}-fp8-cpu.svg").read_text()
    assert "quantization error" in svg and "speed-up over bf16" in svg


def test_flash_attn3_adapter_hands_fa3_its_fp8_layout(monkeypatch):
    """FA3 is not installed here: a stand-in with FA3's signature checks what the adapter
    passes (e4m3 (B, S, H, D), float32 (B, Hkv) descales) and computes exact attention from it."""
    import sys
    import types

    from attnbench.backends.flash_attn3 import FlashAttn3Backend

    seen = {}

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, q_descale=None,
                        k_descale=None, v_descale=None, window_size=(-1, -1), softcap=0.0):
        seen.update(dtype=q.dtype, shapes=(q.shape, q_descale.shape, k_descale.shape))
        group = q.shape[2] // k.shape[2]
        deq = [x.float().transpose(1, 2) * d.repeat_interleave(g, 1)[..., None, None]
               for x, d, g in ((q, q_descale, group), (k, k_descale, 1), (v, v_descale, 1))]
        spec = AttnSpec(scale=softmax_scale)
        out, lse = reference_forward(*(t.double() for t in deq), spec)
        return out.to(torch.bfloat16).transpose(1, 2), lse

    monkeypatch.setitem(sys.modules, "flash_attn_interface",
                        types.SimpleNamespace(flash_attn_func=flash_attn_func))
    case = make_case("t", dict(backend="flash_attn3", **FP8, fp8_scaling="head",
                               inputs="loud_heads"))
    fp8 = make_fp8_inputs(case)
    spec = with_descales(AttnSpec.from_case(case), fp8.q, fp8.k, fp8.v, case.dtype)
    out = FlashAttn3Backend().forward(*fp8.tensors[:3], spec).out
    assert seen["dtype"] == torch.float8_e4m3fn
    assert seen["shapes"] == ((2, 64, 4, 32), (2, 2), (2, 2))
    exact, _ = reference_forward(*fp8.dequantized(), spec)
    assert out.shape == (2, 4, 64, 32) and tensor_errors(out, exact)["rel_l2"] < 2.0 ** -8


def test_show_lines_give_fp8_throughput_in_tflops_and_the_error_split():
    """A forward-only fp8 case is compute-bound (TFLOP/s, not decode's GB/s), and its line
    says how much of its error is the kernel's."""
    from attnbench.report.show.case_lines import case_lines

    one_sample = RunOptions(timeout_s=120, timing=TimingOptions(
        warmup=0, warmup_ms=0, min_samples=1, max_samples=1, max_seconds=0.2))
    record = run_case(make_case("t", dict(backend="naive", **FP8)), one_sample)
    line = next(case_lines([record]))
    assert "TFLOP/s" in line and "GB/s" not in line
    assert "fp8 error: kernel" in line and "quantization" in line


def test_fp8_gpu_sweep_runs_forwards_only_and_pairs_every_fp8_case_with_bf16():
    """fp8_gpu.yaml timed a bf16 backward beside every bf16 forward that no panel plots (the
    fp8 panel pairs forwards): its bf16 cases are forward only now (mutant: drop ``backward:
    false`` from its defaults -> 40 bf16 cases with a backward). The pairing the panel makes
    (:data:`attnbench.report.page.panels.fp8.PAIR_KEYS`, all but the GPU kind) still finds a bf16
    forward for every fp8 case."""
    from attnbench.backends import check_backend_name
    from attnbench.report.page.panels.fp8 import PAIR_KEYS
    from attnbench.sweep.load import load_sweep
    from helpers import ROOT

    cases = load_sweep(ROOT / "sweeps" / "fp8_gpu.yaml", check_backend_name).cases
    assert [c.label for c in cases if c.backward] == []
    keys = [k for k in PAIR_KEYS if k != "gpu_kind"]  # the worker's, not the case's

    def pair(case):
        return tuple(getattr(case, k) for k in keys)

    bf16 = {pair(c) for c in cases if c.dtype == "bf16"}
    fp8 = [c for c in cases if c.dtype.startswith("fp8")]
    assert len(fp8) > 40 and len(bf16) > 20
    # per-head scaling with loud heads has no bf16 twin (quantization scales are fp8's alone)
    unpaired = [c.label for c in fp8 if pair(c) not in bf16 and c.inputs == "normal"]
    assert unpaired == []
