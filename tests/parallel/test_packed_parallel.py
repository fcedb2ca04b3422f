"""Context and tensor parallelism of packed (variable-length) cases on a 2-rank gloo pool: every
sequence split into (uneven) chunks per rank for ring / zigzag / all-gather CP, heads split for
TP; naive, the fp64 reference and our Triton kernels (one launch per ring block for the whole
local pack) pass accuracy and parity with CP = TP = 1. A sequence shorter than 2 cp leaves
chunks empty. About 40 s on 2 busy cores (Triton runs in its interpreter).
"""

from __future__ import annotations

import time

import pytest

from attnbench.accuracy.bounds import REFERENCE_SELF_BOUND
from attnbench.cluster.task import outcome_to_record
from attnbench.execution.pool import RankPool
from attnbench.parallel import layout as lay
from attnbench.results.records import TENSORS
from attnbench.sweep.case import make_case
from attnbench.sweep.options import RunOptions, TimingOptions

CASE_FUNC = "attnbench.execution.case_runner:run_payload"
OPTIONS = RunOptions(timeout_s=120, timing=TimingOptions(enabled=False))
# 3 < 2 cp tokens: zigzag leaves one of its chunks empty; 70 and 13 split unevenly
PACK = dict(seqlens_q=[37, 3, 70, 13], heads_q=4, head_dim=16)
CROSS = dict(seqlens_q=[20, 3, 41], seqlens_kv=[25, 9, 33], heads_q=4, head_dim=16)


@pytest.fixture(scope="module")
def pool():
    made = RankPool(2, threads=1, preload=["attnbench.execution.case_runner"])
    yield made
    made.close()


def run(pool: RankPool, **fields) -> dict:
    case = make_case("t", {"seed": 0, **fields})
    t0 = time.perf_counter()
    outcome = pool.run(CASE_FUNC, {"case": case.to_dict(), "options": OPTIONS.to_dict()},
                       timeout=OPTIONS.timeout_s)
    return outcome_to_record(case, outcome, time.perf_counter() - t0, 1, OPTIONS.timeout_s)


def assert_passes(record: dict) -> None:
    assert record["verdict"] == "pass", (record["reason"], record.get("crash"))
    kinds = {c["check"] for c in record["checks"]}
    assert {"parity", "identity"} <= kinds and kinds & {"reference", "baseline_ratio"}
    assert {c["tensor"] for c in record["checks"] if c["check"] == "parity"} == set(TENSORS)


# -- the layout (no ranks) -----------------------------------------------------------------------


