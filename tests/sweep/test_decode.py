"""Decode against a KV cache (``decode: true``): the case rules, the paged cache, our split-KV
kernel against the fp64 reference, forward-only records, the decode mutants and the panel.

Legend: B = sequences, Hq / Hkv = heads, Sq = new tokens, Sk = cache length, T = page size.
The Triton kernel runs under TRITON_INTERPRET=1 on CPU: shapes stay tiny, and every length is
chosen to end inside a key tile and a page (boundaries are where paged bugs live).
"""

from __future__ import annotations

import attnbench.kernels  # noqa: F401  (first: TRITON_INTERPRET=1 without a GPU, before triton is imported)

import math
import os
import subprocess

import pytest
import torch

from attnbench.errors import SweepError
from attnbench.execution.case_runner import run_case
from attnbench.kernels.decode import decode_forward, merge_splits_torch
from attnbench.kernels.params import FlashParams
from attnbench.problem.attn_spec import AttnSpec, alibi_slopes
from attnbench.problem.paged import build_paged_cache, decode_cache, gather_kv
from attnbench.problem.reference import reference_forward
from attnbench.results.schema import check_record
from attnbench.sweep.case import Case, make_case
from attnbench.sweep.flops import case_bytes
from attnbench.sweep.load import parse_sweep
from attnbench.sweep.options import RunOptions, TimingOptions

NO_TIMING = RunOptions(timeout_s=120, timing=TimingOptions(enabled=False))
ONE_SAMPLE = RunOptions(timeout_s=120, timing=TimingOptions(
    warmup=0, warmup_ms=0, min_samples=1, max_samples=1, max_seconds=0.2))
DECODE = dict(batch=2, seqlen_q=2, seqlen_kv=45, heads_q=4, heads_kv=2, head_dim=32,
              decode=True, mask="causal")


# -- the case rules -----------------------------------------------------------------------------


def _sweep(fields: str) -> str:
    return f"name: t\ndefaults: {{backend: naive, heads_q: 4, head_dim: 32}}\naxes: {{{fields}}}\n"


@pytest.mark.parametrize("fields, expected", [
    ("decode: [true], seqlen_q: [1], seqlen_kv: [64], page_size: [12]",
     "axes.page_size[0]: got 12, expected 0 or a power of two <= 65536"),
    ("decode: [true], seqlen_q: [1], seqlen_kv: [64], page_size: [128]",
     "page_size: got 128, expected at most 64 (the longest cache: a page larger than the whole "
     "cache)"),
    ("decode: [true], seqlen_q: [32], seqlen_kv: [64]",
     "seqlen_q: got 32, expected 1..16 for a decode case"),
    ("decode: [true], seqlen_q: [8], seqlen_kv: [4]", "seqlen_q: got 8, expected 1..16"),
    ("decode: [true], seqlen_q: [1], seqlen_kv: [64], backward: [true]",
     "backward: got True, expected false for a decode case (decode is forward only)"),
    ("seqlen_q: [1], seqlen_kv: [64], page_size: [16]",
     "page_size: got 16, expected 0 unless decode: true"),
    ("decode: [true], seqlen_q: [1], seqlen_kv: [64], dropout: [0.1]",
     "dropout: got 0.1, expected 0.0 for a decode case"),
    ("decode: [true], seqlen_q: [1], seqlen_kv: [64], seqlens_kv: [[10, 65]]",
     "seqlens_kv[1]: got 65, expected at most seqlen_kv=64 (the cache's capacity"),
    ("decode: [true], seqlen_q: [4], seqlens_kv: [[10, 3]]",
     "seqlen_q (sequence 1): got 4, expected 1..16 for a decode case, at most its cache length 3"),
    ("decode: [true], seqlens_q: [[1, 2]], seqlens_kv: [[10, 30]]",
     "seqlens_q: got [1, 2], expected the same seqlen_q new tokens in every sequence"),
    ("decode: [maybe]", "axes.decode[0]: got 'maybe', expected true or false"),
])
def test_bad_decode_fields_name_the_field(fields, expected):
    with pytest.raises(SweepError) as info:
        parse_sweep(_sweep(fields), "bad.yaml")
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_bad_decode_sweep_is_one_line_exit_2(tmp_path, cli_env):
    from helpers import attnbench_cmd

    bad = tmp_path / "bad.yaml"
    bad.write_text(_sweep("decode: [true], seqlen_q: [1], seqlen_kv: [64], page_size: [24]"))
    proc = subprocess.run([*attnbench_cmd(), "validate", str(bad)], capture_output=True,
                          text=True, env=cli_env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"attnbench: error: {bad}: axes.page_size[0]: got 24, expected 0 or a power of two "
        "<= 65536"]


