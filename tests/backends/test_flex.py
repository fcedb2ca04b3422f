"""The ``flex`` backend (FlexAttention, torch.compile'd) on CPU: listed, refuses what it cannot
run with the reason, passes a sweep beside naive and sdpa (forward only: PyTorch compiles
FlexAttention for inference only on CPU), records its compile seconds apart from timing, and a
copy with a planted bug is caught.

Compiling is slow here (20-70 s per new shape on 2 busy cores; inductor's on-disk cache makes a
rerun ~9 s): the sweep compiles 2 shapes, the mutant 1.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch

from attnbench.backends import get_backend, public_names, refusal
from attnbench.backends.flex import (CPU_FORWARD_ONLY, CPU_NO_PARALLEL, NO_DROPOUT,
                                     compile_unavailable)
from attnbench.execution.single import run_single_case
from attnbench.results.store import load_records
from attnbench.sweep.case import make_case
from attnbench.sweep.options import RunOptions, TimingOptions
from helpers import ROOT, attnbench_cmd

CPU = torch.device("cpu")
NO_TIMING = RunOptions(timeout_s=600, timing=TimingOptions(enabled=False))
# Sq < Sk, causal, ALiBi, MQA: bottom-right alignment is visible in the mask and the distances
SKEWED = dict(batch=1, seqlen_q=96, seqlen_kv=203, heads_q=4, heads_kv=1, head_dim=32,
              mask="causal", bias="alibi", dtype="bf16", backward=False)

SWEEP = """
name: flex-ci
defaults: {batch: 1, heads_q: 4, heads_kv: 1, head_dim: 32, seed: 0, backward: false}
axes:
  backend: [flex, naive, sdpa]
  dtype: [bf16]
  mask: [causal]
  bias: [alibi]
  seqlen_q: [96]
  seqlen_kv: [203]
include:
  - {backend: flex, seqlens_q: [50, 1, 77], seqlens_kv: [70, 9, 40], mask: causal, dtype: fp32}
  - {backend: naive, seqlens_q: [50, 1, 77], seqlens_kv: [70, 9, 40], mask: causal, dtype: fp32}
  - {backend: flex, dropout: 0.1, seqlen_q: 64, dtype: bf16}
  - {backend: flex, backward: true, seqlen_q: 64, dtype: bf16}
options:
  timeout_s: 600
  timing: {warmup: 1, warmup_ms: 0, min_samples: 3, max_samples: 5, max_seconds: 0.05}