@pytest.mark.parametrize("algo,cp", [("zigzag", 2), ("ring", 2), ("zigzag", 3), ("allgather", 4)])
def test_every_position_of_every_sequence_is_held_once_in_uneven_chunks(algo, cp):
    lengths = [37, 3, 70, 13, 1]
    cu = [0, 37, 40, 110, 123, 124]
    held = []
    for rank in range(cp):
        slots = lay.packed_segments(algo, lengths, cp, rank)
        assert len(slots) == (2 if algo == "zigzag" else 1)
        for slot in slots:
            assert slot.totals == tuple(lengths) and slot.length == sum(slot.lengths)
            for b, (start, n) in enumerate(zip(slot.starts, slot.lengths)):
                parts = 2 * cp if algo == "zigzag" else cp
                assert lengths[b] // parts <= n <= lengths[b] // parts + 1  # padding-free
            held += [row for a, b in slot.ranges for row in range(a, b)]
    assert sorted(held) == list(range(cu[-1]))
    if algo == "zigzag":  # rank r: chunks r and 2 cp - 1 - r of every sequence
        first, second = lay.packed_segments(algo, [40], cp, 0)
        assert (first.starts, second.starts) == ((0,), (40 - 40 // (2 * cp),))


def test_a_block_spec_places_each_chunk_in_its_own_sequence():
    from attnbench.problem.attn_spec import AttnSpec

    case = make_case("t", dict(backend="naive", cp=2, cp_algo="zigzag", **CROSS))
    spec = AttnSpec.from_case(case)
    q_slot = lay.Shard.of(case, 1, 0).q_segments[1]   # chunk 2 of each sequence
    kv_slot = lay.Shard.of(case, 0, 0).kv_segments[0]  # chunk 0 of each sequence
    block = lay.block_spec(spec, q_slot, kv_slot)
    assert block.cu_seqlens_q == (0, 5, 6, 16) and block.cu_seqlens_kv == (0, 7, 10, 19)
    assert block.seq_q_start == (10, 2, 21) and block.seq_kv_start == (0, 0, 0)
    assert block.seqlens_q_total == (20, 3, 41) and block.seqlens_kv_total == (25, 9, 33)


# -- on ranks ------------------------------------------------------------------------------------

SPLITS = {
    "naive zigzag causal alibi dropout gqa bf16": dict(
        backend="naive", cp=2, cp_algo="zigzag", heads_kv=2, mask="causal", bias="alibi",
        dropout=0.1, dtype="bf16", **PACK),
    "naive ring none mqa fp32 sq!=sk": dict(
        backend="naive", cp=2, cp_algo="ring", heads_kv=1, dtype="fp32", **CROSS),
    "naive allgather window gqa fp32 sq!=sk": dict(
        backend="naive", cp=2, cp_algo="allgather", heads_kv=2, mask="window", window_left=6,
        window_right=2, dtype="fp32", **CROSS),
    "reference zigzag causal mqa dropout fp32": dict(
        backend="reference", cp=2, cp_algo="zigzag", heads_kv=1, mask="causal", dropout=0.1,
        dtype="fp32", **PACK),
    "triton zigzag causal mqa dropout bf16": dict(
        backend="triton", cp=2, cp_algo="zigzag", heads_kv=1, mask="causal", dropout=0.1,
        dtype="bf16", **{**PACK, "heads_q": 2}),
    "triton ring none gqa fp32 sq!=sk": dict(
        backend="triton", cp=2, cp_algo="ring", heads_kv=2, dtype="fp32", **CROSS),
    "triton allgather causal mqa bf16 sq!=sk": dict(
        backend="triton", cp=2, cp_algo="allgather", heads_kv=1, mask="causal", dtype="bf16",
        **CROSS),
    "naive tp2 causal alibi mqa bf16": dict(
        backend="naive", tp=2, heads_kv=1, mask="causal", bias="alibi", dtype="bf16", **PACK),
    "triton tp2 causal gqa dropout bf16": dict(
        backend="triton", tp=2, heads_kv=2, mask="causal", dropout=0.1, dtype="bf16", **CROSS),
}


@pytest.mark.parametrize("name", list(SPLITS))
def test_packed_split_equals_one_device_and_fp64(pool, name):
    assert_passes(run(pool, **SPLITS[name]))


@pytest.mark.parametrize("fields", [dict(tp=2), dict(cp=2, cp_algo="allgather")])
def test_reference_dk_dv_summed_over_ranks_get_the_derived_bound(pool, fields):
    """Each rank rounds its partial dK/dV (MQA's replicated head over TP, every query chunk's
    under all-gather): the bound counts those roundings (accuracy.split_sum_roundings) instead
    of "fp64 rounded once"; out and dQ are still rounded once."""
    record = run(pool, backend="reference", heads_kv=1, mask="causal", dtype="bf16",
                 **{**PACK, **fields})
    assert_passes(record)
    checks = {c["tensor"]: c for c in record["checks"] if c["check"] == "reference"}
    once = REFERENCE_SELF_BOUND["bf16"]
    assert checks["out"]["bound"] == checks["dq"]["bound"] == once
    for name in ("dk", "dv"):
        assert 1.5 * once < checks[name]["bound"] < 4 * once, checks[name]
        assert "2 ranks" in checks[name]["note"]


def test_backend_without_packed_chunks_is_unsupported_with_the_reason(pool):
    record = run(pool, backend="sdpa", cp=2, cp_algo="allgather", heads_kv=4, dtype="bf16",
                 **PACK)
    assert record["verdict"] == "unsupported", record["reason"]
    assert "supports_packed_chunks" in record["reason"]
