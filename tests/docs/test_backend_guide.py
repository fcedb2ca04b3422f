"""docs/backends.md cannot drift from the code, and its worked example runs as the guide says:
copied elsewhere, from another directory, with PYTHONPATH naming its folder."""

import dataclasses
import os
import re
import shutil
import subprocess

import pytest

from attnbench.backends.capabilities import Capabilities
from attnbench.problem.attn_spec import AttnSpec
from attnbench.results.store import load_records
from helpers import ROOT, attnbench_cmd

GUIDE = ROOT / "docs" / "backends.md"
EXAMPLES = ROOT / "docs" / "examples"
EXAMPLE = "mybackend:MyBackend"
BUGGY = "mybackend_bug:MyBackend"


def _table_names(marker: str) -> list[str]:
    """The first column's names of the table after ``<!-- marker`` in the guide."""
    text = GUIDE.read_text().split(f"<!-- {marker}", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in text.splitlines()[3:] if line.startswith("|")]
    return [name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])]


def test_the_capability_list_is_every_capability():
    # Mutant: a field added to Capabilities (or one dropped from the guide) fails here.
    assert _table_names("capabilities") == [f.name for f in dataclasses.fields(Capabilities)]


def test_every_spec_field_is_named():
    # Mutant: a field added to AttnSpec and not to the guide's table fails here.
    assert sorted(_table_names("spec fields")) == sorted(f.name for f in
                                                         dataclasses.fields(AttnSpec))


def test_the_guide_names_the_protocol_and_the_fix_the_error_points_to():
    from attnbench.backends import PROTOCOL
    from attnbench.backends.importable import FIX

    text = GUIDE.read_text()
    assert all(f"def {method}(" in text for method in PROTOCOL)
    anchor = FIX.rsplit("#", 1)[1]
    assert f'<a id="{anchor}"></a>' in text


@pytest.fixture(scope="module")
def example_run(tmp_path_factory):
    """The guide's example and a copy with one plausible bug, in a folder of their own, run from
    another directory with that folder on PYTHONPATH (the guide's command, one more backend)."""
    tmp = tmp_path_factory.mktemp("guide")
    (tmp / "pkg").mkdir()
    (tmp / "elsewhere").mkdir()
    shutil.copy(EXAMPLES / "mybackend.py", tmp / "pkg")
    shutil.copy(EXAMPLES / "mybackend.yaml", tmp / "pkg")
    source = (EXAMPLES / "mybackend.py").read_text()
    assert source.count("repeat_interleave(group, dim=1)") == 2
    # GQA's heads repeated in the wrong order (the MQA x ALiBi seed bug's cousin).
    (tmp / "pkg" / "mybackend_bug.py").write_text(
        source.replace("repeat_interleave(group, dim=1)", "repeat(1, group, 1, 1)"))
    env = dict(os.environ, PYTHONPATH=str(tmp / "pkg"), PYTHONWARNINGS="ignore")
    backends = f'backend=["{EXAMPLE}", naive, "{BUGGY}"]'
    proc = subprocess.run([*attnbench_cmd(), "run", str(tmp / "pkg" / "mybackend.yaml"),
                           "-s", backends, "--out", str(tmp / "run"), "--no-report"],
                          capture_output=True, text=True, cwd=tmp / "elsewhere", env=env,
                          timeout=600)
    return proc, load_records(tmp / "run")


def test_the_example_passes_from_another_directory(example_run):
    proc, records = example_run
    mine = [r for r in records if r["case"]["backend"] == EXAMPLE]
    verdicts = sorted(r["verdict"] for r in mine)
    assert verdicts == ["pass"] * 14 + ["unsupported"], proc.stdout + proc.stderr
    assert all(r["verdict"] == "pass" for r in records if r["case"]["backend"] == "naive")


def test_a_planted_bug_in_a_copy_of_the_example_is_caught(example_run):
    proc, records = example_run
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = [r for r in records if r["verdict"] == "fail"]
    assert failed and {r["case"]["backend"] for r in failed} == {BUGGY}
    # Only GQA: with one K/V head, or one per query head, both orders are the same.
    assert {(r["case"]["heads_q"], r["case"]["heads_kv"]) for r in failed} == {(4, 2)}


def test_without_pythonpath_validate_says_how_in_one_line(tmp_path):
    shutil.copy(EXAMPLES / "mybackend.yaml", tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([*attnbench_cmd(), "validate", str(tmp_path / "mybackend.yaml")],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "PYTHONPATH" in proc.stderr, proc.stderr
