"""The failures at the end of ``attnbench run`` and in ``show`` (issue 39 item 7): the failing
cases printed as they came are not listed again, at most LISTED others are, then what the
failures share; a finding on a series that already fails is counted, not repeated, and the exit
status is what it was (failures 1, findings alone 4)."""

import json

from attnbench import cli
from attnbench.errors import EXIT_FAILURES, EXIT_FINDINGS
from attnbench.report.show import summary as summary_mod
from attnbench.report.show.summary import RunSummary
from attnbench.results.records import make_record
from attnbench.sweep.case import make_case

LADDER = [512, 1024, 2048, 4096, 8192]


def case_record(verdict="pass", failing=(), *, seqlen=256, error=2e-3, **fields):
    """A record of a judged case: ``failing`` tensors fail their reference check; ``error``: the
    dQ error (against a fused baseline of 2e-3)."""
    case = make_case("summary", {"backend": "mutant.gqa_dkv_mean", "dtype": "bf16",
                                 "heads_q": 4, "seqlen_q": seqlen, **fields})
    tensors = {t: {"rel_l2": 2e-3, "fused_rel_l2": 2e-3, "baseline": "fused"}
               for t in ("out", "dq", "dk", "dv")}
    tensors["dq"]["rel_l2"] = error
    checks = [{"check": "reference", "tensor": t, "metric": "rel_l2", "value": 1.0,
               "bound": 1.0, "passed": t not in failing} for t in tensors]
    return make_record(case, verdict=verdict, reason="dk rel_l2 0.5 > bound 0.01" if failing
                       else "", checks=checks, accuracy={"tensors": tensors}, env={})


def gqa(seeds=range(3)):
    return [case_record("fail" if h == 2 else "pass", ("dk", "dv") if h == 2 else (),
                        heads_kv=h, seed=s) for h in (4, 2) for s in seeds]


def test_cases_shown_as_they_came_are_not_listed_again():
    records = gqa(range(20))  # 20 failures
    shown = [r["id"] for r in records if r["verdict"] == "fail"][:7]
    text = RunSummary.of(records).table_text()
    assert "20 failing cases:" in text
    assert text.count("\n  fail ") == summary_mod.LISTED == 10
    assert "  ... 10 more (attnbench show RUN --all)" in text
    summary = RunSummary(shown=shown)
    for r in records:
        summary.add(r)
    text = summary.table_text()
    assert "20 failing cases (7 of them printed above as they came):" in text
    listed = [line.split()[1] for line in text.splitlines() if line.startswith("  fail ")]
    assert len(listed) == 10 and not {i[:10] for i in shown} & set(listed)
    assert "  ... 3 more (attnbench show RUN --all)" in text
    # every failure shown live: none listed again, nothing counted as more
    every = RunSummary(shown=[r["id"] for r in records if r["verdict"] == "fail"])
    for r in records:
        every.add(r)
    assert every.table_text().endswith("20 failing cases (20 of them printed above as they came)")


def test_the_summary_says_what_the_failures_share():
    lines = RunSummary.of(gqa()).common_text()
    assert lines == ["What the failing cases share:",
                     "  mutant.gqa_dkv_mean: 3 of 6 cases fail; 3 of 3 failures are heads_kv=2 "
                     "(every such case fails); only dK/dV fail; out, dQ are clean"]


def growing_dq(heads_kv, failing=()):
    """A dQ error growing 1.4x per doubling (a finding); ``failing``: tensors failing there."""
    return [case_record("fail" if failing else "pass", failing, seqlen=s, heads_kv=heads_kv,
                        error=2e-3 * 1.4 ** i) for i, s in enumerate(LADDER)]


def test_a_finding_on_a_failing_series_is_not_repeated(capsys):
    alone = RunSummary.of(growing_dq(4)).findings_text()
    assert alone[0].startswith("1 accuracy finding") and "FINDING" in alone[1]
    assert RunSummary.of(growing_dq(4)).exit_status(alone) == EXIT_FINDINGS
    # the same series with dQ failing: the failure says it; the finding is only counted
    failing = RunSummary.of(growing_dq(4, ("dq",)))
    lines = failing.findings_text()
    assert lines == ["(1 finding on series that already fail not repeated)"]
    assert failing.exit_status(lines) == EXIT_FAILURES
    # another tensor failing (dK) leaves dQ's finding standing; another series too
    assert "FINDING" in RunSummary.of(growing_dq(4, ("dk",))).findings_text()[1]
    both = RunSummary.of(growing_dq(4, ("dq",)) + growing_dq(2)).findings_text()
    assert both[0].startswith("1 accuracy finding") and "h4/2" in both[1]
    assert both[-1] == "(1 finding on series that already fail not repeated)"
    capsys.readouterr()


def test_show_prints_what_the_failures_share(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"run_id": "shared"}))
    with open(run / "records.jsonl", "w") as fh:
        for r in gqa():
            fh.write(json.dumps(r) + "\n")
    assert cli.main(["show", str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    at = out.index("What the failing cases share:")
    assert out[at - 1].startswith("  fail ") and "heads_kv=2 (every such case fails)" in out[at + 1]
