"""Error trends across a sweep (attnbench.report.read.trends): a series whose error grows with the
sequence faster than the fused baseline's is a finding, even when every case passed; flat series
and series with too few lengths are not. Tensors a backend declares computed in the input dtype
(judged against naive) are fitted too, on their ratio to the fused baseline, and over
LEVEL_BOUND times it they are a finding at any number of lengths (issue 39)."""

import math

import pytest

from attnbench import cli
from attnbench.errors import EXIT_FAILURES, EXIT_FINDINGS, EXIT_OK
from attnbench.report.read.trends import (GROWTH_BOUND, LEVEL_BOUND, SLOPE_BOUND, findings,
                                          trends)


def record(seqlen, error, base, *, backend="k", tensor="dq", kind="fused", verdict="pass",
           seed=0, dtype="bf16"):
    tensors = {t: {"rel_l2": 2e-3, "baseline_rel_l2": 2e-3, "baseline": kind}
               for t in ("out", "dq", "dk", "dv")}
    tensors[tensor] = {"rel_l2": error, "baseline_rel_l2": base, "baseline": kind}
    case = {"backend": backend, "seqlen_q": seqlen, "seqlen_kv": seqlen, "heads_q": 1,
            "heads_kv": 1, "head_dim": 64, "dtype": dtype, "seed": seed, "batch": 1,
            "mask": "none"}
    return {"verdict": verdict, "case": case, "accuracy": {"tensors": tensors}}


LADDER = [512, 1024, 2048, 4096, 8192]


def growing(per_doubling, **kw):
    return [record(s, 2e-3 * per_doubling ** i, 2e-3, **kw) for i, s in enumerate(LADDER)]


def test_a_flat_series_is_no_finding_and_a_growing_one_is():
    assert findings(growing(1.0)) == []
    assert findings(growing(1.05)) == []                 # 5 % per doubling: noise-sized
    found = findings(growing(1.4))                       # a bf16 accumulator: ~1.35x measured
    assert [t.series.tensor for t in found] == ["dq"]
    assert found[0].slope == pytest.approx(math.log2(1.4))
    assert "dq error grows 1.40x per doubling" in found[0].describe()


def test_growth_must_also_be_large_across_the_ladder():
    """A steep slope fitted over a short span is not enough: the excess must grow 1.5x."""
    three = [record(s, 2e-3 * 1.2 ** i, 2e-3) for i, s in enumerate([512, 1024, 2048])]
    (trend,) = [t for t in trends(three) if t.series.tensor == "dq"]
    assert trend.slope > SLOPE_BOUND and trend.growth < GROWTH_BOUND and not trend.finding


def test_the_baseline_growing_too_is_no_finding():
    both = [record(s, 2e-3 * 1.4 ** i, 2e-3 * 1.4 ** i) for i, s in enumerate(LADDER)]
    assert findings(both) == []


def declared(seqlen, error, fused, *, backend="k", tensor="dk", seed=0):
    """A record (as written since issue 39) whose ``tensor`` is judged against naive by the
    backend's declaration, with its fused baseline's error beside it."""
    r = record(seqlen, error, 2 * fused, backend=backend, tensor=tensor, kind="naive",
               seed=seed)
    r["accuracy"]["tensors"][tensor].update(fused_rel_l2=fused, fused_ratio=error / fused,
                                            ratio=error / (2 * fused))  # naive: 2x fused
    return r


