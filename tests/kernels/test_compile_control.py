"""Compile control of our Triton kernels: pinned configs, what the kernels do not specialise
on, compile seconds in records, and the warm API of the pre-warm.

Each test names the bug it catches. The specialisation tests run the JIT's own binder in a
subprocess with TRITON_INTERPRET=0 (no GPU needed: it only reads the arguments); everything
else runs here under the interpreter.
"""

from __future__ import annotations

import attnbench.kernels  # noqa: F401,I001  (first: TRITON_INTERPRET=1 without a GPU)

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import triton

from attnbench.errors import RunDirError, SweepError
from attnbench.execution.case_runner import run_case
from attnbench.kernels import compile_watch, configs, launch, warm
from attnbench.kernels.common import ALIGNMENT_FREE_INTS, RUNTIME_INTS
from attnbench.kernels.configs import BlockConfig
from attnbench.kernels.warm_launch import launch_variant
from attnbench.resources import ENV_FP8_MAX_IMPRECISE_ACC, ENV_KERNEL_CONFIGS
from attnbench.results.schema import check_record
from attnbench.sweep.case import make_case
from attnbench.sweep.load import load_sweep
from attnbench.sweep.options import RunOptions, TimingOptions, parse_options

REPO = Path(__file__).resolve().parents[2]
NO_TIMING = RunOptions(timing=TimingOptions(enabled=False))


# -- pinned configs ----------------------------------------------------------------------------
def _flags(d, precision="tf32"):
    return dict(BLOCK_D=d, BLOCK_DV=d, DOT_PRECISION=precision)


@pytest.mark.parametrize("d", [16, 32, 64, 128])
def test_pinned_configs_are_the_tutorial_tiles_where_they_fit(d):
    """bf16 at the common head dims: the named reference tiles, 3 stages (a rule that drifted
    to another tile, or to 4 stages, which spills 24 B in dK/dV under triton 3.6, fails)."""
    for kind in configs.SPACES:
        assert configs.pinned_config(kind, _flags(d)) == configs.PINNED_REFERENCE[kind]


def test_pinned_configs_fall_back_to_the_leanest_tile_that_survives():
    """fp32 d128 forward: 3 stages of 4-byte K/V tiles overflow shared memory, so the same tile
    with 2 stages; d256: the reference tiles fall, and the fallback keeps the fewest live values
    and stages (compile_check at d256: forward 0 B of spills with 2 stages vs 160 B with 3,
    dK/dV 344 B at 32 x 64 vs 568 B at 64 x 64: the largest-tile rule it replaced lost both)."""
    assert configs.pinned_config("fwd", _flags(128, "ieee")) == BlockConfig(
        block_m=128, block_n=64, num_warps=8, num_stages=2)
    for kind in configs.SPACES:  # every pick comes from the kernel's own tuning space
        for d, precision in ((256, "tf32"), (256, "ieee"), (128, "ieee")):
            pick = configs.pinned_config(kind, _flags(d, precision))
            assert pick in [BlockConfig.of(c) for c in configs.SPACES[kind]], (kind, d, pick)
    assert configs.pinned_config("fwd", _flags(256)) == BlockConfig(
        block_m=64, block_n=64, num_warps=8, num_stages=2)
    assert configs.pinned_config("bwd_dkdv", _flags(256)) == BlockConfig(
        block_m=32, block_n=64, num_warps=8, num_stages=2)


def test_pick_rule_orders_by_live_values_then_tile_then_stages():
    ref = BlockConfig(block_m=128, block_n=64, num_warps=8, num_stages=3)
    space = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
             for m, n, w, s in ((64, 64, 4, 3), (64, 128, 4, 3), (64, 128, 4, 2),
                                (128, 64, 8, 3))]
    per_thread = lambda c: c.block_m * c.block_n / (32 * c.num_warps)  # noqa: E731
    assert configs.pick_tutorial_tile_else_leanest(space, ref, per_thread) == ref
    assert configs.pick_tutorial_tile_else_leanest(space[:3], ref, per_thread) == BlockConfig(
        block_m=64, block_n=64, num_warps=4, num_stages=3)
    assert configs.pick_tutorial_tile_else_leanest(space[1:3], ref, per_thread) == BlockConfig(
        block_m=64, block_n=128, num_warps=4, num_stages=2)


