"""``mutated``: a mutant's copy of a function with one text edit -- and a chain of edits keeps
every one of them (the first edit of ``mutant.gqa_dkv_mean``'s chain was silently lost: its
dK stayed correct while the catalogue said dK/dV)."""

from __future__ import annotations

import pytest

from attnbench.backends import get_backend
from attnbench.execution.case_runner import run_case
from attnbench.mutants.patch import MutationError, mutated
from attnbench.sweep.case import make_case
from attnbench.sweep.options import RunOptions, TimingOptions


def _pair(x):
    a = x + 1
    b = x * 2
    return a, b


def test_one_edit_and_a_chain_of_two():
    assert mutated(_pair, "a = x + 1", "a = x + 10")(1) == (11, 2)
    both = mutated(mutated(_pair, "a = x + 1", "a = x + 10"), "b = x * 2", "b = x * 20")
    assert both(1) == (11, 20)


def test_an_edit_that_is_not_there_once_is_refused():
    with pytest.raises(MutationError, match="expected the text 'c = 3' exactly once"):
        mutated(_pair, "c = 3", "c = 4")


def test_gqa_dkv_mean_breaks_dk_and_dv():
    case = make_case("t", dict(backend="mutant.gqa_dkv_mean", dtype="fp32", seqlen_q=64,
                               heads_q=4, heads_kv=2, head_dim=32))
    get_backend(case.backend)
    record = run_case(case, RunOptions(timeout_s=120, timing=TimingOptions(enabled=False)))
    failed = {c["tensor"] for c in record["checks"] if not c["passed"]}
    assert record["verdict"] == "fail" and {"dk", "dv"} <= failed, record["reason"]