"""


def test_flex_is_a_listed_builtin():
    assert "flex" in public_names()
    proc = subprocess.run([*attnbench_cmd(), "backends"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert "flex" in proc.stdout.split(), proc.stdout + proc.stderr
    # Its forward cases pass on a CPU (the sweep below): "ready, forward only", not unavailable;
    # and probing flex (which imports triton) first no longer made triton "unavailable".
    states = {line.split()[0]: line.split(None, 1)[1] for line in proc.stdout.splitlines()
              if line.startswith("  ") and not line.startswith("   ")}
    assert states["flex"].startswith("ready, forward only:"), proc.stdout
    if not torch.cuda.is_available():
        assert states["triton"] == "ready", proc.stdout


@pytest.mark.parametrize("fields, reason", [
    ({"dropout": 0.1}, NO_DROPOUT),
    ({"backward": True}, CPU_FORWARD_ONLY),
    ({"cp": 2, "cp_algo": "allgather"}, CPU_NO_PARALLEL),  # it ran a backward: an error
    ({"tp": 2, "heads_q": 4, "heads_kv": 2}, CPU_NO_PARALLEL),
    ({"decode": True, "seqlen_q": 1, "page_size": 16}, "reads a contiguous KV cache only"),
    ({"dtype": "fp8_e4m3"}, "has no fp8 path"),
])
def test_what_flex_cannot_run_is_refused_with_the_reason(fields, reason):
    case = make_case("t", {**SKEWED, "backend": "flex", **fields})
    assert reason in refusal(get_backend("flex"), case, CPU)


def test_without_a_compiler_flex_is_refused_not_run_uncompiled(monkeypatch):
    import torch._inductor.cpp_builder as builder

    def no_compiler():
        raise RuntimeError("no C++ compiler found (tried g++, clang++)")

    monkeypatch.setattr(builder, "get_cpp_compiler", no_compiler)
    assert compile_unavailable(CPU) == ("torch.compile on CPU needs a C++ compiler: no C++ "
                                        "compiler found (tried g++, clang++)")


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("flex")
    (tmp / "flex.yaml").write_text(SWEEP)
    proc = subprocess.run([*attnbench_cmd(), "run", str(tmp / "flex.yaml"), "--out",
                           str(tmp / "run"), "--no-report"], capture_output=True, text=True,
                          cwd=ROOT, timeout=900, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    return proc, {(r["case"]["backend"], bool(r["case"].get("seqlens_q")), r["case"]["dropout"],
                   r["case"]["backward"]): r for r in load_records(tmp / "run")}


def test_a_sweep_with_flex_passes_on_cpu_beside_naive_and_sdpa(sweep_run):
    proc, records = sweep_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = [r for r in records.values() if r["verdict"] != "unsupported"]
    assert len(ran) == 5 and {r["verdict"] for r in ran} == {"pass"}, \
        [(r["label"], r["reason"]) for r in ran]
    assert records[("flex", False, 0.1, False)]["reason"] == NO_DROPOUT
    assert records[("flex", False, 0.0, True)]["reason"] == CPU_FORWARD_ONLY
    for packed in (False, True):  # judged as a fused kernel, against the fused baseline
        out = records[("flex", packed, 0.0, False)]["accuracy"]["tensors"]["out"]
        assert out["baseline"] == "fused" and out["rel_l2"] <= out["bound"], out


def test_flex_compile_seconds_are_recorded_apart_from_timing(sweep_run):
    _, records = sweep_run
    for packed in (False, True):
        record = records[("flex", packed, 0.0, False)]
        section = record["compile"]
        assert section["mode"] == "torch.compile" and section["kernels"] == 1, section
        assert section["seconds"] > 1.0, section  # a compile, not a call (~1 ms here)
        fwd = record["timing"]["fwd"]
        # the timed samples and the warm-up are the compiled kernel's: milliseconds
        assert fwd["median_ms"] * 1e-3 < section["seconds"] / 100, (fwd, section)
        assert fwd["warmup_ms"] * 1e-3 < section["seconds"] / 10, (fwd, section)
        assert record["timing"]["bwd"] is None
    assert "compile" not in records[("naive", False, 0.0, False)]


def test_a_copy_with_causal_aligned_top_left_is_caught():
    record = run_single_case(make_case("t", {**SKEWED, "backend": "flex_mutant:TopLeft"}),
                             NO_TIMING, CPU)
    assert record["verdict"] == "fail", (record["reason"], json.dumps(record["checks"]))
    out = [c for c in record["checks"] if c["tensor"] == "out" and not c["passed"]]
    assert out and all(c["value"] > 10 * c["bound"] for c in out), out  # margin: >10x


def test_a_long_lived_rank_clears_dynamo_before_its_recompile_limit(monkeypatch):
    """Dynamo runs a function uncompiled, silently, once it has ``recompile_limit`` (8) variants
    (unless fullgraph): the rank's compiler resets dynamo before the 9th variant instead, and
    counts compiles by dynamo's own counter. A stand-in for torch.compile (no real compile)."""
    from torch._dynamo.utils import counters

    import attnbench.backends.flex as flex

    resets, compiled_with = [], {}

    def fake_compile(fn, **kwargs):
        compiled_with.update(kwargs)

        def run(*args, **kw):  # a new shape: dynamo compiles a graph
            counters["stats"]["unique_graphs"] += 1
            return "out"
        return run

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(len(compiler.variants)))
    compiler = flex._Compiler()
    limit = flex.recompile_limit()
    x = torch.zeros(1)
    for shape in range(limit):
        compiler.call(("shape", shape), x)
    assert resets == [] and len(compiler.variants) == limit
    compiler.call(("shape", limit), x)  # the 9th variant: reset first, never at the limit
    assert resets == [limit] and len(compiler.variants) == 1
    assert compiled_with == {"fullgraph": True, "dynamic": False}  # a limit hit raises
    report = compiler.report()
    assert report["kernels"] == limit + 1 and report["mode"] == "torch.compile"
    compiler.call(("shape", limit), x)  # known: no compile, nothing new to report
    assert compiler.report()["kernels"] == 0


def test_the_first_backward_of_a_variant_compiles_inside_compiling():
    """AOTAutograd compiles FlexAttention's backward at its first call: that call runs inside
    ``compiling()`` (the case's timeout stands still) and its seconds are in the compile record;
    later backwards of the variant are plain calls (issue 43 item 5). A stand-in graph: a
    backward hook bumps dynamo's graph counter the first time, as a lazy compile does."""
    from torch._dynamo.utils import counters

    import attnbench.backends.base as base
    import attnbench.backends.flex as flex

    events = []
    base.on_compile(events.append)
    try:
        compiler = flex._Compiler()
        x = torch.ones(3, requires_grad=True)

        def lazy_compile(grad):
            counters["stats"]["unique_graphs"] += 1
            return grad
        for _ in range(2):
            out = x * 2
            out.register_hook(lazy_compile)
            (grad,) = compiler.backward(("variant",), out, (x,), torch.ones(3))
            assert torch.equal(grad, torch.full((3,), 2.0))
        assert events == [True, False]  # the first backward only
        report = compiler.report()
        assert report["kernels"] == 1 and report["seconds"] >= 0
    finally:
        base._compile_listeners.remove(events.append)