def test_a_declared_tensor_over_the_level_bound_is_a_finding_at_one_length():
    (found,) = findings([declared(512, 3.2e-3 * 3, 3.2e-3)])
    assert found.series.tensor == "dk" and found.level == pytest.approx(3.0)
    assert "dk error is 3.00x a correct fused kernel's at 512 keys" in found.describe()
    assert "declared computed in the input dtype" in found.describe()
    assert findings([declared(512, 3.2e-3 * 1.8, 3.2e-3)]) == []      # within a fused bound
    # over 2x the fused baseline but as precise as eager (1.2x naive): an eager-precision kernel
    assert findings([declared(512, 3.2e-3 * 2.4, 3.2e-3)]) == []
    # where naive did not fit (no ratio to it), the fused level alone decides: unknown is no pass
    unmeasured = declared(65536, 3.2e-3 * 2.4, 3.2e-3)
    del unmeasured["accuracy"]["tensors"]["dk"]["ratio"]
    assert [t.series.tensor for t in findings([unmeasured])] == ["dk"]
    # naive is the input-precision baseline itself (1.6-2.6x the fused one, measured)
    assert findings([declared(512, 3.2e-3 * 3, 3.2e-3, backend="naive")]) == []


def test_the_level_bound_is_what_an_undeclared_tensor_may_lose():
    from attnbench.accuracy.bounds import FUSED_FACTOR

    assert LEVEL_BOUND == FUSED_FACTOR


def test_a_declared_tensor_is_fitted_on_its_ratio_to_the_fused_baseline():
    ladder = [declared(s, 2e-3 * 1.4 ** i, 2e-3) for i, s in enumerate(LADDER)]
    (found,) = findings(ladder)
    assert found.grows and found.slope == pytest.approx(math.log2(1.4))
    assert "a correct fused kernel's at 8192 keys" in found.describe()  # and over the level


def test_input_precision_tensors_unjudged_cases_and_short_series_are_ignored():
    # a record before issue 39: a tensor judged against naive carried no fused baseline
    assert findings(growing(1.5, kind="naive")) == []
    assert findings(growing(1.5, verdict="timed")) == []   # not judged
    assert trends(growing(1.5)[:2]) == []                   # two lengths: no slope


def test_seeds_are_averaged_and_series_are_kept_apart():
    recs = growing(1.4) + growing(1.4, seed=1) + growing(1.0, backend="other")
    found = findings(recs)
    assert len(found) == 1 and found[0].series.backend == "k"
    assert len(found[0].series.by_length()) == len(LADDER)


def test_findings_set_exit_status_four_unless_a_case_failed(capsys):
    assert cli.run_status(growing(1.0), cli.findings_text(growing(1.0))) == EXIT_OK
    lines = cli.findings_text(growing(1.4))
    assert lines[0].startswith("1 accuracy finding") and "FINDING" in lines[1]
    assert cli.run_status(growing(1.4), lines) == EXIT_FINDINGS
    failed = growing(1.4)
    failed[0]["verdict"] = "fail"
    assert cli.run_status(failed, lines) == EXIT_FAILURES
    assert "FINDING" in capsys.readouterr().out


def test_a_series_that_fails_the_tensor_is_marked_and_the_panel_lists_no_finding_on_it():
    from attnbench.report.page.panels.error_trend import _finding

    records = growing(1.4)
    records[-1].update(verdict="fail", checks=[{"check": "reference", "tensor": "dq",
                                                "passed": False}])
    (trend,) = findings(records)
    assert trend.series.failing and not _finding(trend)
    other = growing(1.4)
    other[-1].update(verdict="fail", checks=[{"check": "reference", "tensor": "dv",
                                              "passed": False}])
    (trend,) = findings(other)  # dv failed, dq's growth is news
    assert not trend.series.failing and _finding(trend)


def test_two_calls_of_one_capture_are_two_series_told_apart_by_their_call():
    """Issue 42 item 4: a finding on a captured case names the call, not just inputs=captured
    (before, the two calls' lines read the same)."""
    calls = []
    for call in (0, 1):
        r = declared(128, 3.2e-3 * 3, 3.2e-3)
        r["case"].update(inputs="captured", captured=f"/abs/acts.safetensors:{call}@{call}abc")
        calls.append(r)
    found = findings(calls)
    assert [f.describe().split(": ")[0] for f in found] == [
        f"k bf16 b1 h1/1 d64 inputs=captured acts.safetensors:{call}" for call in (0, 1)]
