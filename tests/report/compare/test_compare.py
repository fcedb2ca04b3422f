"""``attnbench compare``: robust timing classes, never a verdict across GPU kinds, verdict
changes, the exit status that gates CI, bad input. Real records (the tiny sweep, edited to
make a regression) and synthetic GPU runs. About 30 s on 2 cores."""

from __future__ import annotations

import math

import pytest

from attnbench.report import commands
from attnbench.report.compare.comparison import compare_runs
from attnbench.report.compare.gate import bound, classify
from attnbench.report.read.reader import read_run
from attnbench.results.store import load_records
from attnbench.report.synthetic import write_synthetic_run
from report_runs import edit_run  # tests/support/ is on sys.path (pyproject: pythonpath)


def _stats(median, lo, q3):
    return {"median": median, "min": lo, "q3": q3}


@pytest.mark.parametrize("a, b, expected", [
    (_stats(1.00, 0.98, 1.02), _stats(1.30, 1.20, 1.35), "SLOW"),        # clear gap
    (_stats(1.30, 1.20, 1.35), _stats(1.00, 0.98, 1.02), "FAST"),
    (_stats(1.00, 0.98, 1.02), _stats(1.01, 0.99, 1.03), "SAME"),
    (_stats(1.00, 0.98, 1.02), _stats(1.06, 1.05, 1.08), "AMBIGUOUS"),   # gap under 5%
    (_stats(1.00, 0.70, 1.40), _stats(1.20, 0.90, 1.60), "AMBIGUOUS"),   # noisy: overlap
    (_stats(1.00, 0.98, 1.02), _stats(math.nan, 1.0, 1.0), "n/a"),
    (_stats(1.00, 0.98, 1.02), _stats(None, None, None), "n/a"),
])
def test_classify(a, b, expected):
    assert classify(a, b, 0.05) == expected


def test_threshold_moves_the_line():
    a, b = _stats(1.00, 0.98, 1.02), _stats(1.10, 1.09, 1.12)
    assert classify(a, b, 0.05) == "SLOW"
    assert classify(a, b, 0.10) == "AMBIGUOUS"


# --------------------------------------------------------------------------------------------
# real records


def test_real_run_against_itself_is_all_same(tiny, capsys, tmp_path):
    again = edit_run(tiny, tmp_path / "again", lambda rec: None)
    rc = commands.main(["compare", str(tiny), str(again), "--no-dashboard"])
    out = capsys.readouterr().out
    assert rc == 0, out
    comp = compare_runs(read_run(tiny), read_run(again))
    timed = comp.pairs[comp.pairs.fwd_class != "n/a"]
    assert len(timed)
    for d in ("fwd", "bwd"):  # CPU timings that never settled are AMBIGUOUS, even with themselves
        noisy = timed[f"{d}_noisy"] != ""
        assert set(timed[~noisy][f"{d}_class"]) <= {"SAME"}
        assert set(timed[noisy][f"{d}_class"]) <= {"AMBIGUOUS"}
    assert "no regressions" in out


def test_real_run_with_a_slower_case_and_a_new_failure_exits_1(tiny, capsys, tmp_path):
    records = load_records(tiny)
    timed = [r for r in records if r["verdict"] == "pass" and r.get("timing")]
    slow_id, broken_id = timed[0]["id"], timed[1]["id"]
    # slower by more than the case's own spread, whatever this CPU's timing noise was: past
    # its upper fence (the tiny sweep's timings have under FEW_SAMPLES samples, gate.bound)
    spread = max(bound({"q1": t["q1_ms"], "q3": t["q3_ms"]}, few=True) / t["min_ms"]
                 for t in (timed[0]["timing"][d] for d in ("fwd", "bwd")))
    factor = 1.5 * spread

    def settle(rec):
        # The tiny sweep's CPU timings rarely settle in its short time cap, and a noisy timing
        # is AMBIGUOUS by design (test_compare_env.py): the slowed case is marked settled in
        # both runs, so that this test is about the robust intervals.
        if rec["id"] == slow_id:
            for d in ("fwd", "bwd"):
                rec["timing"][d]["noisy"] = False

    def edit(rec):
        settle(rec)
        rec["case"]["gpu"] = "elsewhere"  # matching ignores the gpu field (and so the id)
        rec["id"] = rec["id"][::-1]
        if rec["id"][::-1] == slow_id:
            for d in ("fwd", "bwd"):
                t = rec["timing"][d]
                for k in ("median_ms", "q1_ms", "q3_ms", "min_ms"):
                    t[k] *= factor
        if rec["id"][::-1] == broken_id:  # died before reaching a device: no env.gpu_kind
            rec.update(verdict="crash", reason="rank 0 died with SIGSEGV (-11)", accuracy=None,
                       timing=None, env={"host": rec["env"]["host"]},
                       crash={"signal": "SIGSEGV", "exit_code": -11, "rank": 0,
                              "stderr_tail": "", "traceback": ""})

    a = edit_run(tiny, tmp_path / "a", settle)
    b = edit_run(tiny, tmp_path / "b", edit)
    rc = commands.main(["compare", str(a), str(b), "--out", str(tmp_path / "cmp")])
    out = capsys.readouterr().out
    assert rc == 1, out
    comp = compare_runs(read_run(a), read_run(b))
    assert len(comp.pairs) == len(records) and comp.only_a.empty and comp.only_b.empty
    reg = comp.regressions
    assert set(reg.id_b.str[::-1]) == {slow_id, broken_id}
    named = comp.named(comp.pairs)
    slow = named[named.id_b.str[::-1] == slow_id].iloc[0]
    assert slow.fwd_class == "SLOW" and slow.bwd_class == "SLOW"
    assert "REGRESSIONS (2)" in out and "pass -> crash" in out
    assert f"SLOW fwd {100 * (factor - 1):+.1f}% time" in out
    page = (tmp_path / "cmp" / "index.html").read_text()
    assert "2 regression(s): exit status 1" in page
    assert (tmp_path / "cmp" / "c01-speed.png").exists()


