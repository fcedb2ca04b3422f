"""The backend contract (attnbench.accuracy.contract) is checked before judging: a backend that
returns an output of another dtype, dK/dV with the query's head count or an lse of another shape
is that backend's ``error``, with one line naming the tensor and what was expected -- not a
harness error and not a pass. A correct backend whose tensors are non-contiguous views passes.

Single-device cases run in this process; the CP/TP ones share one 2-rank gloo pool. Backends
are ``contract_backends:<Name>`` (tests/support, on the ranks' sys.path too).
"""

from __future__ import annotations

import pytest
import torch

from attnbench.accuracy.contract import check_backward, check_forward
from attnbench.cluster.task import outcome_to_record
from attnbench.errors import BackendError, ContractBreach
from attnbench.execution.blame import blame
from attnbench.execution.pool import RankPool
from attnbench.execution.single import run_single_case
from attnbench.sweep.case import Case, make_case
from attnbench.sweep.options import RunOptions, TimingOptions

NO_TIMING = RunOptions(timeout_s=120, timing=TimingOptions(enabled=False))
CASE_FUNC = "attnbench.execution.case_runner:run_payload"
BASE = dict(seqlen_q=128, heads_q=4, heads_kv=1, head_dim=64, dtype="bf16")
PACKED = dict(seqlens_q=[50, 1, 77], seqlen_q=128, mask="causal")
DECODE = dict(batch=2, seqlen_q=2, seqlen_kv=45, decode=True, mask="causal")


def case_of(backend: str, **fields) -> Case:
    return make_case("test", {**BASE, "backend": backend, **fields})


def t(*shape, dtype=torch.bfloat16):
    return torch.zeros(shape, dtype=dtype)


# -- the checks themselves -------------------------------------------------------------------------


def test_dk_with_the_query_heads_names_the_tensor_and_k_shape():
    q, k, v = t(1, 4, 128, 64), t(1, 1, 128, 64), t(1, 1, 128, 64)
    with pytest.raises(ContractBreach) as raised:
        check_backward(q, k, v, (t(1, 4, 128, 64), t(1, 4, 128, 64), t(1, 1, 128, 64)))
    assert str(raised.value) == ("backend contract: dk has shape (1, 4, 128, 64); expected "
                                 "(1, 1, 128, 64) (k's shape)")
    with pytest.raises(ContractBreach, match=r"dv has shape \(1, 1, 128, 32\); expected "
                                             r"\(1, 1, 128, 64\) \(v's shape\)"):
        check_backward(q, k, v, (q, k, t(1, 1, 128, 32)))
    with pytest.raises(ContractBreach, match="backward returned 2 values"):
        check_backward(q, k, v, (q, k))
    check_backward(q, k, v, (q, k, v))


def test_output_dtype_and_shape_follow_the_case_and_q():
    q, k, v = t(2, 4, 7, 64), t(2, 1, 9, 64), t(2, 1, 9, 32)
    case = Case(backend="naive", dtype="bf16")
    check_forward(case, q, k, v, t(2, 4, 7, 32), torch.zeros(2, 4, 7))
    check_forward(case, q, k, v, t(2, 4, 7, 32), None)  # no lse: nothing to check
    with pytest.raises(ContractBreach, match="out has dtype float32; expected bfloat16"):
        check_forward(case, q, k, v, t(2, 4, 7, 32, dtype=torch.float32), None)
    with pytest.raises(ContractBreach, match=r"out has shape \(2, 4, 7, 64\); expected "
                                             r"\(2, 4, 7, 32\)"):
        check_forward(case, q, k, v, t(2, 4, 7, 64), None)
    with pytest.raises(ContractBreach, match=r"lse has shape \(2, 7, 4\); expected \(2, 4, 7\)"):
        check_forward(case, q, k, v, t(2, 4, 7, 32), torch.zeros(2, 7, 4))
    with pytest.raises(ContractBreach, match="lse has dtype int64"):
        check_forward(case, q, k, v, t(2, 4, 7, 32), torch.zeros(2, 4, 7, dtype=torch.int64))
    # an fp8 case's output is its declared output dtype (bf16), not the fp8 input's
    fp8 = Case(backend="naive", dtype="fp8_e4m3")
    check_forward(fp8, q.to(torch.float8_e4m3fn), k, v, t(2, 4, 7, 32), None)
    with pytest.raises(ContractBreach, match="expected bfloat16 .*of fp8_e4m3 cases"):
        check_forward(fp8, q, k, v, t(2, 4, 7, 32).to(torch.float8_e4m3fn), None)


