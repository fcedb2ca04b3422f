"""A ``module:object`` backend that cannot be imported where the cases run is said in one line
by ``validate`` and ``run`` (exit 2), before any case runs -- not as one ``error`` per case
after each ran -- and the look imports nothing (a name in a sweep is not yet a backend)."""

import subprocess
import sys

from attnbench.backends.importable import third_party, unimportable
from helpers import attnbench_cmd

SWEEP = """name: unimportable
defaults: {batch: 1, seqlen_q: 32, heads_q: 2, head_dim: 16, seed: 0, dtype: fp32}
axes:
  backend: [naive, "nosuchmod:Backend"]
options: {timeout_s: 60}
"""


def _cli(tmp_path, *args):
    (tmp_path / "s.yaml").write_text(SWEEP)
    return subprocess.run([*attnbench_cmd(), *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)


def test_validate_names_the_backend_in_one_line_and_exits_2(tmp_path):
    # Mutant: validate without the look (the check of today, names only) exits 0.
    proc = _cli(tmp_path, "validate", "s.yaml")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "'nosuchmod:Backend'" in lines[0] and "PYTHONPATH" in lines[0]


def test_run_checks_on_the_workers_before_any_case(tmp_path):
    # Mutant: run without the look records 'nosuchmod:Backend' as an error case and exits 1.
    proc = _cli(tmp_path, "run", "s.yaml", "--out", "run", "--workers", "1", "--no-report")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "on worker" in errors[0] and "no case was run" in errors[0]
    assert not (tmp_path / "run").exists()  # nothing ran, nothing is left


def test_the_look_imports_nothing(tmp_path, monkeypatch):
    # A package whose __init__ and module write a file when run: located, neither runs.
    # Mutant: a look by importlib.import_module writes both files.
    pkg = tmp_path / "loudpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"open({str(tmp_path / 'init-ran')!r}, 'w')\n")
    (pkg / "mod.py").write_text(f"open({str(tmp_path / 'mod-ran')!r}, 'w')\n")
    monkeypatch.chdir(tmp_path)  # a rank's path starts at its directory
    assert unimportable(["loudpkg.mod:Backend"]) == {}
    missing = unimportable(["loudpkg.nothere:Backend", "loudpkg.mod.deeper:B"])
    assert "module 'loudpkg.nothere' is not importable" in missing["loudpkg.nothere:Backend"]
    assert "module 'loudpkg.mod.deeper' is not importable" in missing["loudpkg.mod.deeper:B"]
    assert not (tmp_path / "init-ran").exists() and not (tmp_path / "mod-ran").exists()
    assert "loudpkg" not in sys.modules


def test_only_module_object_names_are_looked_at():
    assert third_party(["naive", "a.b:C", "a.b:C", "entry"], ["naive", "entry"]) == ["a.b:C"]
