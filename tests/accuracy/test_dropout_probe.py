"""Dropout of hidden-mask backends (attnbench.accuracy.dropout_probe): the mask is recovered for
sdpa on CPU and the fp64 reference judges with it; the forward dropout mutants are caught, by the
recovered mask and by statistics alone; the correct control passes both.

Margins (value / bound of the check that catches it; a check passes at <= 1), the smallest over
a sweep of 6 shapes (MHA / GQA / MQA, none / causal / window + ALiBi, Sq != Sk, batch 2; normal /
large_logits / outliers) x fp32 / fp16 / bf16 x p 0.1 / 0.3 x seeds 0-1, 72 cases per method:

==========================  ==============================  ==============================
backend                     recovered-mask                  statistics (forced)
==========================  ==============================  ==============================
mutant.dropout_keep_p       keep rate >= 17.7               keep rate >= 9.1, mean bias >= 1.3
mutant.dropout_renormalised reference (dq) >= 3.9           row-sum variance >= 5.1
sdpa (worst of all checks)  0.53 (keep rate)                0.53 (mean bias)
hidden_rng_dropout (same)   0.54 (keep rate)                0.67 (mean bias: ~2.2 sigma)
==========================  ==============================  ==============================

The cases below are a few of those; MIN_MARGIN is what they must keep.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from attnbench.accuracy import dropout_probe
from attnbench.accuracy.dropout_probe import RecoveredKeepMask, RngState, judge_dropout
from attnbench.accuracy.evaluate import evaluate
from attnbench.backends import get_backend
from attnbench.backends.base import Forward
from attnbench.backends.sdpa import SdpaDefault
from attnbench.mutants.dropout import DropoutKeepP, DropoutRenormalised, HiddenTorchRngDropout
from attnbench.problem.attn_spec import AttnSpec
from attnbench.problem.inputs import make_inputs
from attnbench.results.records import TENSORS
from attnbench.sweep.case import make_case

BASE = dict(backend="sdpa", seqlen_q=128, heads_q=4, heads_kv=4, head_dim=32)
GQA_CAUSAL = dict(heads_kv=2, mask="causal", seqlen_q=96, seqlen_kv=203)
MIN_MARGIN = 2.0
"""A mutant must fail its catching check by at least this factor (value / bound)."""


def _case(**fields):
    return make_case("test", {**BASE, **fields})


class _Exposing:
    """The backend as the harness sees it once the mask is recovered: its own declarations
    (``input_precision`` ...), the recovered ``keep_mask``."""

    def __init__(self, backend, keep_mask):
        self.backend, self.keep_mask = backend, keep_mask

    def __getattr__(self, name):
        return getattr(self.backend, name)


def _run(backend, case, force_statistics=False, capture_after=False):
    """Forward and backward as the harness runs them, the RNG state captured right before the
    forward (or, to break replay, right after); then the dropout judgement. The generator is
    seeded from the case, so every run of a test draws the same masks."""
    torch.manual_seed(case.seed)
    spec = AttnSpec.from_case(case)
    q, k, v, dout = make_inputs(case)
    rng = RngState.capture("cpu")
    fwd = backend.forward(q, k, v, spec)
    if capture_after:
        rng = RngState.capture("cpu")
    grads = backend.backward(fwd.ctx, dout)
    judged = judge_dropout(backend, q, k, v, spec, fwd.out, rng,
                           force_statistics=force_statistics)
    return judged, (spec, q, k, v, dout, fwd.out, grads)


def _reference_judgement(case, backend, judged, run):
    """The harness's verdict with the recovered mask (``evaluate`` as for an exposed mask)."""
    spec, q, k, v, dout, out, grads = run
    return evaluate(case, _Exposing(backend, judged.keep_mask), spec, q, k, v, dout, out, grads)


def _margins(checks) -> dict[str, float]:
    margins = {}
    for c in checks:
        if c.bound:
            margins[f"{c.check}:{c.tensor}:{c.metric}"] = c.value / c.bound
        else:
            margins[f"{c.check}:{c.tensor}:{c.metric}"] = math.inf if c.value else 0.0
    return margins


# -- the RNG snapshot --------------------------------------------------------------------------


def test_rng_state_replays_and_leaves_the_generator_where_it_was():
    rng = RngState.capture("cpu")
    first = torch.rand(5)
    after_first = torch.get_rng_state()
    with rng.replayed():
        again = torch.rand(5)
    assert torch.equal(first, again)
    assert torch.equal(torch.get_rng_state(), after_first)
    seeded = RngState.seeded("cpu", 123)
    with seeded.replayed():
        drawn = torch.rand(3)
    assert torch.equal(drawn, torch.rand(3, generator=torch.Generator().manual_seed(123)))
    assert torch.equal(torch.get_rng_state(), after_first)


# -- sdpa: mask recovered, judged by the fp64 reference --------------------------------------


