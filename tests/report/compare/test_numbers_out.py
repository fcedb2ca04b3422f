"""Numbers out, in the formats tools read: ``attnbench export`` (csv, parquet, json: one row per
case), ``attnbench compare --format json|markdown`` and ``--fail-on speed|accuracy|both``, and
why a comparison is AMBIGUOUS."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pandas as pd
import pytest

from attnbench.cli import main
from attnbench.errors import EXIT_BAD_INPUT, EXIT_FAILURES, EXIT_OK
from attnbench.report.compare.gate import classify
from attnbench.report.read.doubt import FEW_SAMPLES, timing_doubt, why_ambiguous
from helpers import ROOT

HOSTILE = "evil|<script>alert(1)</script>`*_"


def _rewrite(src: Path, dst: Path, edit: Callable[[dict], None]) -> Path:
    """A copy of run ``src`` whose records went through ``edit`` (timings made settled)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("dashboard", "compare-*", ".lock"))
    lines = []
    for line in (dst / "records.jsonl").read_text().splitlines():
        rec = json.loads(line)
        for d in ("fwd", "bwd"):
            stats = (rec.get("timing") or {}).get(d)
            if stats:
                stats.update(noisy=False, n=2 * FEW_SAMPLES)
        edit(rec)
        lines.append(json.dumps(rec))
    (dst / "records.jsonl").write_text("\n".join(lines) + "\n")
    return dst


def _slower(rec: dict) -> None:
    if rec["case"]["backend"] == "sdpa":
        for d in ("fwd", "bwd"):
            stats = (rec.get("timing") or {}).get(d) or {}
            for key in ("median_ms", "q1_ms", "q3_ms", "min_ms"):
                if isinstance(stats.get(key), float):  # 10x: past the upper fence of the
                    stats[key] *= 10  # tiny sweep's 3-5 samples on a loaded box (gate.bound)


def _one_fails(rec: dict) -> None:
    if rec["case"]["backend"] == "naive" and rec["case"]["seqlen_q"] == 32 and \
            rec["verdict"] == "pass":
        rec["verdict"], rec["reason"] = "fail", "dq: rel_l2 0.9 > bound 0.01"


@pytest.fixture(scope="module")
def gates(tiny, tmp_path_factory) -> dict[str, Path]:
    """base; slower (sdpa 10x as slow: speed only); failing (one pass -> fail: accuracy
    only); hostile (base with a backend named like an injection, in both)."""
    tmp = tmp_path_factory.mktemp("gates")
    runs = {"base": _rewrite(tiny, tmp / "base", lambda r: None),
            "slower": _rewrite(tiny, tmp / "slower", _slower),
            "failing": _rewrite(tiny, tmp / "failing", _one_fails)}

    def hostile(rec):
        if rec["case"]["backend"] == "sdpa":
            rec["case"]["backend"] = HOSTILE
            rec["label"] = rec["label"].replace("sdpa", HOSTILE)
    runs["hostile-a"] = _rewrite(tiny, tmp / "hostile-a", hostile)
    runs["hostile-b"] = _rewrite(tiny, tmp / "hostile-b", lambda r: (_slower(r), hostile(r)))
    return runs


# -- export ------------------------------------------------------------------------------------


