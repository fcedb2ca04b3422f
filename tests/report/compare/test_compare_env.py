"""``attnbench compare`` on records with exact identity: "timed" is not judged (never a pass,
never a regression by itself), a noisy timing is AMBIGUOUS unless the intervals are apart,
H100 SXM against H100 PCIe is a ratio, and differences in driver, CUDA, torch, clocks, power
limit or commit are warnings. Synthetic runs (attnbench.report.synthetic) in both record
formats. About 20 s on 2 cores."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from attnbench.report import commands
from attnbench.report.compare.comparison import compare_runs, describe, run_facts
from attnbench.report.compare.gate import classify
from attnbench.report.read.reader import read_run
from attnbench.report.read.environment import env_view, representative, run_warnings
from report_runs import edit_run  # tests/support/ is on sys.path (pyproject: pythonpath)


def _compare(synthetic, a: str, b: str, capsys, out: Path | None = None):
    """(exit status, printed summary, Comparison) of ``attnbench compare A B``."""
    args = ["compare", str(synthetic[a]), str(synthetic[b])]
    args += ["--out", str(out)] if out else ["--no-dashboard"]
    rc = commands.main(args)
    text = capsys.readouterr().out
    return rc, text, compare_runs(read_run(synthetic[a]), read_run(synthetic[b]))


# --------------------------------------------------------------------------------------------
# timed: not judged


def test_pass_to_timed_is_not_a_change_nor_a_regression(synthetic, capsys, tmp_path):
    rc, out, comp = _compare(synthetic, "sxm", "sxm-timed", capsys, tmp_path / "cmp")
    p = comp.pairs
    assert rc == 0 and comp.regressions.empty, out
    timed = p[p.verdict_b == "timed"]
    assert len(timed) and set(timed.verdict_a) <= {"pass", "fail"}
    assert not timed.verdict_changed.any() and timed.not_judged.all()
    assert timed.worst_err_ratio.isna().all()  # no accuracy compared against an unjudged case
    assert set(timed.verdict_change) <= {"pass → not judged", "fail → not judged"}
    assert "verdicts: 0 changed" in out
    assert f"{len(timed)} not compared for accuracy: not judged in A or B" in out
    shown = out.split("dashboard:")[0].replace("sxm-timed", "").replace("timed only", "")
    assert "pass → not judged" in out and "timed" not in shown
    page = (tmp_path / "cmp" / "index.html").read_text()
    assert "not judged" in page and ">timed<" not in page
    assert "no regressions" in page


def test_timed_to_a_case_that_died_is_a_regression(synthetic, capsys, tmp_path):
    """A speed-only run that ran to the end, then the same case crashing: a regression on what
    both runs checked."""
    victim = next(json.loads(line)["id"] for line in
                  (synthetic["sxm-timed"] / "records.jsonl").read_text().splitlines()
                  if json.loads(line)["verdict"] == "timed")

    def crash(rec):
        if rec["id"] == victim:
            rec.update(verdict="crash", reason="rank 0 died with SIGSEGV (-11)", timing=None,
                       crash={"signal": "SIGSEGV", "exit_code": -11, "rank": 0})

    b = edit_run(synthetic["sxm-timed"], tmp_path / "crashed", crash)
    rc = commands.main(["compare", str(synthetic["sxm-timed"]), str(b), "--no-dashboard"])
    out = capsys.readouterr().out
    assert rc == 1 and "REGRESSIONS (1)" in out and "not judged -> crash" in out, out
    assert "verdicts: 1 changed (1 not judged → crash)" in out


# --------------------------------------------------------------------------------------------
# noisy: ambiguous


@pytest.mark.parametrize("noisy_side", ["a", "b"])
def test_a_noisy_timing_is_ambiguous_unless_the_intervals_are_apart(noisy_side):
    """Issue 27: a 10x slowdown was AMBIGUOUS because one side was noisy. Intervals apart by
    the threshold are SLOW (FAST) whatever the noise flag says; overlapping ones of a noisy
    timing are AMBIGUOUS, even where the medians agree."""
    fast, slow = (dict(median=1.0, min=0.98, q3=1.02), dict(median=1.3, min=1.2, q3=1.35))
    assert classify(fast, slow, 0.05) == "SLOW"
    a, b = ({**fast, "noisy": noisy_side == "a"}, {**slow, "noisy": noisy_side == "b"})
    assert classify(a, b, 0.05) == "SLOW" and classify(b, a, 0.05) == "FAST"
    ten_x = (dict(median=10.0, min=9.5, q3=10.4, noisy=True),
             dict(median=103.5, min=49.0, q3=160.0, noisy=True))  # wide, but apart
    assert classify(*ten_x, 0.05) == "SLOW"
    overlap = dict(median=1.3, min=1.05, q3=1.35, noisy=True)  # B's best within 5% of A's q3
    assert classify(fast, overlap, 0.05) == "AMBIGUOUS"
    same = dict(median=1.0, min=0.99, q3=1.01, noisy=True)
    assert classify(same, dict(median=1.0, min=0.99, q3=1.01), 0.05) == "AMBIGUOUS"


def test_a_slower_backend_whose_timings_never_settled_is_slow_only_where_apart(synthetic,
                                                                              capsys):
    rc, out, comp = _compare(synthetic, "sxm", "sxm-upgraded", capsys)
    p = comp.pairs
    triton = p[(p.backend_b == "triton") & (p.fwd_class != "n/a")]
    assert len(triton) and set(triton.fwd_noisy) == {"B"}
    named = comp.named(triton)  # the statistics, by the cases' ids (the pairs hold classes)
    q3_a = comp.a.frame.set_index("id").fwd_q3_ms.loc[named.id_a].to_numpy()
    min_b = comp.b.frame.set_index("id").fwd_min_ms.loc[named.id_b].to_numpy()
    apart = min_b > q3_a * 1.05
    assert 0 < apart.sum() < len(triton)  # both kinds are here: the test sees both rules
    assert set(triton[apart].fwd_class) == {"SLOW"}
    assert set(triton[~apart].fwd_class) == {"AMBIGUOUS"}
    n_ambiguous = int((triton.fwd_class == "AMBIGUOUS").sum())
    assert f"{n_ambiguous} too noisy: spread never settled" in out
    assert set(triton[~apart].fwd_why) == {"too noisy (B: spread never settled)"}
    assert rc == 1 and len(comp.regressions_on("speed"))  # 20% slower, apart: a regression
    others = p[(p.backend_b != "triton") & (p.fwd_class != "n/a")]
    assert (others.fwd_noisy == "").all()


def test_old_records_without_noisy_compare_as_before(synthetic):
    """h100 / h100-slower predate the noisy flag: triton is SLOW there (test_compare.py)."""
    comp = compare_runs(read_run(synthetic["h100"]), read_run(synthetic["h100-slower"]))
    assert (comp.pairs.fwd_noisy == "").all()
    assert "SLOW" in set(comp.pairs.fwd_class)


# --------------------------------------------------------------------------------------------
# exact kinds, environment warnings


def test_h100_sxm_against_h100_pcie_is_a_ratio_never_a_verdict(synthetic, capsys, tmp_path):
    rc, out, comp = _compare(synthetic, "sxm", "pcie", capsys, tmp_path / "cmp")
    p = comp.pairs
    assert rc == 0 and not p.same_kind.any()
    classes = set(p.fwd_class) | set(p.bwd_class)
    assert classes <= {"RATIO", "n/a"} and "RATIO" in classes
    assert 0.6 < p[p.fwd_class == "RATIO"].fwd_speed.median() < 0.9  # 756 / 989 TFLOP/s
    assert "GPU H100-SXM5-80GB → H100-PCIe-80GB" in out
    assert "H100-PCIe-80GB / H100-SXM5-80GB speed ratio" in out and "same family H100" in out
    # clocks and power limits follow from the kind: no warning for them across kinds
    assert "clocks" not in out and "power limit" not in out
    page = (tmp_path / "cmp" / "index.html").read_text()
    assert "H100-SXM5-80GB → H100-PCIe-80GB" in page and "family H100" in page


def test_driver_cuda_and_torch_upgrades_are_warning_lines(synthetic, capsys, tmp_path):
    rc, out, comp = _compare(synthetic, "sxm", "sxm-upgraded", capsys, tmp_path / "cmp")
    expected = ["runs differ in driver: 550.54.15 -> 560.35.03",
                "runs differ in CUDA: cuda_runtime 12.4 -> 12.6; cuda_driver_version 12.4 -> 12.6",
                "runs differ in torch: 2.5.1+cu124 -> 2.6.0+cu126"]
    assert comp.warnings == expected
    for line in expected:
        assert f"  warning: {line}\n" in out, out
    assert "differs: " not in out  # torch is a warning, not repeated as a fact
    page = (tmp_path / "cmp" / "index.html").read_text()
    assert all(f"<li>{html.escape(line)}</li>" in page for line in expected)


def test_clock_power_and_commit_changes_on_one_kind_are_warnings(synthetic, tmp_path):
    def retune(rec):
        env = rec["env"]
        env["identity"].update(sm_clock_app_mhz=1590, power_limit_w=500.0)
        env["software"].update(commit="fedcba9876543210", dirty=True)

    b = edit_run(synthetic["sxm"], tmp_path / "retuned", retune)
    comp = compare_runs(read_run(synthetic["sxm"]), read_run(b))
    assert comp.warnings == [
        "runs differ in clocks: sm_clock_app_mhz 1980 -> 1590",
        "runs differ in power limit: power_limit_w 700.0 -> 500.0",
        "runs differ in commit: commit 0123456789abcdef0123456789abcdef01234567 -> "
        "fedcba9876543210; dirty False -> True"]


def test_a_run_mixing_environments_on_one_kind_says_so(synthetic, tmp_path):
    def half_upgraded(rec):
        if int(rec["id"], 16) % 3 == 0:
            rec["env"]["software"]["torch"] = rec["env"]["torch"] = "2.6.0+cu126"

    b = edit_run(synthetic["sxm"], tmp_path / "resumed", half_upgraded)
    comp = compare_runs(read_run(synthetic["sxm"]), read_run(b))
    assert comp.warnings == ["run B (resumed) mixes 2 environments on H100-SXM5-80GB: "
                             "compared by its most common one"]


def test_run_facts_name_the_exact_hardware_and_software(synthetic):
    run = read_run(synthetic["sxm-upgraded"])
    facts = run_facts(run)
    assert facts["GPU"] == "H100-SXM5-80GB" and facts["family"] == "H100"
    assert facts["driver"] == "560.35.03" and facts["CUDA"] == "12.6"
    assert facts["torch"] == "2.6.0+cu126" and facts["commit"] == "0123456789ab"
    assert facts["measured matmul peak"] == "bf16 792 TFLOP/s"
    text = describe(run)
    for part in ("H100-SXM5-80GB (family H100)", "driver 560.35.03", "CUDA runtime 12.6",
                 "torch 2.6.0+cu126", "measured bf16 792 TFLOP/s"):
        assert part in text, text


def test_old_records_against_new_ones_still_compare(synthetic, capsys):
    """Coarse kind "H100" (records before exact identity) against "H100-SXM5-80GB": two kinds
    as far as anyone can tell, so ratios; only what both recorded is compared."""
    rc, out, comp = _compare(synthetic, "h100", "sxm", capsys)
    assert rc == 0 and set(comp.pairs.fwd_class) <= {"RATIO", "n/a"}
    assert comp.warnings == []  # the old records name no driver, CUDA or commit; same torch
    assert "GPU H100 → H100-SXM5-80GB" in out
    facts = run_facts(read_run(synthetic["h100"]))
    assert "driver" not in facts and "measured matmul peak" not in facts
    assert describe(read_run(synthetic["h100"])).startswith("h100 (H100; torch 2.5.1+cu124")


def test_environment_views_skip_what_a_record_does_not_say():
    old = {"host": "n1", "gpu_kind": "H100", "torch": "2.5.1", "device_name": "NVIDIA H100"}
    new = {"host": "n2", "gpu_kind": "H100-SXM5-80GB", "torch": "2.6.0",
           "identity": {"uuid": "GPU-1", "sm_clock_mhz": 345, "driver_version": None},
           "software": {"torch": "2.6.0", "driver_version": "560.35.03"}}
    assert env_view(old) == {"gpu_kind": "H100", "torch": "2.5.1", "device_name": "NVIDIA H100"}
    view = env_view(new)
    assert "uuid" not in view and "sm_clock_mhz" not in view and "host" not in view
    assert run_warnings(env_view(old), view) == ["runs differ in torch: 2.5.1 -> 2.6.0"]
    assert representative([{"env": {"host": "x"}}, {"env": new}, {"env": new}]) == view
    assert representative([]) == {}


@pytest.mark.parametrize("orjson_too", [True, False])
def test_environments_are_told_apart_as_json_tells_their_views(orjson_too, monkeypatch):
    """The tally's key (a view's canonical text; json's with ``default=str`` where a value is
    not JSON's): views equal as JSON share an environment, others do not, whichever writes it.
    Values that differ only in type or in JSON: 1 / 1.0 / true, [NaN] / [null], text / number.
    Mutants caught: keys as ``tuple(sorted(view.items()))`` (1, 1.0 and True one key, lists
    unhashable); orjson's text without the NaN fallback ([NaN] written as [null])."""
    from attnbench.report.read import canonical
    from attnbench.report.read import environment

    if not orjson_too:
        monkeypatch.setattr(environment, "canonical_text", canonical._json_text)
    values = [1, 1.0, True, None, float("nan"), float("inf"), "1", 2**70, "\ud800", [1, 2],
              [None], [float("nan")]]
    records = [{"env": {"gpu_kind": "H100", "identity": {"sm_count": v}}} for v in values]
    records += [{"env": {"gpu_kind": "H100", "identity": {"sm_count": 1}}},
                {"env": {"identity": {"sm_count": 1}, "gpu_kind": "H100"}},
                {"env": {"gpu_kind": "H100", "identity": {"sm_count": object()}}}]
    found = environment.environments(records)
    # None is dropped from a view, so it is the view without sm_count: its own environment
    assert len(found) == len(values) + 1
    assert found[0].records == 3 and found[0].view == {"gpu_kind": "H100", "sm_count": 1}
    assert [e.records for e in found[1:]] == [1] * len(values)