@pytest.mark.parametrize("dtype, dropout, shape", [
    ("fp32", 0.1, {}),
    ("fp32", 0.3, GQA_CAUSAL),
    ("bf16", 0.1, GQA_CAUSAL),
    ("bf16", 0.3, dict(heads_kv=1, mask="window", window_left=24, window_right=8)),
], ids=["fp32-p0.1-mha", "fp32-p0.3-gqa-causal-sq96-sk203", "bf16-p0.1-gqa-causal-sq96-sk203",
        "bf16-p0.3-mqa-window"])
def test_sdpa_mask_is_recovered_and_the_reference_judges_it(dtype, dropout, shape):
    case = _case(dtype=dtype, dropout=dropout, **shape)
    judged, run = _run(SdpaDefault(), case)
    assert judged.method == "recovered-mask", judged.details
    assert judged.details["probe_mask_mismatches"] == 0
    assert judged.forward_calls == 2 * math.ceil(case.seqlen_kv / case.head_dim_v) + 1  # redraw
    assert judged.passed, [c.describe() for c in judged.checks if not c.passed]
    # the judged output is probe @ V to rounding: measured <= 3.5 u in fp32, 0.7 u in bf16
    unit = torch.finfo(run[1].dtype).eps / 2
    assert judged.details["replay_rel_l2"] <= dropout_probe.REPLAY_ROUNDINGS * unit

    verdict = _reference_judgement(case, SdpaDefault(), judged, run)
    assert verdict.verdict == "pass", verdict.reason
    assert verdict.accuracy["reference"] == "exact-mask"
    # Errors against the reference with the recovered mask are those of a run without dropout:
    # measured 0.44-0.95 x (the case's bound is 2 x naive + floor; sdpa sits at 0.08-0.12 of it).
    plain = case.replace(dropout=0.0)
    _, plain_run = _run(SdpaDefault(), plain)
    plain_verdict = evaluate(plain, SdpaDefault(), *plain_run)
    for tensor in TENSORS:
        with_dropout = verdict.accuracy["tensors"][tensor]["rel_l2"]
        without = plain_verdict.accuracy["tensors"][tensor]["rel_l2"]
        assert with_dropout <= 2 * without + unit, (tensor, with_dropout, without)


# -- mutants and control ---------------------------------------------------------------------

MUTANT_CASES = [
    # (backend class, case fields, checks allowed to catch it)
    (DropoutKeepP, dict(dtype="bf16", dropout=0.1, **GQA_CAUSAL),
     {"dropout:out:keep_rate_deviation", "dropout:out:mean_bias"}),
    (DropoutKeepP, dict(dtype="fp32", dropout=0.3, heads_kv=1, inputs="large_logits"),
     {"dropout:out:keep_rate_deviation", "dropout:out:mean_bias"}),
    (DropoutRenormalised, dict(dtype="bf16", dropout=0.1, **GQA_CAUSAL),
     {"dropout:out:row_sum_variance_deficit", "baseline_ratio:out", "baseline_ratio:dq",
      "baseline_ratio:dk", "baseline_ratio:dv"}),
    # large logits: rows dominated by one key, where renormalising looks most like dropout
    (DropoutRenormalised, dict(dtype="bf16", dropout=0.1, heads_kv=1, inputs="large_logits"),
     {"dropout:out:row_sum_variance_deficit", "baseline_ratio:out", "baseline_ratio:dq",
      "baseline_ratio:dk", "baseline_ratio:dv"}),
]


def _all_checks(case, backend, judged, run):
    checks = list(judged.checks)
    if judged.keep_mask is not None:
        checks += list(_reference_judgement(case, backend, judged, run).checks)
    return checks


@pytest.mark.parametrize("force_statistics", [False, True], ids=["recovered", "statistics"])
@pytest.mark.parametrize("mutant, fields, catchers", MUTANT_CASES,
                         ids=[f"{m.name}-{f['dtype']}-{f.get('inputs', 'normal')}"
                              for m, f, _ in MUTANT_CASES])
def test_forward_dropout_mutants_are_caught(mutant, fields, catchers, force_statistics):
    case = _case(**fields)
    backend = mutant()
    judged, run = _run(backend, case, force_statistics=force_statistics)
    assert judged.method == ("statistics" if force_statistics else "recovered-mask"), \
        judged.details
    margins = _margins(_all_checks(case, backend, judged, run))
    # Statistics has no reference: only its own checks can catch.
    caught = {name: m for name, m in margins.items()
              if any(name.startswith(c) for c in catchers) and m > 1}
    assert caught, margins
    assert max(caught.values()) >= MIN_MARGIN, (judged.method, caught)


@pytest.mark.parametrize("force_statistics", [False, True], ids=["recovered", "statistics"])
@pytest.mark.parametrize("backend", [HiddenTorchRngDropout, SdpaDefault])
@pytest.mark.parametrize("fields", [dict(dtype="bf16", dropout=0.1, **GQA_CAUSAL),
                                    dict(dtype="fp32", dropout=0.3, heads_kv=1,
                                         inputs="large_logits")],
                         ids=["bf16-gqa-causal", "fp32-mqa-large-logits"])
