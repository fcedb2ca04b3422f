"""The fp8 promotion interval: the case field, its way to the kernels, and the model of the sm_90
fp8 tensor cores' 13-bit accumulator (issue 39 item 4).

Legend: B = batch, H = heads, S = length, D = head dim. Shapes stay small: the model is a
blockwise forward in Python loops.
"""

from __future__ import annotations

import os

import pytest
import torch

from attnbench.accuracy.bounds import problem_scale, tensor_errors
from attnbench.accuracy.fp8_accumulation import (TensorCoreAccumulation, modeled_forward,
                                                 truncate_mantissa)
from attnbench.accuracy.fused_baseline import FusedBaseline
from attnbench.errors import SweepError
from attnbench.execution.case_runner import run_case
from attnbench.execution.kernel_settings import kernel_settings
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.fp8 import FORMATS, dequantize_call, output_dtype, with_descales
from attnbench.problem.inputs import make_fp8_inputs
from attnbench.problem.reference import reference_forward
from attnbench.resources import ENV_FP8_MAX_IMPRECISE_ACC
from attnbench.results.schema import check_record
from attnbench.sweep.case import make_case
from attnbench.sweep.load import parse_sweep
from attnbench.sweep.options import RunOptions, TimingOptions

NO_TIMING = RunOptions(timeout_s=120, timing=TimingOptions(enabled=False))


def _sweep(fields: str, options: str = "") -> str:
    return ("name: t\ndefaults: {backend: naive, heads_q: 4, head_dim: 32}\n"
            f"axes: {{{fields}}}\n" + (f"options: {{{options}}}\n" if options else ""))


def test_truncation_keeps_the_top_bits_toward_zero():
    x = torch.tensor([1 + 2 ** -13, 1 + 2 ** -14, -(1 + 2 ** -14), 3.0, 0.0, float("inf")])
    assert truncate_mantissa(x, 13).tolist() == [1 + 2 ** -13, 1.0, -1.0, 3.0, 0.0,
                                                 float("inf")]
    assert torch.equal(truncate_mantissa(x, 23), x)


@pytest.mark.parametrize("fields, expected", [
    ("dtype: [bf16], fp8_promotion: [64]", "fp8_promotion: got 64, expected 0 (the default) "
     "unless dtype is one of fp8_e4m3, fp8_e5m2"),
    ("dtype: [fp8_e4m3], fp8_promotion: [16]", "fp8_promotion: got 16, expected 0 (the "
     "kernel's default) or a power of two in [32, 256]"),
    ("dtype: [fp8_e4m3], fp8_promotion: [48]", "fp8_promotion"),
    ("dtype: [fp8_e4m3], fp8_promotion: [512]", "fp8_promotion"),
])
def test_the_promotion_is_an_fp8_field_of_one_wgmma_or_more(fields, expected):
    with pytest.raises(SweepError) as err:
        parse_sweep(_sweep(fields), "t.yaml")
    assert expected in str(err.value), str(err.value)


def test_both_settings_run_side_by_side_and_the_default_keeps_ids():
    default, promoted = parse_sweep(_sweep("dtype: [fp8_e4m3], fp8_promotion: [0, 64]"),
                                    "t.yaml").cases
    assert default.id != promoted.id and "fp8_promotion" not in default.to_dict() or \
        default.id == make_case("t", dict(backend="naive", heads_q=4, head_dim=32,
                                          dtype="fp8_e4m3")).id
    assert "promote64" in promoted.label and "promote" not in default.label


def test_the_run_wide_option_is_folded_into_the_fp8_cases():
    cases = parse_sweep(_sweep("dtype: [fp8_e4m3, bf16], fp8_promotion: [0]",
                               "fp8_max_imprecise_acc: 128"), "t.yaml").cases
    assert {c.dtype: c.fp8_promotion for c in cases} == {"fp8_e4m3": 128, "bf16": 0}
    named = parse_sweep(_sweep("dtype: [fp8_e4m3], fp8_promotion: [32]",
                               "fp8_max_imprecise_acc: 128"), "t.yaml").cases
    assert [c.fp8_promotion for c in named] == [32]  # the case's own word wins