# --------------------------------------------------------------------------------------------
# synthetic GPU runs


def test_slower_backend_on_the_same_gpu_is_found_and_gates(synthetic, capsys, tmp_path):
    rc = commands.main(["compare", str(synthetic["h100"]), str(synthetic["h100-slower"]),
                        "--out", str(tmp_path / "cmp")])
    out = capsys.readouterr().out
    assert rc == 1
    comp = compare_runs(read_run(synthetic["h100"]), read_run(synthetic["h100-slower"]))
    p = comp.pairs
    slow = p[(p.fwd_class == "SLOW") | (p.bwd_class == "SLOW")]
    assert set(slow.backend_b) == {"triton"}  # only the 20% slower backend
    triton_timed = p[(p.backend_b == "triton") & (p.fwd_class != "n/a")]
    assert (triton_timed.fwd_class == "SLOW").all() and (triton_timed.bwd_class == "SLOW").all()
    others = p[(p.backend_b != "triton") & (p.fwd_class != "n/a")]
    assert set(others.fwd_class) | set(others.bwd_class) <= {"SAME", "AMBIGUOUS"}
    changed = p[p.verdict_changed]
    assert list(changed.verdict_change) == ["pass → fail"]
    assert changed.worst_err_ratio.iloc[0] > 2
    assert "  warning: runs differ in torch: 2.5.1+cu124 -> 2.6.0+cu126\n" in out
    assert "triton:" in out and "slower" in out


def test_different_gpu_kinds_are_ratios_never_verdicts(synthetic, capsys):
    rc = commands.main(["compare", str(synthetic["h100"]), str(synthetic["a100"]),
                        "--no-dashboard"])
    out = capsys.readouterr().out
    assert rc == 0  # an A100 is slower than an H100: not a regression
    comp = compare_runs(read_run(synthetic["h100"]), read_run(synthetic["a100"]))
    assert len(comp.pairs) == len(load_records(synthetic["h100"]))  # gpu field ignored
    classes = set(comp.pairs.fwd_class) | set(comp.pairs.bwd_class)
    assert classes <= {"RATIO", "n/a"} and "RATIO" in classes
    ratio = comp.pairs[comp.pairs.fwd_class == "RATIO"].fwd_speed.median()
    assert 0.2 < ratio < 0.5  # 312 / 989 TFLOP/s peaks
    assert "GPU H100 → A100" in out and "ratio only" in out


def test_a_run_with_two_gpu_kinds_pairs_each_kind(synthetic):
    comp = compare_runs(read_run(synthetic["h100"]), read_run(synthetic["mixed"]))
    same, cross = comp.pairs[comp.pairs.same_kind], comp.pairs[~comp.pairs.same_kind]
    n = len(load_records(synthetic["h100"]))
    assert len(same) == n and set(same.run_gpu_b) == {"H100"}
    assert len(cross) == n and set(cross.run_gpu_b) == {"A100"}
    assert set(cross.fwd_class) <= {"RATIO", "n/a"}


def test_same_sweep_rerun_is_not_a_regression(synthetic, tmp_path):
    rerun = write_synthetic_run(tmp_path / "rerun", size="small", seed=7)  # new samples only
    comp = compare_runs(read_run(synthetic["h100"]), read_run(rerun))
    classes = set(comp.pairs.fwd_class) | set(comp.pairs.bwd_class)
    assert "SLOW" not in classes and "FAST" not in classes
    assert comp.regressions.empty


def test_three_runs_compare_each_with_the_first(synthetic, capsys, tmp_path):
    rc = commands.main(["compare", str(synthetic["h100"]), str(synthetic["a100"]),
                        str(synthetic["h100-slower"]), "--out", str(tmp_path / "cmp")])
    out = capsys.readouterr().out
    assert rc == 1 and out.count("A (baseline) = h100 ") == 2
    page = (tmp_path / "cmp" / "index.html").read_text()
    assert 'id="pair1"' in page and 'id="pair2"' in page


# --------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("args, message", [
    (["{a}"], "at least two run directories"),
    (["{a}", "{missing}"], "no such run directory"),
    (["{a}", "{a}"], "is given twice"),
    (["{a}", "{empty}"], "records.jsonl: no such file"),
    (["{a}", "{b}", "--threshold", "1.5"], "--threshold: got 1.5"),
])
def test_bad_input_is_exit_2(synthetic, tmp_path, capsys, args, message):
    (tmp_path / "empty").mkdir()
    names = {"a": synthetic["h100"], "b": synthetic["a100"], "missing": tmp_path / "missing",
             "empty": tmp_path / "empty"}
    rc = commands.main(["compare", *[a.format(**names) for a in args], "--no-dashboard"])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err, err