class _Kernel:
    """A stand-in for a JITFunction: records the grid and keywords of each launch."""

    __name__ = "_fake"

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda **kwargs: self.launches.append((grid, kwargs))


class _Tuned:
    """A stand-in for triton.autotune's Autotuner: a cache per key and the config it chose."""

    def __init__(self, tuning_s=0.0):
        self.cache, self.launches, self.tuning_s = {}, [], tuning_s
        self.best_config = triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4,
                                         num_stages=4)

    def __getitem__(self, grid):
        def run(**kwargs):
            time.sleep(self.tuning_s)
            self.cache[len(self.cache)] = self.best_config
            self.launches.append((grid({"BLOCK_M": 64, "BLOCK_N": 32}), kwargs))
        return run


def _launch(monkeypatch, mode, config=None, interpreted=False, tuning_s=0.0):
    monkeypatch.setenv(ENV_KERNEL_CONFIGS, mode)
    kernel, tuned = _Kernel(), _Tuned(tuning_s)
    with compile_watch.CompileWatch() as watch:
        launch.launch_tiled(kernel, tuned, "fwd", lambda m, n: (1000 // m, 8), _flags(128),
                            interpreted=interpreted, config=config,
                            interpreter_config=configs.INTERPRETER_FWD)
    return kernel, tuned, watch


def test_launch_runs_the_pinned_config_and_says_so(monkeypatch):
    """Pinned mode must not autotune (a launcher that ignored the mode would compile every
    config of the space on a fresh GPU), and the record must name the config that ran."""
    kernel, tuned, watch = _launch(monkeypatch, "pinned")
    pinned = configs.PINNED_REFERENCE["fwd"]
    assert tuned.launches == [] and len(kernel.launches) == 1
    grid, kwargs = kernel.launches[0]
    assert grid == (1000 // pinned.block_m, 8)
    assert (kwargs["BLOCK_M"], kwargs["BLOCK_N"], kwargs["num_warps"], kwargs["num_stages"]) \
        == (pinned.block_m, pinned.block_n, pinned.num_warps, pinned.num_stages)
    assert watch.summary()["configs"] == {"_fake": pinned.to_dict()}


def test_launch_autotunes_by_default_and_notes_the_choice_and_its_time(monkeypatch):
    kernel, tuned, watch = _launch(monkeypatch, "autotune", tuning_s=0.05)
    assert kernel.launches == [] and len(tuned.launches) == 1
    assert watch.configs == {"_fake": {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4,
                                       "num_stages": 4}}
    assert 0.04 < watch.autotune_s < 1.0  # the call that filled the autotuner's cache


def test_an_explicit_config_and_the_interpreter_win_over_the_mode(monkeypatch):
    tile = BlockConfig(block_m=16, block_n=16)
    kernel, tuned, _ = _launch(monkeypatch, "pinned", config=tile)
    assert kernel.launches[0][1]["BLOCK_M"] == 16 and not tuned.launches
    kernel, tuned, _ = _launch(monkeypatch, "autotune", interpreted=True)
    assert kernel.launches[0][1]["BLOCK_M"] == configs.INTERPRETER_FWD.block_m
    assert not tuned.launches


def test_a_bad_mode_is_one_line_naming_the_variable(monkeypatch):
    monkeypatch.setenv(ENV_KERNEL_CONFIGS, "pinnned")
    with pytest.raises(ValueError, match=r"^ATTNBENCH_KERNEL_CONFIGS='pinnned': expected one "
                                         r"of autotune, pinned$"):
        configs.kernel_config_mode()


def test_sweep_options_are_checked_where_they_are_written():
    assert parse_options("s.yaml", {"kernel_configs": "pinned"}).kernel_configs == "pinned"
    assert parse_options("s.yaml", {"fp8_max_imprecise_acc": 64}).fp8_max_imprecise_acc == 64
    with pytest.raises(SweepError, match=r"s.yaml: options.kernel_configs: got 'pined', "
                                         r"expected one of autotune, pinned"):
        parse_options("s.yaml", {"kernel_configs": "pined"})
    with pytest.raises(SweepError, match="options.fp8_max_imprecise_acc: got 48"):
        parse_options("s.yaml", {"fp8_max_imprecise_acc": 48})


def test_fp8_promotion_interval_from_the_environment(monkeypatch):
    from attnbench.kernels.fp8 import max_imprecise_acc

    for raw, value in (("", 0), ("0", 0), ("8", 32), ("64", 64), ("1024", 1024)):
        monkeypatch.setenv(ENV_FP8_MAX_IMPRECISE_ACC, raw)
        assert max_imprecise_acc() == value, raw
    monkeypatch.setenv(ENV_FP8_MAX_IMPRECISE_ACC, "48")
    with pytest.raises(ValueError, match="ATTNBENCH_FP8_MAX_IMPRECISE_ACC='48'"):
        max_imprecise_acc()


# -- what the kernels do not specialise on -----------------------------------------------------
_BINDER_SCRIPT = r'''
import json, torch
import attnbench.kernels
from triton.backends.compiler import GPUTarget
from attnbench.kernels.compile_check import specialization
from attnbench.kernels.decode import _decode_split, _merge_splits, decode_args
from attnbench.kernels.dropout import _keep_mask_kernel
from attnbench.kernels.flash_bwd import _bwd_dkdv, _bwd_dq, _bwd_preprocess, backward_args
from attnbench.kernels.flash_fwd import _attn_fwd, forward_args
from attnbench.kernels.params import FlashParams

meta, target = torch.device("meta"), GPUTarget("cuda", 90, 32)
TILE = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)

def flash(s, hq, hkv, **features):
    q = torch.empty(2, hq, s, 128, dtype=torch.bfloat16, device=meta)
    k = torch.empty(2, hkv, s + 5, 128, dtype=torch.bfloat16, device=meta)
    params = FlashParams(sm_scale=0.1, dropout_p=0.1, **features)
    out, lse, fwd = forward_args(q, k, k, params, interpreted=False)
    _, bwd = backward_args(q, k, k, out, lse, out, params, interpreted=False)
    return {"_attn_fwd": dict(fwd, **TILE), "_bwd_preprocess": bwd["preprocess"],
            "_bwd_dkdv": dict(bwd["dkdv"], **TILE), "_bwd_dq": dict(bwd["dq"], **TILE)}

def decode(seqlen_q, hkv, width, splits):
    q = torch.empty(2, 4 * hkv, seqlen_q, 128, dtype=torch.bfloat16, device=meta)
    pool = torch.empty(2 * width, 16, hkv, 128, dtype=torch.bfloat16, device=meta)
    table = torch.empty(2, width, dtype=torch.int32, device=meta)
    launch = decode_args(q, pool, pool, FlashParams(sm_scale=0.1, window_left=9, window_right=0),
                         seqlens_k=torch.empty(2, dtype=torch.int32, device=meta),
                         max_seqlen_k=16 * width, heads_kv=hkv, block_table=table,
                         page_size=16, splits=splits, interpreted=False)
    return {"_decode_split": launch["split"], "_merge_splits": launch["merge"]}

def mask(n_h, n_i, n_j, seed, threshold):
    idx = torch.empty(64, dtype=torch.int32, device=meta)
    return {"_keep_mask_kernel": dict(b_ptr=idx, h_ptr=idx, i_ptr=idx, j_ptr=idx,
        out_ptr=torch.empty(8, dtype=torch.int8, device=meta), n_h=n_h, n_i=n_i, n_j=n_j,
        seed=seed, threshold=threshold, BLOCK_I=128, BLOCK_J=128)}

KERNELS = {k.__name__: k for k in (_attn_fwd, _bwd_preprocess, _bwd_dkdv, _bwd_dq,
                                   _decode_split, _merge_splits, _keep_mask_kernel)}
pairs = {
    # lengths 8192 / 8197 vs 8196 / 8201, heads 16/4 vs 8/2 (both GQA), every offset, seed
    # and window bound different
    "gqa": (flash(8192, 16, 4, window_left=256, window_right=0, dropout_seed=0),
            flash(8196, 8, 2, window_left=1, window_right=16, dropout_seed=17, q_start=3,
                  kv_start=1, head_start=1, batch_start=5, diag=7)),
    "mha vs gqa": (flash(8192, 8, 8), flash(8192, 8, 2)),
    "decode": (decode(1, 8, 4096, 30), decode(2, 16, 4097, 31)),
    "mask": (mask(8, 203, 203, 1234, 214748365), mask(16, 4096, 1, 1, 16)),
}
out = {}
for name, (a, b) in pairs.items():
    for kernel, args in a.items():
        jit = KERNELS[kernel]
        sa = specialization(jit, args, target)
        sb = specialization(jit, b[kernel], target)
        out.setdefault(name, {})[kernel] = [p.name for p, x, y in zip(jit.params, sa, sb) if x != y]
        # the same kernel without its lists: a control that the comparison can see a difference
        plain = type(jit)(jit.fn)
        sa, sb = specialization(plain, args, target), specialization(plain, b[kernel], target)
        out.setdefault(name + " unlisted", {})[kernel] = [
            p.name for p, x, y in zip(plain.params, sa, sb) if x != y]
        ints = [p.name for p in jit.params if not p.is_constexpr
                and type(args[p.name]) is int and not p.name.startswith("stride_")]
        out.setdefault("int arguments", {})[kernel] = ints
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def binder():
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, "-c", _BINDER_SCRIPT], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_lengths_heads_offsets_and_seeds_compile_no_new_kernel(binder):
    """The JIT's own specialisation keys of every kernel are equal for lengths 8192 vs 8196,
    heads 16 vs 8, other offsets, seeds and window bounds; without the do_not_specialize lists
    the same pairs differ (the control), so a dropped or misspelled name fails here."""
    for pair in ("gqa", "decode", "mask"):
        assert binder[pair] == {k: [] for k in binder[pair]}, pair
        assert all(binder[pair + " unlisted"].values()), binder[pair + " unlisted"]


def test_mha_and_gqa_compile_apart_only_on_the_group(binder):
    """group_size keeps its 'equals 1' specialisation (dK/dV's loop over a group spills
    without it) and nothing else tells MHA from GQA."""
    assert binder["mha vs gqa"] == {"_attn_fwd": ["group_size"], "_bwd_preprocess": [],
                                    "_bwd_dkdv": ["group_size"], "_bwd_dq": ["group_size"]}


def test_every_runtime_integer_is_listed(binder):
    """Every integer argument that is not a stride is in its kernel's lists, and every name in
    the lists is a parameter (a new length argument left specialised fails here)."""
    for kernel, ints in binder["int arguments"].items():
        listed = set(RUNTIME_INTS[kernel]) | set(ALIGNMENT_FREE_INTS.get(kernel, ()))
        assert set(ints) <= listed, (kernel, set(ints) - listed)
    from attnbench.kernels import decode, dropout, flash_bwd, flash_fwd

    kernels = {k.__name__: k for k in (flash_fwd._attn_fwd, flash_bwd._bwd_preprocess,
                                       flash_bwd._bwd_dkdv, flash_bwd._bwd_dq,
                                       decode._decode_split, decode._merge_splits,
                                       dropout._keep_mask_kernel)}
    assert set(kernels) == set(RUNTIME_INTS)
    for name, listed in RUNTIME_INTS.items():
        params = set(kernels[name].arg_names)
        assert set(listed) | set(ALIGNMENT_FREE_INTS.get(name, ())) <= params, name


# -- compile seconds -------------------------------------------------------------------------
@pytest.fixture
def fresh_hooks(monkeypatch):
    """Triton's JIT hooks as they were, and our install undone, around a test."""
    from triton import knobs

    monkeypatch.setattr(compile_watch, "_INSTALLED", None)
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", knobs.runtime.jit_cache_hook)
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook",
                        knobs.runtime.jit_post_compile_hook)
    return knobs.runtime


def _compile(runtime, name, seconds, key="k"):
    fn = SimpleNamespace(name=name)
    skipped = runtime.jit_cache_hook(key=key, fn=fn, repr="", compile={},
                                     is_manual_warmup=False, already_compiled=False)
    time.sleep(seconds)
    runtime.jit_post_compile_hook(key=key, fn=fn, repr="", compile={}, is_manual_warmup=False,
                                  already_compiled=False)
    return skipped


def test_compile_seconds_come_from_the_jit_hooks_and_chain(fresh_hooks):
    """Seconds between Triton's before- and after-compile hooks, summed per watch; a hook
    already installed (torch's, a profiler's) still runs and still decides whether Triton
    skips the compile."""
    seen = []
    fresh_hooks.jit_cache_hook = lambda **kw: seen.append(kw["fn"].name) or True
    with compile_watch.CompileWatch() as watch:
        skipped = _compile(fresh_hooks, "_attn_fwd", 0.05)
        _compile(fresh_hooks, "_bwd_dq", 0.02, key="other")
    _compile(fresh_hooks, "_attn_fwd", 0.05, key="after")  # not this watch's
    assert skipped is True and seen == ["_attn_fwd", "_bwd_dq", "_attn_fwd"]
    summary = watch.summary()
    assert summary["kernels"] == 2 and 0.06 < summary["seconds"] < 1.0, summary


def test_without_hooks_the_seconds_are_unknown_not_zero(monkeypatch):
    monkeypatch.setattr(compile_watch, "_install_hooks", lambda: False)
    summary = compile_watch.CompileWatch().start().summary()
    assert summary["seconds"] is None and summary["kernels"] is None and "3.4" in summary["note"]


def test_a_record_says_mode_configs_and_compile_seconds(monkeypatch):
    """A triton case under pinned options: the record's compile section (0 s and 0 kernels
    under the interpreter, which compiles nothing), the tiles each kernel ran, the variant;
    the variables are the sweep's during the case and restored after."""
    monkeypatch.setenv(ENV_KERNEL_CONFIGS, "autotune")
    options = RunOptions(kernel_configs="pinned", timing=TimingOptions(enabled=False))
    case = make_case("t", dict(backend="triton", seqlen_q=64, heads_q=2, head_dim=16,
                               mask="causal", dtype="fp32", dropout=0.1))
    record = run_case(case, options)
    assert record["verdict"] == "pass", record["reason"]
    section = record["compile"]
    assert section["mode"] == "pinned" and section["interpreted"] is True
    assert section["seconds"] == 0 and section["kernels"] == 0
    assert set(section["configs"]) == {"_attn_fwd", "_bwd_preprocess", "_bwd_dkdv", "_bwd_dq",
                                       "_keep_mask_kernel"}
    assert section["configs"]["_attn_fwd"] == configs.INTERPRETER_FWD.to_dict()
    assert section["variant"] == "fp32 d16 mha window dropout fwd+bwd pinned"
    assert os.environ[ENV_KERNEL_CONFIGS] == "autotune"
    check_record("", record)
    assert "compile" not in run_case(make_case("t", dict(backend="naive", seqlen_q=64)),
                                     NO_TIMING)


def test_the_schema_takes_compile_sections_and_names_a_bad_field():
    record = run_case(make_case("t", dict(backend="naive", seqlen_q=32)), NO_TIMING)
    check_record("", record)  # an older record: no compile section
    record["compile"] = {"mode": "pinned", "seconds": "slow", "configs": {}}
    with pytest.raises(RunDirError, match=r"compile.seconds: got 'slow', expected a number"):
        check_record("", record)
    record["compile"] = {"mode": "pinned", "seconds": 1.0, "configs": {"_attn_fwd": 7}}
    with pytest.raises(RunDirError, match=r"compile.configs._attn_fwd: got 7"):
        check_record("", record)


# -- the warm API ------------------------------------------------------------------------------
def _gpu_cases():
    return load_sweep(REPO / "sweeps" / "kernel_gpu.yaml").cases


def test_variants_are_distinct_stable_json_and_length_free():
    """kernel_gpu.yaml: 16k tokens at six lengths, both head dims, both masks -- the triton
    cases are one variant per (head dim, mask); sdpa cases add none; the order of the cases
    changes nothing."""
    cases = _gpu_cases()
    found = warm.variants(cases, "pinned", 0)
    assert found == warm.variants(list(reversed(cases)), "pinned", 0)
    assert json.loads(json.dumps(found)) == found
    triton_cases = [c for c in cases if c.backend == "triton"]
    expected = {(c.head_dim, c.mask) for c in triton_cases}
    assert len(found) == len(expected) and len({c.seqlen_q for c in triton_cases}) == 6
    assert all(v["kernel_configs"] == "pinned" and v["kernels"][:2] == ["_attn_fwd",
                                                                         "_bwd_preprocess"]
               for v in found)
    assert warm.variants([c for c in cases if c.backend != "triton"], "pinned", 0) == []


def test_variants_tell_apart_what_compiles_apart():
    base = dict(backend="triton", seqlen_q=512, heads_q=8, head_dim=64, dtype="bf16")
    cases = [make_case("t", dict(base, **extra)) for extra in (
        {}, {"seqlen_q": 8196, "heads_q": 16}, {"heads_kv": 2}, {"heads_kv": 4},
        {"dtype": "fp16"}, {"head_dim": 128}, {"mask": "causal"}, {"softcap": 30.0},
        {"decode": True, "seqlen_q": 1, "seqlen_kv": 65536, "heads_kv": 2, "page_size": 16,
         "backward": False})]
    found = warm.variants(cases, "autotune", 0)
    labels = sorted(warm.label(v) for v in found)
    assert len(found) == 7, labels  # lengths and heads add none; GQA 2 and 4 are one
    decode = next(v for v in found if "page_size" in v)
    assert decode["kernels"] == ["_decode_split", "_merge_splits"] and decode["group"] == 4
    assert decode["block_s"] & (decode["block_s"] - 1) == 0
    odd = warm.variant_of(make_case("t", dict(base, head_dim=72, seqlen_q=100)))
    assert odd["seqlen_q_mod16"] == 4 and odd["heads_q"] == 8


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer of a machine without CUDA")
def test_compile_variant_without_cuda_compiles_nothing_and_says_so():
    variant = warm.variants(_gpu_cases(), "pinned", 0)[0]
    result = warm.compile_variant(variant)
    assert result["variant"] == variant and result["seconds"] == 0 and result["kernels"] == 0
    assert "no CUDA" in result["note"] and result["configs"] == {}
    proc = subprocess.run([sys.executable, "-m", "attnbench.kernels.warm", json.dumps(variant)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and json.loads(proc.stdout)["kernels"] == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("extra", [
    {"dropout": 0.1, "mask": "causal", "heads_kv": 1},
    {"seqlens_q": [40, 24], "bias": "alibi", "softcap": 5.0},
    {"dtype": "fp8_e4m3", "backward": False, "mask": "causal"},
    {"decode": True, "seqlen_q": 2, "seqlen_kv": 300, "heads_kv": 1, "page_size": 16,
     "backward": False, "mask": "causal"},
], ids=["dropout-gqa", "packed-alibi-softcap", "fp8", "decode-paged"])
def test_warm_launches_every_kernel_of_its_variant(extra):
    """The warm launch (here under the interpreter) runs each kernel the variant lists, so a
    pre-warm that forgot one (the backward, the mask materializer) leaves nothing to compile
    in the sweep's processes."""
    case = make_case("t", dict(dict(backend="triton", seqlen_q=64, heads_q=2, head_dim=16,
                                    dtype="fp32"), **extra))
    variant = warm.variant_of(case)
    with compile_watch.CompileWatch() as watch:
        launch_variant(variant, torch.device("cpu"))
    assert set(watch.configs) == set(variant["kernels"]) | (
        {"_bwd_preprocess"} if "_bwd_dkdv" in variant["kernels"] else set())


# -- the dashboard -----------------------------------------------------------------------------
def _compile_record(case_id, variant, seconds, kernels, mode="pinned", interpreted=False):
    return {"id": case_id, "case": {"backend": "triton"}, "verdict": "pass",
            "env": {"gpu_kind": "H200"},
            "compile": {"mode": mode, "interpreted": interpreted, "seconds": seconds,
                        "kernels": kernels, "autotune_s": 0.0, "variant": variant,
                        "configs": {}}}


def test_the_compile_panel_sums_each_variant_and_counts_who_paid(tmp_path):
    """Per variant: the seconds of every record summed (the first case pays, later ones find
    the kernels compiled), kernels summed, cases that compiled anything; drawn apart from the
    timed figures, and a run of the interpreter says why its bars are 0."""
    from attnbench.report.page.dashboard import parse_dashboard
    from attnbench.report.read.data import frame
    from attnbench.report.read.reader import run_of_records
    from attnbench.report.page.figures import Context
    from attnbench.report.page.panels.compile_time import compile_table, draw_compile

    records = [_compile_record("a", "bf16 d128 gqa fwd+bwd pinned", 9.5, 4),
               _compile_record("b", "bf16 d128 gqa fwd+bwd pinned", 0.0, 0),
               _compile_record("c", "bf16 d64 mha fwd+bwd pinned", 7.0, 4),
               {"id": "d", "case": {"backend": "sdpa"}, "verdict": "pass", "env": {}}]
    table = compile_table(frame(records))
    assert list(table.index.get_level_values(1)) == ["bf16 d128 gqa fwd+bwd pinned",
                                                     "bf16 d64 mha fwd+bwd pinned"]
    first = table.iloc[0]
    assert (first.seconds, first.kernels, first.cases, first.records) == (9.5, 4, 1, 2)
    panel = parse_dashboard({"panels": [{"kind": "compile"}]}, "d.yaml").panels[0]
    ctx = Context(out_dir=tmp_path)
    out = draw_compile(panel, run_of_records(tmp_path, {}, records), ctx)
    assert len(out.figures) == 1 and not out.notes
    cpu = [_compile_record("e", "fp32 d16 mha pinned", 0.0, 0, interpreted=True)]
    out = draw_compile(panel, run_of_records(tmp_path, {}, cpu), ctx)
    assert any("interpreter" in note for note in out.notes)
    none = draw_compile(panel, run_of_records(tmp_path, {}, records[3:]), ctx)
    assert not none.figures and "No record" in none.notes[0]


def test_lengths_whose_tile_offsets_would_wrap_int32_are_refused():
    """16M tokens at d128: position * head_dim reaches 2^31 inside one (batch, head); one token
    less runs. Decode indexes its cache in int64 and is not refused."""
    from attnbench.backends.triton_backend import TritonBackend
    from attnbench.sweep.case import Case

    def reason(**fields):
        case = Case(backend="triton", heads_q=1, heads_kv=1, head_dim=128, head_dim_v=128,
                    **fields)
        return TritonBackend().supports(case, torch.device("cpu"))

    n = 2**31 // 128
    assert "int32" in reason(seqlen_q=n, seqlen_kv=n)
    assert reason(seqlen_q=n - 1, seqlen_kv=n - 1) is None
    assert reason(seqlen_q=1, seqlen_kv=n, decode=True, backward=False) is None


def test_compile_count_is_one_per_kernel_pinned_and_the_pruned_space_autotuned():
    """The plan's figure: pinned, one kernel per kernel of a variant; autotuned, bf16 d128
    compiles 10 + 6 + 12 = 28 configs and d64 15 + 12 + 18 = 45 (the issue's counts: a rule
    that pruned differently would change the estimate silently)."""
    def variant(head_dim, mode):
        case = make_case("t", dict(backend="triton", seqlen_q=4096, head_dim=head_dim,
                                   dtype="bf16"))
        return warm.variant_of(case, mode)

    assert warm.compile_count(variant(128, "pinned")) == {
        "_attn_fwd": 1, "_bwd_preprocess": 1, "_bwd_dkdv": 1, "_bwd_dq": 1}
    assert warm.compile_count(variant(128, "autotune")) == {
        "_attn_fwd": 10, "_bwd_preprocess": 1, "_bwd_dkdv": 6, "_bwd_dq": 12}
    d64 = warm.compile_count(variant(64, "autotune"))
    assert d64["_attn_fwd"] + d64["_bwd_dkdv"] + d64["_bwd_dq"] == 45
