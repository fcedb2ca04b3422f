"""Offline installs (issue #24): the wheelhouse carries what a fresh GPU box lacks and nothing of
its GPU stack, installs with no index, and a bare checkout finds ``attnbench.kernels``.

No network here: the recipe is checked against this venv's installed metadata and synthetic
resolutions; ``make rehearsal`` (CI, after the tests) builds and installs a real wheelhouse.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from attnbench.errors import UserError
from attnbench.offline.box import (BOX_HAS, BOX_LACKS, NEVER_CARRIED, canonical, never_carried,
                                   target_environment)
from attnbench.offline.closure import carried
from attnbench.offline.install import (PIP_ISOLATED_ENV, check_target, install_wheelhouse,
                                      pip_command, wheels_of)
from attnbench.offline.verify import check_environment
from attnbench.offline.wheelhouse import manifest_text
from helpers import ROOT

ISSUE_LACKS = {"dask", "distributed", "tornado", "partd", "locket", "tblib", "zict"}
"""What issue #24 found missing on the fresh H200 box (bokeh and xyzservices too, optional)."""
OPTIONAL_IMPORTS = {
    "pynvml": "the nvml extra (hardware identity falls back to torch)",
    "pyarrow": "the parquet extra (export --format parquet)",
    "orjson": "the fast extra (journal parsing ~3x faster; json gives the same values)",
    "dask_jobqueue": "the slurm extra (--cluster slurm)",
    "flash_attn": "an adapter: unavailable when absent",
    "flash_attn_interface": "an adapter (FA3): unavailable when absent",
    "transformer_engine": "an adapter: unavailable when absent",
    "xformers": "an adapter: unavailable when absent",
    "pip": "attnbench.offline's packaging on a bare python3 (pip builds and installs there)",
}
"""Third-party imports that no runtime requirement covers, each with why that is right."""


# -- what is carried ---------------------------------------------------------------------------

def _pyproject_requirements() -> list[str]:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def _installed_resolution() -> dict[str, dict]:
    """This venv as pip's report would give it: what `make test` installed is the closure."""
    return {canonical(d.metadata["Name"]): {"name": d.metadata["Name"], "version": d.version,
                                            "requires_dist": d.requires or []}
            for d in importlib.metadata.distributions()}


def _here() -> dict[str, str]:
    return target_environment("%d.%d.%d" % sys.version_info[:3])


def _pins(box_has=BOX_HAS, roots=None) -> set[str]:
    roots = _pyproject_requirements() if roots is None else roots
    return {canonical(p.name) for p in carried(_installed_resolution(), roots, _here(), box_has)}


def test_the_wheelhouse_carries_what_the_box_lacks_and_nothing_it_has():
    pins = _pins()
    assert ISSUE_LACKS <= BOX_LACKS
    assert BOX_LACKS <= pins, f"not carried: {BOX_LACKS - pins}"
    assert not BOX_LACKS & BOX_HAS
    assert not pins & {canonical(n) for n in BOX_HAS}
    assert [p for p in pins if never_carried(p)] == []


def test_the_carried_set_has_teeth():
    """Taking tornado for something the box has, or asking for dask without its distributed
    extra, leaves out what the box lacks: the test above would see it."""
    assert "tornado" not in _pins(box_has=BOX_HAS | {"tornado"})
    roots = [r.replace("dask[distributed]", "dask") for r in _pyproject_requirements()]
    assert "distributed" not in _pins(roots=roots)