def test_export_csv_json_and_parquet_hold_one_row_per_case(tiny, tmp_path, capsys):
    records = [json.loads(line) for line in (tiny / "records.jsonl").read_text().splitlines()]
    assert main(["export", str(tiny), "--format", "csv"]) == EXIT_OK
    df = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert len(df) == len({r["id"] for r in records})
    for column in ("run_id", "id", "backend", "verdict", "seqlen_q", "fwd_median_ms",
                   "fwd_tflops", "fwd_pct_peak", "bwd_q3_ms", "fwd_noisy", "out_rel_l2",
                   "dq_bound", "dv_ratio", "worst_over", "gpu_kind", "env_torch"):
        assert column in df, column
    assert list(df.columns[:5]) == ["run_id", "id", "label", "backend", "verdict"]
    passed = df[df.verdict == "pass"]
    assert passed.fwd_median_ms.notna().all() and passed.dq_rel_l2.notna().all()

    assert main(["export", str(tiny), "--format", "json"]) == EXIT_OK
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == len(df) and set(rows[0]) == set(df.columns)
    crash = next(r for r in rows if r["verdict"] == "crash")
    assert crash["fwd_median_ms"] is None  # missing is null, never NaN (not JSON)

    pytest.importorskip("pyarrow")
    out = tmp_path / "cases.parquet"
    assert main(["export", str(tiny), "--format", "parquet", "--out", str(out)]) == EXIT_OK
    back = pd.read_parquet(out)
    assert len(back) == len(df) and list(back.columns) == list(df.columns)
    assert back.fwd_median_ms.dropna().tolist() == pytest.approx(df.fwd_median_ms.dropna())


def test_export_concatenates_runs_and_keeps_a_window_mask_as_json(synthetic, capsys):
    a, b = synthetic["h100"], synthetic["a100"]
    assert main(["export", str(a), str(b), "--format", "csv"]) == EXIT_OK
    df = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert df.run_id.nunique() == 2
    masks = {m for m in df["mask"].dropna() if str(m).startswith("{")}
    for m in masks:
        assert isinstance(json.loads(m), dict)


