"""The generator states a case's hidden dropout masks are drawn under (RngState.for_call): the
single-device runner sets the case's own before the judged forward (a rerun draws the same
mask), every CP/TP rank its own (so ranks draw independent masks, and the split run's probe
replays them: mask_parts). A kernel that reseeds every rank alike repeats its masks across TP
ranks, and fails.

The CP/TP cases share one 2-rank gloo pool; backends the ranks load are
``test_case_rng:<Name>`` (the pool hands the ranks this process's sys.path).
"""

from __future__ import annotations

import pytest
import torch

from attnbench.accuracy.rng import RngState
from attnbench.cluster.task import outcome_to_record
from attnbench.execution.pool import RankPool
from attnbench.execution.single import run_single_case
from attnbench.mutants.dropout import HiddenTorchRngDropout
from attnbench.problem.attn_spec import AttnSpec
from attnbench.sweep.case import Case
from attnbench.sweep.options import RunOptions, TimingOptions

CASE_FUNC = "attnbench.execution.case_runner:run_payload"
OPTIONS = RunOptions(timeout_s=120, timing=TimingOptions(enabled=False))
SMALL = dict(backend="mutant.hidden_rng_dropout", batch=1, seqlen_q=64, seqlen_kv=64, heads_q=4,
             heads_kv=2, head_dim=16, head_dim_v=16, dtype="fp32", dropout=0.1, seed=3)


class RecordingDropout(HiddenTorchRngDropout):
    """The correct torch-RNG hidden mask, noting the generator's state at each forward."""

    name = "testing.recording_dropout"
    seen: list = []

    def forward(self, q, k, v, spec):
        RecordingDropout.seen.append(torch.get_rng_state())
        return super().forward(q, k, v, spec)


class ReseedingDropout(HiddenTorchRngDropout):
    """Reseeds torch's generator from the dropout seed in every forward: right on one device,
    but every TP rank then draws the same masks for its heads (Megatron offsets its
    model-parallel seed per TP rank so that they do not)."""

    name = "testing.reseeding_dropout"

    def forward(self, q, k, v, spec):
        torch.manual_seed(spec.dropout_seed)
        return super().forward(q, k, v, spec)


def case_of(**fields) -> Case:
    return Case(**{**SMALL, **fields})


@pytest.fixture(scope="module")
def pool():
    made = RankPool(2, threads=1, preload=["attnbench.execution.case_runner"])
    yield made
    made.close()


def run(pool: RankPool, **fields) -> dict:
    case = case_of(**fields)
    outcome = pool.run(CASE_FUNC, {"case": case.to_dict(), "options": OPTIONS.to_dict()},
                       timeout=OPTIONS.timeout_s)
    return outcome_to_record(case, outcome, 0.0, 1, OPTIONS.timeout_s)


def failing(record: dict) -> set[str]:
    return {c["check"] for c in record["checks"] if not c["passed"]}


def test_for_call_states_are_the_cases_own_and_differ_per_rank_and_seed():
    before = torch.get_rng_state()
    one = RngState.for_call("cpu", 11, 0)
    assert torch.equal(one.state, RngState.for_call("cpu", 11, 0).state)
    assert not torch.equal(one.state, RngState.for_call("cpu", 11, 1).state)
    assert not torch.equal(one.state, RngState.for_call("cpu", 12, 0).state)
    assert torch.equal(torch.get_rng_state(), before)  # making one changes nothing


def test_single_runner_draws_under_the_cases_state_and_a_rerun_draws_the_same_mask():
    RecordingDropout.seen.clear()
    case = case_of(backend="test_case_rng:RecordingDropout")
    first = run_single_case(case, OPTIONS)
    assert first["verdict"] == "pass", first["reason"]
    assert first["accuracy"]["reference"] == "recovered-mask"
    expected = RngState.for_call("cpu", AttnSpec.from_case(case).dropout_seed).state
    assert torch.equal(RecordingDropout.seen[0], expected)
    torch.rand(17)  # whatever ran between two runs of the case
    again = run_single_case(case, OPTIONS)
    assert again["accuracy"]["tensors"] == first["accuracy"]["tensors"]


@pytest.mark.parametrize("fields", [dict(tp=2), dict(cp=2, cp_algo="allgather", mask="causal")],
                         ids=["tp2", "cp2-allgather"])
def test_torch_rng_mask_under_tp_cp_is_recovered_from_the_ranks_states(pool, fields):
    """Before: no state under CP/TP, so statistics alone. Now each rank draws under its own
    state and the split run's probe (mask_parts) recovers its mask: the fp64 reference judges,
    and the ranks' masks are independent."""
    record = run(pool, **fields)
    assert record["verdict"] == "pass", (record["reason"], record.get("crash"))
    assert record["accuracy"]["reference"] == "recovered-mask"
    dropout = record["accuracy"]["dropout"]
    assert dropout["replayed_by"] == "rank-states", dropout
    check = next(c for c in record["checks"] if c["check"] == "dropout_independence")
    assert check["value"] <= 0.5 * check["bound"], check


def test_ranks_that_repeat_each_others_masks_fail(pool):
    """A kernel reseeded alike on every TP rank: heads 0-1 (rank 0) and 2-3 (rank 1) draw the
    same masks. Its mask replays by seed on one device, so the TP run's differing from it is
    a ranks-mask-mismatch, and the heads' agreement shows the repetition."""
    record = run(pool, backend="test_case_rng:ReseedingDropout", tp=2)
    assert record["verdict"] == "fail", record["reason"]
    assert {"ranks_mask_replay", "dropout_independence"} <= failing(record), record["reason"]
    assert "ranks-mask-mismatch" in record["reason"]
    check = next(c for c in record["checks"] if c["check"] == "dropout_independence")
    assert "query heads 0 and 2" in check["note"] or "query heads 1 and 3" in check["note"]
    assert check["value"] >= 2 * check["bound"]
    alone = run_single_case(case_of(backend="test_case_rng:ReseedingDropout"), OPTIONS)
    assert alone["verdict"] == "pass", alone["reason"]  # right on one device
