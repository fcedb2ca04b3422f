"""``attnbench run`` of a broken kernel, as a user sees it (issue 39 item 7): a planted GQA bug
(``mutant.gqa_dkv_mean``: dK/dV averaged over the head group) fails every heads_kv=2 case. The
run prints the first SHOWN_LIVE failures as they come and counts the rest, its summary lists the
others (not those again), says what they share -- heads_kv=2, only dV (or dK/dV), the rest clean --
and ends with the dashboard's path; the exit status is 1 (failing cases)."""

import os
import subprocess

import pytest

from attnbench.dispatch.loop import SHOWN_LIVE
from attnbench.errors import EXIT_FAILURES
from attnbench.results.store import load_records
from helpers import ROOT, attnbench_cmd

SWEEP = """
name: shared
defaults: {batch: 1, heads_q: 4, head_dim: 16, seqlen_q: 32, dtype: fp32}
axes:
  backend: [mutant.gqa_dkv_mean]
  heads_kv: [4, 2]
  mask: [none, causal]
  seed: {range: [0, 5]}
options:
  timing: {enabled: false}
"""
FAILING = 12  # heads_kv=2: 2 masks x 6 seeds


@pytest.fixture(scope="module")
def broken_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shared")
    sweep = tmp / "shared.yaml"
    sweep.write_text(SWEEP)
    out = tmp / "run"
    proc = subprocess.run([*attnbench_cmd(), "run", str(sweep), "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=400,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    return out, proc


def test_the_planted_bug_fails_where_expected(broken_run):
    out, proc = broken_run
    assert proc.returncode == EXIT_FAILURES, proc.stdout + proc.stderr
    failing = [r for r in load_records(out) if r["verdict"] != "pass"]
    assert len(failing) == FAILING and {r["verdict"] for r in failing} == {"fail"}
    assert {r["case"]["heads_kv"] for r in failing} == {2}


def test_the_first_failures_are_shown_live_and_the_rest_counted(broken_run):
    _, proc = broken_run
    live = [line for line in proc.stderr.splitlines() if line.lstrip("\r\x1b[K").startswith(
        "  FAIL ")]
    assert len(live) == SHOWN_LIVE, proc.stderr
    assert f"  ... and {FAILING - SHOWN_LIVE} more failures" in proc.stderr


def test_the_summary_lists_the_others_and_names_what_they_share(broken_run):
    _, proc = broken_run
    lines = proc.stdout.splitlines()
    assert f"{FAILING} failing cases ({SHOWN_LIVE} of them printed above as they came):" in lines
    listed = [line for line in lines if line.startswith("  fail ")]
    shown = {line.split()[1] for line in proc.stderr.splitlines() if "  FAIL " in line}
    assert len(listed) == FAILING - SHOWN_LIVE and not {line.split()[1] for line in listed} & shown
    at = lines.index("What the failing cases share:")
    shared = (f"  mutant.gqa_dkv_mean: {FAILING} of 24 cases fail; {FAILING} of {FAILING} "
              "failures are heads_kv=2 (every such case fails); only ")
    assert lines[at + 1].startswith(shared), lines[at + 1]
    # Both halves of the mutant take effect (its dK half was lost until mutated() kept a
    # chain's edits); dQ's identity residual fails with dK wrong but dQ's own checks pass.
    assert lines[at + 1][len(shared):] == "dK/dV fail; out, dQ, lse are clean"
    assert "FINDING" not in proc.stdout


def test_the_dashboard_path_is_the_last_line(broken_run):
    out, proc = broken_run
    last = proc.stdout.rstrip("\n").splitlines()[-1]
    assert last == f"attnbench: dashboard {out / 'dashboard' / 'index.html'}", proc.stdout