def test_parquet_without_pyarrow_is_one_line_naming_the_package(tiny, tmp_path):
    shadow = tmp_path / "shadow" / "pyarrow"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no pyarrow (test)')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shadow.parent), str(ROOT)]),
               PYTHONWARNINGS="ignore")
    out = tmp_path / "cases.parquet"
    proc = subprocess.run([sys.executable, "-m", "attnbench", "export", str(tiny), "--format",
                           "parquet", "--out", str(out)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == EXIT_BAD_INPUT
    assert proc.stderr.strip().splitlines() == [
        "attnbench: error: --format parquet: needs the package pyarrow, which is not installed "
        "here (pip install pyarrow, or attnbench[parquet])"]
    assert not out.exists()


def test_export_of_a_bad_run_is_one_line(tmp_path, capsys):
    assert main(["export", str(tmp_path), "--format", "csv"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "records.jsonl" in err[0]


# -- compare: formats and gates ----------------------------------------------------------------


@pytest.mark.parametrize("pair, fail_on, status", [
    ("slower", "speed", EXIT_FAILURES), ("slower", "accuracy", EXIT_OK),
    ("slower", "both", EXIT_FAILURES),
    ("failing", "speed", EXIT_OK), ("failing", "accuracy", EXIT_FAILURES),
    ("failing", "both", EXIT_FAILURES),
])
def test_fail_on_gates_on_speed_accuracy_or_both(gates, pair, fail_on, status, capsys):
    argv = ["compare", str(gates["base"]), str(gates[pair]), "--no-dashboard",
            "--fail-on", fail_on, "--format", "json"]
    assert main(argv) == status
    body = json.loads(capsys.readouterr().out)
    assert body["fail_on"] == fail_on
    assert (body["regressions"] > 0) == (status == EXIT_FAILURES)
    regs = body["comparisons"][0]["regressions"]
    assert (len(regs) > 0) == (status == EXIT_FAILURES)
    if pair == "slower" and regs:
        assert all(r["backend"] == "sdpa" and any(w.startswith("SLOW") for w in r["what"])
                   for r in regs)
    if pair == "failing" and regs:
        assert all(r["what"] == ["pass -> fail"] for r in regs)


def test_compare_json_has_every_pair_and_no_nan(gates, capsys):
    assert main(["compare", str(gates["base"]), str(gates["slower"]), "--no-dashboard",
                 "--format", "json"]) == EXIT_FAILURES
    text = capsys.readouterr().out
    assert "NaN" not in text and "Infinity" not in text
    body = json.loads(text)
    comp = body["comparisons"][0]
    assert len(comp["pairs"]) == comp["matched"] > 0
    sdpa = [p for p in comp["pairs"] if p["backend"] == "sdpa" and p["fwd"]["class"] != "n/a"]
    assert sdpa and all(p["fwd"]["speed"] == pytest.approx(0.1) for p in sdpa)
    assert any(p["fwd"]["class"] == "SLOW" for p in sdpa)
    for p in sdpa:  # 10x as slow but a wide spread of a few samples: AMBIGUOUS, and why
        assert p["fwd"]["class"] in ("SLOW", "AMBIGUOUS")
        assert (p["fwd"]["why"] or "").startswith("too ") == (p["fwd"]["class"] != "SLOW")


def test_compare_markdown_is_a_pull_request_comment_that_escapes_the_runs_text(gates, capsys):
    assert main(["compare", str(gates["hostile-a"]), str(gates["hostile-b"]), "--no-dashboard",
                 "--format", "markdown"]) == EXIT_FAILURES
    text = capsys.readouterr().out
    assert text.startswith("### attnbench compare: ") and "regression" in text.splitlines()[0]
    assert "<script" not in text and "&lt;script>" in text
    assert "&gt;" not in text  # a lone > opens no tag: "pass -> fail" is kept as written
    rows = [line for line in text.splitlines() if line.startswith("| ") and "evil" in line]
    assert rows, text
    widths = {}  # unescaped | per row of each table: the header's
    for line in text.splitlines():
        if line.startswith("| case |"):
            header = line.count("|")
        elif line.startswith("| ") and "evil" in line:
            widths[line] = (line.count("|") - line.count("\\|"), header)
    assert widths and all(n == header for n, header in widths.values()), widths
    assert all("evil\\|" in row for row in rows)  # the backend's | cannot end a cell
    assert "| case | id | what | fwd | bwd |" in text


# -- why AMBIGUOUS -----------------------------------------------------------------------------


def test_ambiguous_says_too_few_samples_or_too_noisy():
    settled = dict(median=1.0, min=0.9, q1=0.95, q3=1.2, n=50)
    other = dict(median=1.1, min=0.95, q1=1.0, q3=1.3, n=50)
    assert classify(settled, other, 0.05) == "AMBIGUOUS"  # overlapping, medians 10% apart
    assert why_ambiguous(settled, other, 0.05).startswith("too noisy (intervals overlap: A IQR")
    few = {**other, "n": 3}
    assert why_ambiguous(settled, few, 0.05) == f"too few samples (B n=3 < {FEW_SAMPLES})"
    noisy = {**other, "noisy": True}
    assert why_ambiguous(noisy, other, 0.05) == "too noisy (A: spread never settled)"
    assert why_ambiguous({**settled, "n": 2}, noisy, 0.05).startswith("too few samples (A n=2")
    assert timing_doubt(settled) == "" and timing_doubt(few).startswith("too few samples")
    assert timing_doubt({**settled, "noisy": True}) == "too noisy (spread never settled)"


def test_compare_text_counts_why_pairs_are_ambiguous(tiny, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(tiny, copy, ignore=shutil.ignore_patterns("dashboard", ".lock"))
    main(["compare", str(tiny), str(copy), "--no-dashboard"])
    out = capsys.readouterr().out
    assert "AMBIGUOUS: " in out and "too few samples" in out  # the tiny sweep takes 5 samples


def test_show_all_prints_tflops_and_percent_of_peak_per_case(synthetic, capsys):
    assert main(["show", str(synthetic["sxm"]), "--all"]) == EXIT_OK
    lines = [line for line in capsys.readouterr().out.splitlines() if " fwd " in line]
    assert lines and all("TFLOP/s" in line and "% peak" in line for line in lines)
    assert any(c.isdigit() for line in lines for c in line.split("% peak")[0][-5:])