def test_a_breach_is_blamed_on_the_backend_whoever_raised_it():
    mine, reason = blame(ContractBreach("out has dtype float32; expected bfloat16"), object())
    assert mine and reason == "backend contract: out has dtype float32; expected bfloat16"
    assert isinstance(ContractBreach("x"), BackendError)


def test_strides_are_not_part_of_the_contract():
    q = t(1, 5, 4, 8).transpose(1, 2)  # (1, 4, 5, 8), non-contiguous
    assert not q.is_contiguous()
    lse = torch.zeros(1, 5, 4).transpose(1, 2)
    check_forward(Case(backend="naive", dtype="bf16"), q, q, q, q, lse)
    check_backward(q, q, q, (q, q, q))


# -- through the single-device runner ------------------------------------------------------------


@pytest.mark.parametrize("backend, fields, expected", [
    ("DkvQueryHeads", {}, "dk has shape (1, 4, 128, 64); expected (1, 1, 128, 64) (k's shape)"),
    ("DkvQueryHeads", PACKED, "dk has shape (1, 4, 128, 64); expected (1, 1, 128, 64)"),
    ("OutFloat32", {}, "out has dtype float32; expected bfloat16 (the output dtype of bf16"),
    ("OutFloat32", DECODE, "out has dtype float32; expected bfloat16"),
    ("LseWithHeadDim", PACKED, "lse has shape (1, 4, 128, 1); expected (1, 4, 128)"),
    ("TwoGradients", {}, "backward returned 2 values; expected (dq, dk, dv)"),
])
def test_a_breach_is_the_backends_error_in_one_line(backend, fields, expected):
    record = run_single_case(case_of(f"contract_backends:{backend}", **fields), NO_TIMING)
    assert record["verdict"] == "error", record["reason"]
    assert record["reason"].startswith("backend contract: " + expected), record["reason"]
    assert "harness error" not in record["reason"] and "\n" not in record["reason"]


def test_an_fp32_output_of_an_fp32_case_is_no_breach():
    record = run_single_case(case_of("contract_backends:OutFloat32", dtype="fp32"), NO_TIMING)
    assert record["verdict"] == "pass", record["reason"]


@pytest.mark.parametrize("fields", [{}, PACKED, DECODE], ids=["dense", "packed", "decode"])
def test_a_correct_backend_with_non_contiguous_tensors_passes(fields):
    record = run_single_case(case_of("contract_backends:NonContiguous", **fields), NO_TIMING)
    assert record["verdict"] == "pass", record["reason"]
    assert record["accuracy"]["lse"]["max_scaled"] <= record["accuracy"]["lse"]["bound"]


# -- through the CP/TP paths -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool2():
    pool = RankPool(2, threads=1, preload=[CASE_FUNC.split(":")[0]])
    yield pool
    pool.close()


def run_split(case: Case, pool: RankPool) -> dict:
    outcome = pool.run(CASE_FUNC, {"case": case.to_dict(), "options": NO_TIMING.to_dict()},
                       timeout=NO_TIMING.timeout_s)
    return outcome_to_record(case, outcome, 0.0, 1, NO_TIMING.timeout_s)


@pytest.mark.parametrize("backend, fields, expected", [
    ("DkvQueryHeads", dict(tp=2, heads_kv=2),
     "dk has shape (1, 2, 128, 64); expected (1, 1, 128, 64) (k's shape)"),  # either rank
    ("DkvQueryHeads", dict(cp=2, cp_algo="allgather"), "dk has shape (1, 4, 128, 64); expected"),
    ("OutFloat32", dict(cp=2, mask="causal"), "ring step 0: out has dtype float32; expected"),
], ids=["tp", "allgather", "ring"])
def test_a_split_run_blames_the_breach_on_the_backend(backend, fields, expected, pool2):
    record = run_split(case_of(f"contract_backends:{backend}", **fields), pool2)
    assert record["verdict"] == "error", record["reason"]
    assert record["reason"].startswith("backend contract: CP rank "), record["reason"]
    assert expected in record["reason"] and "harness error" not in record["reason"]


@pytest.mark.parametrize("fields", [dict(tp=2, heads_kv=2), dict(cp=2, cp_algo="allgather"),
                                    dict(cp=2, cp_algo="zigzag", **PACKED)],
                         ids=["tp", "allgather", "zigzag-packed"])
def test_a_split_run_of_non_contiguous_tensors_passes_with_its_lse_judged(fields, pool2):
    record = run_split(case_of("contract_backends:NonContiguous", **fields), pool2)
    assert record["verdict"] == "pass", record["reason"]
    assert [c["check"] for c in record["checks"]].count("lse") == 1
