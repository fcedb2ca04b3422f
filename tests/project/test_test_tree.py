"""tests/ is laid out like the code (issue 38): a folder per package, mirrored
(``tests/report/read/`` holds the tests of ``attnbench/report/read/``, ``tests/kernels/`` those of
the top-level ``kernels/``), a few cross-cutting folders (:data:`CROSS_CUTTING`) for what belongs
to no one package, and one home for what tests share: ``tests/support/`` (helpers, the test
backends that sweeps name by module, the rigs, ``data/``) and ``tests/conftest.py`` (fixtures).

:func:`tree_problems` checks a checkout's tests/: every folder names a package or a cross-cutting
folder; test modules live in folders, shared code in support/ only; every module name is unique
(pytest's default import mode puts each test's folder on ``sys.path``, so two ``test_x.py``
would shadow each other) and no test module imports another (what two share goes to support/:
an import of a test module works only if pytest happened to collect that folder first); no
module over :data:`MAX_LINES` lines. Each rule has a planted mutant below.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 600
"""The module size cap, as for attnbench/ (tests/project/test_structure.py)."""

CROSS_CUTTING = {
    "end_to_end": "the CLI run as a user types it (run, submit, conventions)",
    "hostile": "the hostile-input and security suite",
    "scale": "memory and growth at 10^5-10^6 cases",
    "docs": "what the guides promise, run",
    "project": "the layout of the checkout itself",
    "support": "what tests share: helpers, test backends, rigs, data/",
}
SUPPORT = "support"
DATA = "data"  # under support/: sweep files and recorded answers, not Python


def _package_folders(root: Path) -> set[tuple[str, ...]]:
    """Every package of the checkout as a path of names: ('report', 'read'), ('kernels',)."""
    found = {init.parent.relative_to(root / "attnbench").parts
             for init in (root / "attnbench").rglob("__init__.py")}
    found |= {init.parent.relative_to(root).parts
              for init in (root / "kernels").rglob("__init__.py")}
    return {parts for parts in found if parts}


def _python_files(tests: Path) -> list[Path]:
    return sorted(p for p in tests.rglob("*.py")
                  if "__pycache__" not in p.parts
                  and p.relative_to(tests).parts[:2] != (SUPPORT, DATA))


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def tree_problems(root: Path = ROOT) -> list[str]:
    """What breaks the layout of ``root``/tests, one line each (empty: none)."""
    tests = root / "tests"
    packages = _package_folders(root)
    problems = []
    for folder in sorted(p for p in tests.rglob("*") if p.is_dir()):
        parts = folder.relative_to(tests).parts
        if "__pycache__" in parts or parts[:2] == (SUPPORT, DATA):
            continue
        if parts not in packages and not (len(parts) == 1 and parts[0] in CROSS_CUTTING):
            problems.append(f"tests/{'/'.join(parts)}/ names no package and no cross-cutting "
                            f"folder ({', '.join(sorted(CROSS_CUTTING))})")
    by_name: dict[str, list[str]] = {}
    for path in _python_files(tests):
        rel = path.relative_to(tests)
        where = f"tests/{rel.as_posix()}"
        by_name.setdefault(path.stem, []).append(where)
        is_test = path.name.startswith("test_")
        if len(rel.parts) == 1 and path.name != "conftest.py":
            problems.append(f"{where}: at the top of tests/ (a test goes in its package's "
                            "folder, shared code in tests/support/)")
        elif rel.parts[0] == SUPPORT and is_test:
            problems.append(f"{where}: a test module in tests/support/")
        elif len(rel.parts) > 1 and rel.parts[0] != SUPPORT and not is_test:
            problems.append(f"{where}: shared code outside tests/support/")
        if (lines := len(path.read_text().splitlines())) > MAX_LINES:
            problems.append(f"{where}: {lines} lines (at most {MAX_LINES})")
        imported_tests = sorted(m for m in _imported_modules(path) if m.startswith("test_"))
        if imported_tests:
            problems.append(f"{where}: imports the test module(s) {', '.join(imported_tests)} "
                            "(move what they share to tests/support/)")
    problems += [f"two modules named {name}.py: {', '.join(wheres)}"
                 for name, wheres in sorted(by_name.items())
                 if len(wheres) > 1 and name != "__init__"]
    return problems


def test_the_tests_are_laid_out_like_the_code():
    assert tree_problems() == []


def test_the_top_of_tests_holds_only_conftest_and_folders():
    top = sorted(p.name for p in (ROOT / "tests").iterdir()
                 if p.is_file() and p.name != ".gitignore")
    assert top == ["conftest.py"]


# -- mutants: a planted tree per rule -----------------------------------------------------------


def _checkout(tmp_path: Path) -> Path:
    """A minimal checkout that passes: two packages, their test folders, support/."""
    for init in ("attnbench/__init__.py", "attnbench/sweep/__init__.py",
                 "attnbench/report/__init__.py", "attnbench/report/read/__init__.py",
                 "kernels/__init__.py"):
        (tmp_path / init).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / init).write_text("")
    files = {"tests/conftest.py": "", "tests/support/helpers.py": "ROOT = 1\n",
             "tests/support/data/tiny.yaml": "name: t\n",
             "tests/sweep/test_load.py": "from helpers import ROOT\n",
             "tests/report/read/test_reader.py": "", "tests/kernels/test_flash.py": "",
             "tests/hostile/test_hostile_files.py": ""}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_the_planted_checkout_passes(tmp_path):
    assert tree_problems(_checkout(tmp_path)) == []


MUTANTS = {
    "a folder that names nothing": ("tests/reprot/test_page.py", "", "names no package"),
    "a package folder one level off": ("tests/read/test_reader2.py", "", "names no package"),
    "a test at the top": ("tests/test_flat.py", "", "at the top of tests/"),
    "a helper beside the tests": ("tests/sweep/sweeps_for_tests.py", "", "shared code outside"),
    "a test module in support": ("tests/support/test_helpers.py", "", "a test module in"),
    "two modules of one name": ("tests/hostile/test_load.py", "", "two modules named test_load"),
    "a test importing a test": ("tests/hostile/test_more.py", "from test_load import x\n",
                                "imports the test module(s) test_load"),
    "a module over the cap": ("tests/sweep/test_long.py", "x = 1\n" * (MAX_LINES + 1),
                              f"{MAX_LINES + 1} lines"),
}


@pytest.mark.parametrize("name", MUTANTS)
def test_each_planted_break_is_the_one_problem_named(tmp_path, name):
    path, text, expected = MUTANTS[name]
    root = _checkout(tmp_path)
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(text)
    problems = tree_problems(root)
    assert len(problems) == 1 and expected in problems[0], problems
