"""Installs that fit where people are: the wheel holds one top-level package (``attnbench``; our
Triton kernels as ``attnbench.kernels``, never PyPI's ``kernels``), Triton is a Linux-only
requirement with the ``triton`` backend ``unsupported`` where it is absent, and the commands that
only read results never import torch or triton."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers import ROOT

READ_ONLY_TIMEOUT_S = 600  # report draws figures: minutes on a loaded 2-core machine


def _requirement(name: str):
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    Requirement = pytest.importorskip("packaging.requirements").Requirement

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    found = [Requirement(d) for d in deps if Requirement(d).name == name]
    assert len(found) == 1, deps
    return found[0]


# -- the package's name on the index -----------------------------------------------------------


def _builds_wheels_itself() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    version = tuple(int(p) for p in setuptools.__version__.split(".")[:2] if p.isdigit())
    return version >= (70, 1)  # bdist_wheel moved into setuptools in 70.1


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """A wheel built from a copy of the project's files (the checkout stays clean): with this
    venv's setuptools when it builds wheels by itself (>= 70.1), else in pip's isolated build
    environment, as `pip install` does."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("attnbench", "kernels"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    out = tmp_path_factory.mktemp("wheel")
    isolation = ["--no-build-isolation"] if _builds_wheels_itself() else []
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q",
                           "-w", str(out), str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return zipfile.ZipFile(next(out.glob("attnbench-*.whl")))


def test_the_wheel_installs_one_top_level_package_and_the_kernels_inside_it(wheel):
    names = wheel.namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"attnbench"}, sorted(tops)
    for module in ("__init__", "flash_fwd", "flash_bwd", "dropout", "common", "params",
                   "configs", "compile_check"):
        assert f"attnbench/kernels/{module}.py" in names
    # every subpackage of the checkout is in the wheel (setup.py finds them; nothing to list)
    for init in (ROOT / "attnbench").rglob("__init__.py"):
        assert init.relative_to(ROOT).as_posix() in names
    top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert wheel.read(top_level).decode().split() == ["attnbench"]


def _top_level_kernels(path: Path, root: Path = ROOT) -> list[str]:
    """Imports of ``kernels`` / ``kernels.x`` and module names ``"kernels.x"`` (``-m``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value] if node.value.startswith("kernels.") else []
        found += [f"{path.relative_to(root)}:{node.lineno}: {n}" for n in names
                  if n == "kernels" or n.startswith("kernels.")]
    return found


def test_nothing_imports_a_top_level_kernels_package(tmp_path):
    """`import kernels` would find Hugging Face's package once both are installed."""
    offenders = [hit for folder in ("attnbench", "kernels", "tests", "benchmarks")
                 for path in (ROOT / folder).rglob("*.py") if path != Path(__file__).resolve()
                 for hit in _top_level_kernels(path)]
    assert offenders == []
    bad = tmp_path / "bad.py"  # the check catches what it is for
    bad.write_text("import kernels\nfrom kernels.params import x\nm = 'kernels.compile_check'\n")
    assert [h.split(": ")[1] for h in _top_level_kernels(bad, tmp_path)] == [
        "kernels", "kernels.params", "kernels.compile_check"]


# -- Triton: Linux only ------------------------------------------------------------------------


def test_triton_is_required_on_linux_only():
    triton = _requirement("triton")
    assert triton.marker is not None
    assert triton.marker.evaluate({"sys_platform": "linux"})
    for platform in ("darwin", "win32"):
        assert not triton.marker.evaluate({"sys_platform": platform})
    assert _requirement("torch").marker is None


def test_without_triton_a_triton_case_is_unsupported_with_the_reason():
    code = ("import sys; sys.modules['triton'] = None\n"
            "from attnbench.execution.case_runner import run_case\n"
            "from attnbench.sweep.options import RunOptions\n"
            "from attnbench.sweep.case import make_case\n"
            "case = make_case('t', {'backend': 'triton', 'dtype': 'fp32', 'seqlen_q': 16,\n"
            "                       'heads_q': 2, 'head_dim': 16})\n"
            "import json; r = run_case(case, RunOptions())\n"
            "print(json.dumps([r['verdict'], r['reason']]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    verdict, reason = json.loads(proc.stdout.strip().splitlines()[-1])
    assert verdict == "unsupported"
    assert "triton is not installed here" in reason and "Linux" in reason


# -- commands that only read results -----------------------------------------------------------


@pytest.fixture
def no_torch(tmp_path_factory) -> tuple[dict, Path]:
    """An environment whose torch and triton fail to import, and leave a mark when tried."""
    shadow = tmp_path_factory.mktemp("no-torch")
    marks = shadow / "marks"
    marks.mkdir()
    for name in ("torch", "triton"):
        (shadow / name).mkdir()
        (shadow / name / "__init__.py").write_text(
            f"open({str(marks / name)!r}, 'a').write('imported\\n')\n"
            f"raise ImportError('{name} is not installed here (test)')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shadow), str(ROOT)]),
               PYTHONWARNINGS="ignore")
    return env, marks


@pytest.mark.parametrize("command", [
    ["validate", "{sweep}", "--list"],
    ["show", "{run}", "--all"],
    ["report", "{run}", "--out", "{tmp}/report"],
    ["compare", "{run}", "{copy}", "--out", "{tmp}/compare"],
    ["compare", "{run}", "{copy}", "--no-dashboard", "--format", "markdown"],
    ["export", "{run}", "--format", "csv", "--out", "{tmp}/cases.csv"],
    ["export", "{run}", "--format", "json"],
])
def test_reading_results_never_imports_torch_or_triton(command, no_torch, tiny, tmp_path):
    env, marks = no_torch
    copy = tmp_path / "copy"
    shutil.copytree(tiny, copy, ignore=shutil.ignore_patterns("dashboard", ".lock"))
    argv = [a.format(sweep=ROOT / "sweeps" / "smoke.yaml", run=tiny, copy=copy, tmp=tmp_path)
            for a in command]
    proc = subprocess.run([sys.executable, "-m", "attnbench", *argv], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=READ_ONLY_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in marks.iterdir()) == [], "imported torch or triton"


def test_the_no_torch_environment_does_catch_an_import(no_torch, tmp_path):
    """The check above is only as good as its trap: a command that imports torch is caught."""
    env, marks = no_torch
    proc = subprocess.run([sys.executable, "-m", "attnbench", "backends"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode != 0 or (marks / "torch").exists()
    assert (marks / "torch").exists()