def test_decode_cases_are_forward_only_and_ids_of_older_cases_unchanged():
    case = make_case("t", dict(backend="naive", **DECODE))
    assert case.backward is False and "decode" in case.features
    assert make_case("t", dict(backend="naive", **DECODE, page_size=16)).features.endswith(
        "decode-paged16")
    # Fields added later stay out of the id at their default: stored runs keep their ids.
    assert Case(backend="naive", seqlen_q=128, seqlen_kv=128, heads_q=8, heads_kv=8, head_dim=64,
                head_dim_v=64).id == "09019b0098a08c33"
    assert make_case("t", dict(backend="naive", seqlen_q=8, backward=False)).features.endswith(
        "fwd-only")


def test_capacity_and_per_sequence_lengths():
    case = make_case("t", dict(backend="naive", **{**DECODE, "batch": 3},
                               seqlens_kv=(5, 45, 17)))
    assert case.is_packed and case.seqlens_q == (2, 2, 2) and case.seqlen_kv == 67


def test_decode_bytes_count_the_cache_once_and_the_table():
    case = make_case("t", dict(backend="naive", **DECODE, page_size=16))
    q = o = 2 * 4 * 2 * 32
    kv = 2 * 2 * 45 * (32 + 32)
    table = 2 * 3 * 4  # int32 per page, cdiv(45, 16) = 3 pages per sequence
    assert case_bytes(case) == ((q + kv + o) * 2 + table, 0.0)
    window = make_case("t", dict(backend="naive", **{**DECODE, "mask": "window", "window_left": 7,
                                                      "window_right": 0}))
    # keys of the window only: query 0 (at 43) sees 36..43, query 1 sees 37..44 -> 9 keys
    assert case_bytes(window)[0] == (q + 2 * 2 * 9 * 64 + o) * 2


# -- the paged cache ------------------------------------------------------------------------------


@pytest.mark.parametrize("page_size", [1, 4, 16, 64])
def test_pages_give_back_the_cache(page_size):
    k, v = torch.randn(3, 2, 61, 8), torch.randn(3, 2, 61, 4)
    cache = build_paged_cache(k, v, page_size, seed=5)
    pages = math.ceil(61 / page_size)
    assert cache.block_table.shape == (3, pages + 1)  # a spare column, as servers size tables
    assert sorted(cache.block_table.flatten().tolist()) == list(range(3 * (pages + 1)))
    back_k, back_v = gather_kv(cache)
    assert torch.equal(back_k, k) and torch.equal(back_v, v)


def test_packed_pages_and_padded_contiguous_cache():
    lengths = (5, 40, 17)
    k, v = torch.randn(1, 2, sum(lengths), 8), torch.randn(1, 2, sum(lengths), 8)
    cu = (0, 5, 45, 62)
    cache = build_paged_cache(k, v, 16, seed=1, cu_seqlens=cu)
    assert cache.block_table.shape == (3, 4)
    back_k, back_v = gather_kv(cache)
    assert torch.equal(back_k, k) and torch.equal(back_v, v)
    spec = AttnSpec(scale=1.0, decode=True, cu_seqlens_q=(0, 1, 2, 3), cu_seqlens_kv=cu)
    contiguous = decode_cache(spec, k, v)
    assert contiguous.k.shape == (3, 2, 40, 8) and contiguous.seqlens.tolist() == list(lengths)
    assert torch.equal(contiguous.k[2, :, :17], k[0, :, 45:62])
    assert contiguous.k[0, :, 5:].abs().sum() > 0  # padding is random, not zeros


# -- the split-KV kernel against fp64 --------------------------------------------------------------