def test_each_case_sets_the_kernels_variable_for_its_own_duration(monkeypatch):
    monkeypatch.setenv(ENV_FP8_MAX_IMPRECISE_ACC, "0")
    for promotion in (0, 64, 256):
        case = make_case("t", dict(backend="triton", dtype="fp8_e4m3", fp8_promotion=promotion))
        with kernel_settings(NO_TIMING, case):
            assert os.environ[ENV_FP8_MAX_IMPRECISE_ACC] == str(promotion)
        assert os.environ[ENV_FP8_MAX_IMPRECISE_ACC] == "0"


def _problem(keys: int, rows: int = 64, head_dim: int = 64):
    case = make_case("t", dict(backend="naive", dtype="fp8_e4m3", seqlen_q=rows,
                               seqlen_kv=keys, heads_q=1, head_dim=head_dim))
    fp8 = make_fp8_inputs(case, "cpu")
    spec = with_descales(AttnSpec.from_case(case), fp8.q, fp8.k, fp8.v, case.dtype)
    q, k, v, _ = fp8.tensors
    exact = dequantize_call(q, k, v, spec, torch.float64)
    ref, _ = reference_forward(*exact, spec)
    return spec, exact, ref


def _error(out, ref) -> float:
    return tensor_errors(out, ref, problem_scale({"out": ref}))["rel_l2"]


def test_an_accumulator_of_fp32_width_is_the_fused_baseline_bit_for_bit():
    spec, exact, _ = _problem(300)
    base = FusedBaseline(p_format=FORMATS[spec.fp8_format], out_dtype=output_dtype(spec.fp8_format))
    fp32 = tuple(t.to(torch.float32) for t in exact)
    want, _ = base.forward(*fp32, spec)
    for promotion in (0, 32, 64):
        assert torch.equal(modeled_forward(spec, exact, promotion, mantissa_bits=23), want)


def test_the_unpromoted_loss_grows_with_the_keys_and_promotion_removes_it():
    # 8 mantissa bits make the 13-bit effect visible at CPU sizes: the same mechanics, faster.
    ratios = {}
    for keys in (256, 4096):
        spec, exact, ref = _problem(keys)
        fp32 = _error(modeled_forward(spec, exact, 0, mantissa_bits=23), ref)
        ratios[keys] = [_error(modeled_forward(spec, exact, n, mantissa_bits=8), ref) / fp32
                        for n in (0, 32, 64)]
    assert ratios[4096][0] > 1.5 * ratios[256][0] and ratios[4096][0] > 2.0, ratios
    for keys, (_, every_mma, every_block) in ratios.items():
        assert every_mma < 1.2 and every_block < 1.2, ratios  # fp32 adds between partial sums


def test_an_fp8_record_carries_the_model_beside_the_kernel():
    case = make_case("t", dict(backend="naive", batch=1, seqlen_q=64, heads_q=2, heads_kv=1,
                               head_dim=32, dtype="fp8_e4m3", fp8_promotion=64))
    record = run_case(case, NO_TIMING)
    check_record("r", record)
    split = record["accuracy"]["fp8"]
    assert split["promotion"] == 64 and record["verdict"] == "pass", record["reason"]
    # promoted once per key block, 13 bits: the model sits on the fused baseline's error
    baseline = record["accuracy"]["tensors"]["out"]["fused_rel_l2"]
    assert split["accumulation_rel_l2"] == pytest.approx(baseline, rel=0.05)


def test_a_kernel_that_ignores_the_promotion_follows_the_unpromoted_model():
    spec, exact, ref = _problem(2048)
    unpromoted = TensorCoreAccumulation(p_format=FORMATS[spec.fp8_format],
                                        out_dtype=output_dtype(spec.fp8_format), promotion=0,
                                        mantissa_bits=8)
    out, _ = unpromoted.forward(*(t.to(torch.float32) for t in exact), spec)
    modeled = {n: _error(modeled_forward(spec, exact, n, mantissa_bits=8), ref) for n in (0, 64)}
    assert _error(out, ref) == pytest.approx(modeled[0]) and modeled[0] > 1.5 * modeled[64]