def test_correct_hidden_mask_dropout_passes(backend, fields, force_statistics):
    case, backend = _case(**fields), backend()
    judged, run = _run(backend, case, force_statistics=force_statistics)
    margins = _margins(_all_checks(case, backend, judged, run))
    assert max(margins.values()) < 1, margins


# -- when recovery does not apply ------------------------------------------------------------


def test_state_captured_after_the_forward_is_not_trusted():
    """The probes draw another mask than the judged forward: recovery declines, statistics
    judge (and pass the correct backend)."""
    case = _case(dtype="fp32", dropout=0.1)
    judged, _ = _run(SdpaDefault(), case, capture_after=True)
    assert judged.method == "statistics"
    assert "drew another mask" in judged.details["why_not_recovered"]
    assert judged.details["replay_rel_l2"] > 0.1  # another mask: ~sqrt(2p / (1-p)), 0.48
    assert judged.passed, [c.describe() for c in judged.checks if not c.passed]


class _MaskFromValues(HiddenTorchRngDropout):
    """A correct dropout whose mask also depends on V's values (not only the RNG state and the
    shapes): probes with different identity columns draw different masks."""

    name = "testing.mask_from_values"

    def forward(self, q, k, v, spec):
        torch.rand(1 + int(v.flatten().argmax()) % 7)  # where V is largest moves the generator
        return super().forward(q, k, v, spec)


def test_mask_that_depends_on_v_is_not_recovered():
    case = _case(dtype="fp32", dropout=0.1)
    judged, _ = _run(_MaskFromValues(), case)
    assert judged.method == "statistics"
    assert "not reproducible" in judged.details["why_not_recovered"]
    assert judged.passed, [c.describe() for c in judged.checks if not c.passed]


@pytest.mark.parametrize("limit, value", [("PROBE_ENTRY_LIMIT", 64 * 64),
                                          ("PROBE_CALL_LIMIT", 2)])
def test_large_cases_and_missing_state_use_statistics(monkeypatch, limit, value):
    case = _case(dtype="fp32", dropout=0.1, seqlen_q=64)
    monkeypatch.setattr(dropout_probe, limit, value)
    judged, _ = _run(SdpaDefault(), case)
    assert judged.method == "statistics"
    assert limit in judged.details["why_not_recovered"]
    assert json.loads(json.dumps(judged.to_dict()))["method"] == "statistics"
    assert judged.forward_calls == dropout_probe.UNBIASED_RUNS + 2  # probe, its redraw, runs
    spec = AttnSpec.from_case(case)
    q, k, v, _ = make_inputs(case)
    out = SdpaDefault().forward(q, k, v, spec).out
    assert judge_dropout(SdpaDefault(), q, k, v, spec, out, None).method == "statistics"


def test_nothing_to_judge_without_dropout_and_an_exposed_mask_only_for_independence(
        monkeypatch):
    case = _case(dtype="fp32", dropout=0.0, seqlen_q=16)
    spec = AttnSpec.from_case(case)
    q, k, v, _ = make_inputs(case)
    assert judge_dropout(SdpaDefault(), q, k, v, spec, q, None).method == "none: no dropout"
    naive = get_backend("naive")
    spec = spec.replace(dropout_p=0.1)
    exposed = judge_dropout(naive, q, k, v, spec, q, None)
    assert exposed.method == "exposed-mask" and exposed.keep_mask is None  # the reference's own
    assert [c.check for c in exposed.checks] == ["dropout_independence"] and exposed.passed
    monkeypatch.setattr(dropout_probe, "PROBE_ENTRY_LIMIT", 16)
    assert judge_dropout(naive, q, k, v, spec, q, None).method.startswith(
        "none: the backend exposes its keep mask")


def test_recovered_mask_is_indexed_by_global_positions():
    keep = torch.rand(2, 3, 5, 7) > 0.5
    origin = AttnSpec(scale=1.0, batch_start=4, head_start=6, q_start=10, kv_start=20)
    mask = RecoveredKeepMask(keep, origin)
    got = mask(origin, torch.tensor([5]), torch.tensor([6, 8]), torch.tensor([12, 10]),
               torch.arange(20, 27))
    assert torch.equal(got, keep[1:2][:, [0, 2]][:, :, [2, 0]])


def test_forward_calls_and_probe_leave_the_generator_untouched():
    case = _case(dtype="fp32", dropout=0.1, seqlen_q=32)
    spec = AttnSpec.from_case(case)
    q, k, v, _ = make_inputs(case)
    backend = SdpaDefault()
    rng = RngState.capture("cpu")
    out = backend.forward(q, k, v, spec).out
    after = torch.get_rng_state()
    judge_dropout(backend, q, k, v, spec, out, rng)
    assert torch.equal(torch.get_rng_state(), after)
    assert isinstance(backend.forward(q, k, v, spec), Forward)