def _third_party_imports() -> dict[str, list[str]]:
    """Top-level names attnbench and its kernels import (function bodies too) or read
    resources of (``importlib.resources.files("bokeh")``), with where."""
    found: dict[str, list[str]] = {}
    std = set(sys.stdlib_module_names) | {"attnbench"}
    for path in [*(ROOT / "attnbench").rglob("*.py"), *(ROOT / "kernels").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "files"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                names = [str(node.args[0].value)]
            else:
                continue
            for name in (n.split(".")[0] for n in names):
                if name not in std:
                    found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def _uncovered(imports: dict[str, list[str]]) -> dict[str, list[str]]:
    """Imports neither the box's own (torch, triton), nor something it has, nor carried, nor
    optional with a reason."""
    by_module = importlib.metadata.packages_distributions()
    pins, box = _pins(), {canonical(n) for n in BOX_HAS}
    uncovered = {}
    for name, where in imports.items():
        dists = {canonical(d) for d in by_module.get(name, [name])}
        if name not in OPTIONAL_IMPORTS and not any(
                d in pins or d in box or never_carried(d) for d in dists):
            uncovered[name] = sorted(set(where))[:3]
    return uncovered


def test_every_runtime_import_is_on_the_box_or_in_the_wheelhouse():
    """An import of a package that no requirement names fails here before it fails on the
    box."""
    imports = _third_party_imports()
    assert {"dask", "distributed", "bokeh", "yaml", "torch", "triton"} <= set(imports)
    assert _uncovered(imports) == {}


def test_the_import_check_has_teeth():
    """hypothesis is installed here (the test extra) but no runtime requirement brings it."""
    assert _uncovered({"hypothesis": ["attnbench/x.py"], "tblib": ["attnbench/y.py"]}) == {
        "hypothesis": ["attnbench/x.py"]}


# -- the walk: the box's markers, extras, what is never carried --------------------------------

RESOLVED = {
    "dask": {"name": "dask", "version": "2026.8.0", "requires_dist": [
        "toolz>=0.12", 'importlib_metadata>=4.13; python_version < "3.12"',
        'distributed==2026.8.0; extra == "distributed"', 'numpy; extra == "array"']},
    "distributed": {"name": "distributed", "version": "2026.8.0", "requires_dist": [
        "tornado>=6.2", "torch>=2", "nvidia-cublas-cu12", "triton"]},
    "tornado": {"name": "tornado", "version": "6.5", "requires_dist": []},
    "toolz": {"name": "toolz", "version": "1.0", "requires_dist": []},
    "importlib-metadata": {"name": "importlib_metadata", "version": "8.0", "requires_dist": []},
}


def _walk(python_version: str, roots=("dask[distributed]>=2024.8",), **kw) -> list[str]:
    return [str(p) for p in carried(RESOLVED, roots, target_environment(python_version),
                                    {"toolz"}, **kw)]


def test_markers_are_judged_for_the_box_not_for_this_python():
    """pip judges markers by the Python it runs in; the box is 3.12."""
    assert _walk("3.12") == ["dask==2026.8.0", "distributed==2026.8.0", "tornado==6.5"]
    assert "importlib_metadata==8.0" in _walk("3.11")


def test_extras_are_followed_only_when_asked_and_the_gpu_stack_never():
    assert _walk("3.12", roots=["dask"]) == ["dask==2026.8.0"]
    assert not [p for p in _walk("3.12") if never_carried(p.split("==")[0])]
    assert {"torch", "triton"} <= NEVER_CARRIED
    for name in ("torch", "triton", "nvidia-cudnn-cu13", "nvidia_cublas", "cuda-bindings"):
        assert never_carried(name), name
    assert not never_carried("dask") and not never_carried("tornado")


def test_left_out_names_take_what_only_they_need():
    assert _walk("3.12", left_out=["distributed"]) == ["dask==2026.8.0"]


@pytest.mark.parametrize("roots, message", [
    (["dask[array]"], "numpy (needed by dask[array]) is not in pip's resolution"),
    (["dask>=2030"], "dask: pip resolved 2026.8.0, attnbench needs dask>=2030"),
    (["dask[distributed"], "attnbench: requirement 'dask[distributed' is not PEP 508"),
])
def test_a_resolution_that_does_not_fit_is_one_line(roots, message):
    with pytest.raises(UserError) as err:
        _walk("3.12", roots=roots)
    assert message in str(err.value) and "\n" not in str(err.value)


# -- installing: no index, no dependencies, never the GPU stack -------------------------------

def _wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A minimal pure-Python wheel."""
    dist = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    meta = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                    *(f"Requires-Dist: {r}\n" for r in requires)])
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}/__init__.py", "")
        archive.writestr(f"{dist}/METADATA", meta)
        archive.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                                          "Root-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{dist}/RECORD", "")
    return path


def test_the_install_command_looks_nowhere_but_the_wheels():
    command = pip_command([Path("a.whl")], Path("/p"))
    for flag in ("--no-index", "--no-deps", "--target"):
        assert flag in command
    assert not [a for a in command if re.match(r"--(find-links|index-url|extra-index-url)", a)]
    assert PIP_ISOLATED_ENV["PIP_NO_INDEX"] == "1"


@pytest.mark.parametrize("wheels, message", [
    ([("dask", "1.0")], "no attnbench wheel"),
    ([("attnbench", "0.1"), ("torch", "2.11.0")], "the box's own torch is never installed"),
    ([("attnbench", "0.1"), ("nvidia_cudnn_cu13", "9.0")], "nvidia-cudnn-cu13 is never"),
    ([("attnbench", "0.1"), ("dask", "1.0"), ("dask", "2.0")], "a second dask wheel"),
])
def test_a_wheelhouse_with_the_gpu_stack_or_two_versions_is_refused(tmp_path, wheels, message):
    for name, version in wheels:
        _wheel(tmp_path, name, version)
    with pytest.raises(UserError) as err:
        wheels_of(tmp_path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_wheelhouse_for_another_python_is_refused(tmp_path):
    """A 3.12 wheelhouse lacks importlib_metadata, which dask needs below 3.12."""
    text = manifest_text(Path("attnbench-0.1.0-py3-none-any.whl"), [], "3.12", ["x"], [])
    (tmp_path / "wheelhouse.txt").write_text(text)
    check_target(tmp_path, (3, 12))
    with pytest.raises(UserError, match=r"built for CPython 3\.12, this is 3\.11: rebuild with "
                                        r"`make wheelhouse PYTHON_VERSION=3\.11`"):
        check_target(tmp_path, (3, 11))


def test_a_wheelhouse_installs_into_a_prefix_without_an_index(tmp_path, monkeypatch):
    """pip's configured index and find-links are ignored: a decoy there is never taken."""
    house, decoy, prefix = tmp_path / "whl", tmp_path / "decoy", tmp_path / "prefix"
    house.mkdir()
    decoy.mkdir()
    _wheel(house, "attnbench", "0.0.1", ("fakedep>=1",))
    _wheel(house, "fakedep", "1.0")
    _wheel(decoy, "fakedep", "9.0")
    monkeypatch.setenv("PIP_FIND_LINKS", str(decoy))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    assert len(install_wheelhouse(house, prefix)) == 2
    assert sorted(p.name for p in prefix.glob("*.dist-info")) == [
        "attnbench-0.0.1.dist-info", "fakedep-1.0.dist-info"]


# -- verifying on the box ----------------------------------------------------------------------

def test_this_venv_meets_every_requirement():
    verdict = check_environment()
    assert verdict.problems == []
    assert {"attnbench", "dask", "distributed", "tornado", "torch"} <= set(verdict.met)


def test_a_missing_or_old_requirement_and_a_torch_from_the_prefix_are_named(tmp_path,
                                                                            monkeypatch):
    _wheel(tmp_path, "fakeroot", "1.0", ("no-such-dist>=1", "pip>=999"))
    with zipfile.ZipFile(next(tmp_path.glob("fakeroot-*.whl"))) as archive:
        archive.extractall(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    problems = check_environment(root="fakeroot").problems
    assert any(p.startswith("no-such-dist: missing, needed by fakeroot 1.0") for p in problems)
    assert any(p.startswith("pip ") and "needs pip>=999" in p for p in problems)
    torch_site = Path(importlib.util.find_spec("torch").origin).parent.parent
    problems = check_environment(prefix=torch_site).problems
    assert any(p.startswith("torch: imported from") and "inside the prefix" in p
               for p in problems)


# -- a bare checkout ---------------------------------------------------------------------------

def _kernels_spec(path: Path) -> str:
    """Where ``attnbench.kernels`` is found with only ``path`` on sys.path (no site: no
    editable install's finder)."""
    code = ("import sys, importlib.util; sys.path.insert(0, sys.argv[1])\n"
            "spec = importlib.util.find_spec('attnbench.kernels')\n"
            "print(spec.origin if spec else None)")
    proc = subprocess.run([sys.executable, "-S", "-c", code, str(path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_bare_checkout_finds_its_kernels():
    assert _kernels_spec(ROOT) == str(ROOT / "kernels" / "__init__.py")


def test_an_installed_package_keeps_its_own_and_a_stray_kernels_is_never_taken(tmp_path):
    """Installed (attnbench/kernels inside): that one. No setup.py beside the package (a
    site-packages where Hugging Face's ``kernels`` sits next to attnbench): nothing served."""
    package = tmp_path / "attnbench"
    package.mkdir()
    shutil.copy(ROOT / "attnbench" / "__init__.py", package / "__init__.py")
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("")
    assert _kernels_spec(tmp_path) == "None"
    (package / "kernels").mkdir()
    (package / "kernels" / "__init__.py").write_text("")
    (tmp_path / "setup.py").write_text("")
    assert _kernels_spec(tmp_path) == str(package / "kernels" / "__init__.py")


# -- the recipe as CI runs it ------------------------------------------------------------------

def test_ci_runs_the_tests_first_then_the_rehearsal_offline():
    run = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "make test" in run and "make rehearsal" in run
    assert run.index("make test") < run.index("make rehearsal")
    rehearsal = (ROOT / ".ci" / "rehearsal").read_text()
    for needed in ("PIP_NO_INDEX=1", "PIP_CONFIG_FILE=/dev/null", "unshare -rn",
                   "-m attnbench.offline install", "REHEARSAL_CHECK=${REHEARSAL_CHECK:-"):
        assert needed in rehearsal, needed
    assert "--find-links" not in rehearsal
    makefile = (ROOT / "Makefile").read_text()
    for target, command in (("wheelhouse", "-m attnbench.offline wheelhouse"),
                            ("gpu-install", "-m attnbench.offline install"),
                            ("rehearsal", "bash .ci/rehearsal")):
        body = makefile.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]
        assert command in body, target