def _kernel_error(batch, heads_q, heads_kv, sq, lengths, dim, page=0, window=(-1, -1),
                  softcap=0.0, alibi=False, splits=0, merge=None):
    """Relative L2 error of out and max |error| of lse against fp64, per sequence."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads_q, sq, dim, generator=gen)
    k = torch.randn(batch, heads_kv, max(lengths), dim, generator=gen)
    v = torch.randn(batch, heads_kv, max(lengths), dim, generator=gen)
    slopes = tuple(alibi_slopes(heads_q)) if alibi else None
    params = FlashParams(sm_scale=dim ** -0.5, window_left=window[0], window_right=window[1],
                         softcap=softcap, alibi_slopes=slopes)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    if page:
        cache = build_paged_cache(k, v, page, seed=3)
        out, lse = decode_forward(q, cache.k_pages, cache.v_pages, params, seqlens_k=seqlens,
                                  max_seqlen_k=max(lengths), heads_kv=heads_kv,
                                  block_table=cache.block_table, page_size=page,
                                  splits=splits, merge=merge)
    else:
        out, lse = decode_forward(q, k, v, params, seqlens_k=seqlens, max_seqlen_k=max(lengths),
                                  heads_kv=heads_kv, splits=splits, merge=merge)
    worst = (0.0, 0.0)
    for b, length in enumerate(lengths):
        spec = AttnSpec(scale=dim ** -0.5, window_left=window[0], window_right=window[1],
                        softcap=softcap, alibi_slopes=slopes, seqlen_q_total=sq,
                        seqlen_kv_total=length)
        ref, ref_lse = reference_forward(q[b:b + 1], k[b:b + 1, :, :length],
                                         v[b:b + 1, :, :length], spec)
        err = ((out[b:b + 1].double() - ref).norm() / ref.norm()).item()
        lse_err = (lse[b:b + 1].double() - ref_lse).abs().max().item()
        worst = (max(worst[0], err), max(worst[1], lse_err))
    return worst


@pytest.mark.parametrize("kw", [
    dict(batch=1, heads_q=4, heads_kv=4, sq=1, lengths=(37,), dim=16),
    dict(batch=2, heads_q=8, heads_kv=2, sq=3, lengths=(70, 70), dim=32, page=16),
    dict(batch=2, heads_q=8, heads_kv=1, sq=4, lengths=(33, 33), dim=16, page=4,
         window=(-1, 0)),
    dict(batch=2, heads_q=4, heads_kv=2, sq=2, lengths=(50, 50), dim=16, page=8, window=(5, 0),
         softcap=5.0, alibi=True),
    dict(batch=1, heads_q=4, heads_kv=4, sq=16, lengths=(40,), dim=64, page=1, splits=3),
    dict(batch=3, heads_q=4, heads_kv=2, sq=2, lengths=(5, 48, 17), dim=16, page=16),
    dict(batch=3, heads_q=4, heads_kv=1, sq=1, lengths=(2, 33, 16), dim=16, splits=4),
], ids=["mha", "gqa-paged", "mqa-causal-page4", "window-softcap-alibi", "page1-splits3",
        "unequal-paged", "unequal-contiguous"])
def test_split_kv_kernel_matches_fp64(kw):
    err, lse_err = _kernel_error(**kw)
    assert err < 1e-5 and lse_err < 1e-4, (err, lse_err)


def test_merge_kernel_equals_the_torch_merge():
    torch_merge = _kernel_error(batch=2, heads_q=4, heads_kv=2, sq=2, lengths=(50, 3), dim=16,
                                splits=4, merge=merge_splits_torch)
    assert torch_merge[0] < 1e-5


# -- through the harness: records of forward-only cases --------------------------------------------


@pytest.mark.parametrize("backend, page", [("naive", 16), ("triton", 16), ("sdpa", 0),
                                           ("triton", 0)])
def test_decode_record_is_forward_only(backend, page):
    case = make_case("t", dict(backend=backend, **DECODE, page_size=page, dtype="fp32"))
    record = run_case(case, ONE_SAMPLE)
    assert record["verdict"] == "pass", record["reason"]
    assert record["accuracy"]["backward"].startswith("not applicable")
    assert set(record["accuracy"]["tensors"]) == {"out"} and record["accuracy"]["identities"] == {}
    timing = record["timing"]
    assert timing["bwd"] is None and timing["flops_bwd"] is None and timing["bytes_bwd"] is None
    assert timing["fwd"]["gbps"] > 0 and timing["bytes_fwd"] == case_bytes(case)[0]
    check_record("t: ", record)


def test_paged_case_of_a_contiguous_backend_is_unsupported():
    record = run_case(make_case("t", dict(backend="sdpa", **DECODE, page_size=16)), NO_TIMING)
    assert record["verdict"] == "unsupported" and "contiguous KV cache only" in record["reason"]


def test_unequal_cache_lengths_through_the_harness():
    fields = {**DECODE, "batch": 3, "seqlens_kv": (5, 45, 17), "page_size": 16}
    for backend in ("naive", "triton"):
        record = run_case(make_case("t", dict(backend=backend, **fields)), NO_TIMING)
        assert record["verdict"] == "pass", (backend, record["reason"])


# -- the decode mutants: each caught where its bug lives -------------------------------------------


@pytest.mark.parametrize("mutant, fields", [
    ("mutant.paged_wrong_sequence", dict(page_size=16)),
    ("mutant.page_boundary_off_by_one", dict(page_size=16)),
    ("mutant.page_boundary_off_by_one", dict(page_size=4, batch=3, seqlens_kv=(5, 45, 17))),
    ("mutant.split_merge_no_max", dict(dtype="fp16", inputs="large_logits", seqlen_kv=64)),
])
def test_decode_mutants_are_caught(mutant, fields):
    record = run_case(make_case("t", dict(backend=mutant, **{**DECODE, **fields})), NO_TIMING)
    assert record["verdict"] == "fail", record["reason"]


def test_decode_mutants_are_correct_where_their_bug_does_not_show():
    contiguous = make_case("t", dict(backend="mutant.paged_wrong_sequence", **DECODE))
    assert run_case(contiguous, NO_TIMING)["verdict"] == "pass"
    bf16 = run_case(make_case("t", dict(backend="mutant.split_merge_no_max", **DECODE)),
                    NO_TIMING)
    # Its output is right in bf16 (no overflow); its merged lse, m + log sum exp(lse_s), counts
    # the max twice: the lse check (issue 39) sees that wherever the kernel returns it.
    assert {c["check"] for c in bf16["checks"] if not c["passed"]} == {"lse"}, bf16["reason"]


# -- the dashboard: the decode panel ---------------------------------------------------------------


def test_decode_panel_draws_bandwidth_and_latency_per_backend_and_page(tmp_path):
    from attnbench.report.page.dashboard import load_dashboard
    from attnbench.report.read.reader import run_of_records
    from attnbench.report.page.figures import Context
    from attnbench.report.page.panels import draw_panel
    from helpers import ROOT

    records = [run_case(make_case("t", dict(backend="naive", **{**DECODE, "seqlen_kv": n},
                                            page_size=page)), ONE_SAMPLE)
               for n in (45, 90, 180) for page in (0, 16)]
    records.append(run_case(make_case("t", dict(backend="naive", seqlen_q=32)), ONE_SAMPLE))
    run = run_of_records(tmp_path, {"run_id": "t"}, records, "t")
    dashboard = load_dashboard(ROOT / "dashboards" / "default.yaml")
    panel = next(p for p in dashboard.panels if p.kind == "decode")
    out = draw_panel(panel, run, Context(out_dir=tmp_path))
    stem = f"p{panel.index:02d}-decode-cpu-bf16-attention-kind-gqa-seqlen-q-2"
    assert [f.png.name for f in out.figures] == [f"{stem}.png"], out.notes
    svg = (tmp_path / f"{stem}.svg").read_text()
    assert "naive p0" in svg and "naive p16" in svg and "GB/s" in svg
    # the training case is not decode: the throughput panel keeps it, this one ignores it
    for throughput in (p for p in dashboard.panels if p.kind == "throughput"):
        assert throughput.exclude == {"decode": [True]}


# -- on a GPU ------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="needs a CUDA device and compiled kernels (TRITON_INTERPRET unset or 0)")
@pytest.mark.parametrize("backend", ["triton", "sdpa", "flash_attn"])
@pytest.mark.parametrize("page_size", [0, 256])
def test_gpu_decode_passes_and_reports_bandwidth(backend, page_size):
    """A Llama-3-8B layer's decode on a GPU: every backend passes or says why it cannot (sdpa:
    no pages, flash_attn absent); ours passes and its GB/s is a figure of the real device."""
    case = make_case("t", dict(backend=backend, batch=2, seqlen_q=1, seqlen_kv=32768,
                               heads_q=32, heads_kv=8, head_dim=128, decode=True,
                               mask="causal", page_size=page_size, dtype="bf16"))
    record = run_case(case, RunOptions(timing=TimingOptions(max_seconds=0.5)),
                      device=torch.device("cuda"))
    assert record["verdict"] in ("pass", "unsupported"), record["reason"]
    if backend == "triton":
        assert record["verdict"] == "pass", record["reason"]
        assert record["timing"]["fwd"]["gbps"] > 0
