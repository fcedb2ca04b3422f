"""The package's shape, as packages that follow the data flow.

sweep -> problem -> backend call -> accuracy / timing -> execution -> results -> cluster /
dispatch -> report: each package may import only the packages :data:`MAY_IMPORT` names, which
are all below it in :data:`ORDER` (no upward import, so no package-level cycle); the client
packages (sweep, results, cluster, dispatch, report) reach no rank-side module and no torch; at
most :data:`MAX_TOP_LEVEL` modules sit at the top of ``attnbench/``; no module cycle, no module
too large to find one's way in; each package names its public names (``__all__``) and other
packages import only those, from the module that defines them; the README's layout is generated
from the package docstrings (``python tests/project/test_structure.py`` rewrites it).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "attnbench"
MAX_LINES = 600
MAX_TOP_LEVEL = 8
"""Modules directly in attnbench/, ``__init__`` and ``__main__`` included."""

# -- the table -----------------------------------------------------------------------------------

BASE = "base"
"""The top-level modules everything may use: errors, validation, resources, dtypes (and the
package root's ``__version__``)."""
TOP = "top"
"""cli, selftest, __main__: the commands, which may import anything."""
TOP_MODULES = {"attnbench.cli", "attnbench.selftest", "attnbench.__main__"}

ORDER = ("base", "offline", "capture", "sweep", "hardware", "results", "problem", "kernels", "backends",
         "accuracy", "timing", "parallel", "execution", "mutants", "cluster", "dispatch", "report",
         "gpu_check", "top")
"""Lowest first: a package imports only packages before it."""

MAY_IMPORT: dict[str, set[str]] = {
    "base": set(),
    "offline": {"base"},  # runs before anything is installed: the standard library
    "capture": {"base"},  # a user's activations: read by the sweep (shapes) and the inputs
    "sweep": {"base", "capture"},  # capture: a captured case's shapes (its header only)
    "hardware": {"base"},
    "results": {"base", "sweep", "hardware"},
    "problem": {"base", "sweep", "capture"},
    "kernels": {"base", "problem"},
    "backends": {"base", "sweep", "results", "problem", "kernels"},
    "accuracy": {"base", "sweep", "results", "problem", "backends"},
    "timing": {"base", "sweep", "hardware"},
    "parallel": {"base", "sweep", "hardware", "results", "problem", "backends", "accuracy"},
    "execution": {"base", "sweep", "hardware", "results", "problem", "kernels", "backends",
                  "accuracy", "timing", "parallel"},  # kernels: chosen before triton's import
    "mutants": {"base", "problem", "kernels", "backends", "accuracy", "parallel"},
    "cluster": {"base", "sweep", "hardware", "results", "execution"},
    "dispatch": {"base", "sweep", "results", "cluster", "backends"},
    "report": {"base", "sweep", "hardware", "results"},
    "gpu_check": {"base", "sweep", "hardware", "results", "problem", "kernels", "backends",
                  "execution", "cluster"},  # cluster: a pool outcome -> a record, as tasks do
    "top": set(ORDER) - {"top"},
}

SIDE = {"base": "shared", "offline": "client", "capture": "user + shared",
        "sweep": "client", "hardware": "shared", "results": "client",
        "problem": "rank", "kernels": "rank", "backends": "rank", "accuracy": "rank",
        "timing": "rank", "parallel": "rank", "execution": "worker + rank", "mutants": "rank",
        "cluster": "client + worker", "dispatch": "client", "report": "client",
        "gpu_check": "driver + steps", "top": "top"}
"""Where a package runs: the client (no torch: a laptop reads results without it), a Dask
worker (no torch: ranks are separate processes), a rank process (torch), or shared."""
CLIENT = [p for p, side in SIDE.items() if side.startswith("client")]
RANK = [p for p, side in SIDE.items() if side == "rank"]

CLIENT_MAY_REACH = {
    # the registry's face: names, the protocol's types, capabilities and refusal (torch-free)
    "attnbench.backends", "attnbench.backends.base", "attnbench.backends.capabilities",
    "attnbench.backends.importable",  # can a worker import a module:object backend (no import)
    "attnbench.backends.source_names",  # the names its source binds, read (never run)
    "attnbench.execution", "attnbench.execution.pool", "attnbench.execution.pool_set",
    "attnbench.execution.ranks",
    "attnbench.execution.child",  # a worker's rank pools (the ranks are other processes)
    "attnbench.execution.call_clock",  # the pool's deadline, stopped while a rank compiles
}
"""Modules of rank-side or mixed packages that a client module may reach (torch-free)."""
RANK_ONLY = {"attnbench.hardware.device"}
"""Modules of shared packages that import torch: rank side, imported by their path."""


# -- reading the code ----------------------------------------------------------------------------

def _module_name(path: Path) -> str:
    if path.is_relative_to(ROOT / "kernels"):
        parts = ("attnbench", "kernels", *path.relative_to(ROOT / "kernels").with_suffix("").parts)
    else:
        parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    paths = [*PACKAGE.rglob("*.py"), *(ROOT / "kernels").rglob("*.py")]
    return {_module_name(p): p for p in paths if "__pycache__" not in p.parts}


def _import_nodes(tree: ast.AST):
    """Import statements anywhere (function bodies too), except under ``if TYPE_CHECKING:``
    (annotations only: no import at run time)."""
    def visit(node):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for child in node.orelse:
                yield from visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        for child in ast.iter_child_nodes(node):
            yield from visit(child)

    yield from visit(tree)


def _faces() -> dict[str, dict[str, str]]:
    """package -> {public name: the module that defines it}, read from each package's
    ``__init__``: a ``package_face(__name__, {module: names})`` table, or names it imports from
    its own modules (an eager face)."""
    faces: dict[str, dict[str, str]] = {}
    for init in [*PACKAGE.rglob("__init__.py"), ROOT / "kernels" / "__init__.py"]:
        if "__pycache__" in init.parts:
            continue
        package, table, listed, imported = _module_name(init), {}, [], {}
        for node in ast.walk(ast.parse(init.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "package_face"
                    and isinstance(node.args[1], ast.Dict)):
                for key, value in zip(node.args[1].keys, node.args[1].values):
                    table.update({elt.value: f"{package}.{key.value}" for elt in value.elts})
            elif (isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__all__"
                  and isinstance(node.value, (ast.List, ast.Tuple))):
                listed = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
            elif (isinstance(node, ast.ImportFrom) and node.module
                  and node.module.startswith(package + ".")):
                imported.update({a.asname or a.name: node.module for a in node.names})
        table.update({name: imported.get(name, package) for name in listed})
        faces[package] = table
    return faces


def _imports(path: Path, known: dict[str, Path], faces: dict | None = None) -> set[str]:
    """Project modules ``path`` imports (a ``from package import name`` counts as the module
    that defines ``name`` when the package's face names it, as the submodule when ``name`` is
    one, else as the package)."""
    faces = _faces() if faces is None else faces
    found: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif node.module and node.level == 0:
            face = faces.get(node.module, {})
            names = [face.get(alias.name, f"{node.module}.{alias.name}") for alias in node.names]
            names += [node.module]
        else:
            names = []
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    known, faces = _modules(), _faces()
    return {name: _imports(path, known, faces) - {name} for name, path in known.items()}


def _package(module: str) -> str:
    parts = module.split(".")
    if module in TOP_MODULES:
        return TOP
    if len(parts) == 1 or not ((PACKAGE / parts[1]).is_dir() or parts[1] == "kernels"):
        return BASE
    return parts[1]


def _imports_torch_at_module_level(path: Path) -> bool:
    for node in ast.parse(path.read_text()).body:
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if any(n.split(".")[0] in ("torch", "triton") for n in names):
            return True
    return False


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def _package_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = {}
    for module, deps in graph.items():
        for dep in deps:
            a, b = _package(module), _package(dep)
            if a != b:
                edges.setdefault((a, b), []).append(f"{module} -> {dep}")
    return edges


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for dep in graph.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


# -- the rules -----------------------------------------------------------------------------------

def test_the_table_covers_every_package_and_points_down():
    packages = {_package(m) for m in _modules()}
    assert packages == set(ORDER), f"packages not in ORDER: {packages - set(ORDER)}"
    assert set(MAY_IMPORT) == set(ORDER) == set(SIDE)
    for package, allowed in MAY_IMPORT.items():
        above = [p for p in allowed if ORDER.index(p) >= ORDER.index(package)]
        assert not above, f"{package} may import {above}, which are not below it"


def test_every_import_between_packages_is_allowed():
    wrong = {f"{a} -> {b}": why[:3] for (a, b), why in _package_edges(_graph()).items()
             if b not in MAY_IMPORT[a]}
    assert wrong == {}, f"imports the table does not allow (MAY_IMPORT): {wrong}"


def test_no_upward_imports():
    """Counted on their own (the table could be edited to allow one): 0."""
    up = [why[0] for (a, b), why in _package_edges(_graph()).items()
          if ORDER.index(b) > ORDER.index(a)]
    assert up == [], f"upward imports: {up}"


def test_the_check_finds_an_upward_import():
    """The rule has teeth: a planted import of dispatch from results is reported."""
    graph = _graph()
    graph["attnbench.results.records"] = graph["attnbench.results.records"] | {
        "attnbench.dispatch.run"}
    edges = _package_edges(graph)
    assert ("results", "dispatch") in edges and "dispatch" not in MAY_IMPORT["results"]


def test_client_packages_reach_no_rank_side_module_and_no_torch():
    """A client module, following every import (lazy ones too), never reaches a module of a
    rank-side package (other than :data:`CLIENT_MAY_REACH`) nor one that imports torch or
    triton when it is imported."""
    known, graph = _modules(), _graph()
    bad = {}
    for module in known:
        if _package(module) not in CLIENT:
            continue
        reached = _reach(graph, module) | {module}
        wrong = sorted(m for m in reached - CLIENT_MAY_REACH
                       if _package(m) in RANK or _package(m) == "execution" or m in RANK_ONLY
                       or _imports_torch_at_module_level(known[m]))
        if wrong:
            bad[module] = wrong[:4]
    assert bad == {}, f"client modules reaching the rank side or torch: {bad}"


def test_client_packages_import_without_torch():
    """Every client module (and the torch-free modules they may reach) imports with torch and
    triton made unimportable."""
    modules = sorted(m for m in _modules() if _package(m) in CLIENT) + sorted(CLIENT_MAY_REACH)
    code = ("import importlib, sys\n"
            "sys.modules['torch'] = None; sys.modules['triton'] = None\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_at_most_eight_top_level_modules():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top


def test_no_import_cycles_among_the_packages_modules():
    cycles = _cycles(_graph())
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_over_the_size_limit():
    big = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert big == {}, f"modules over {MAX_LINES} lines: {big}"


def test_sweep_rules_know_no_field_by_name():
    """Ranges, zips and overrides are handed the field table; the per-feature rules and the
    options sit below the case and the loader."""
    known = _modules()
    # resources imports nothing: the option naming the kernels' config modes may read them there
    low = {"attnbench.errors", "attnbench.validation", "attnbench.resources"}
    for name in ("axes", "packed_rules", "length_mix", "decode_rules", "fp8_rules", "options"):
        deps = _imports(known[f"attnbench.sweep.{name}"], known)
        assert deps <= low | {"attnbench.dtypes"}, (name, deps)
    assert _imports(known["attnbench.validation"], known) <= {"attnbench.errors"}


def test_validate_imports_neither_torch_nor_the_users_backend(tmp_path):
    """`attnbench validate` reads a sweep: no torch, and a `module:object` backend is checked for
    its form, never imported (importing runs its code)."""
    marker = tmp_path / "imported"
    (tmp_path / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\nclass B: pass\n")
    sweep = tmp_path / "s.yaml"
    sweep.write_text("name: s\naxes: {backend: ['evil:B', naive]}\n")
    code = ("import sys; sys.modules['torch'] = None; sys.modules['triton'] = None\n"
            "from attnbench.cli import main\n"
            f"raise SystemExit(main(['validate', {str(sweep)!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": ""})
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()


def _defined(path: Path) -> set[str]:
    """Names a module defines at its top level (not those it imports)."""
    out: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return out


def test_every_package_names_its_public_names():
    """Each package's ``__init__`` has ``__all__`` (a face), every name it lists is defined by the
    module it names, and no public name hides a submodule of the same name."""
    known, faces = _modules(), _faces()
    bad = []
    for package, table in faces.items():
        init = known[package]
        if "__all__" not in init.read_text():
            bad.append(f"{package}: no __all__")
        for name, module in table.items():
            if module != package and module in known and name not in _defined(known[module]):
                bad.append(f"{package}.{name}: not defined in {module}")
            if f"{package}.{name}" in known:
                bad.append(f"{package}.{name}: a public name that is also a submodule")
    assert bad == [], bad


def _public_import_violations(known, faces) -> list[str]:
    bad = []
    for module, path in known.items():
        for node in _import_nodes(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module in known and node.module.startswith("attnbench.")):
                continue
            target = node.module
            home = target if known[target].name == "__init__.py" else target.rpartition(".")[0]
            base = _package(target) in (BASE, TOP) and target not in faces
            for alias in node.names:
                name = alias.name
                if f"{target}.{name}" in known or name == "__version__":
                    continue  # a submodule, or the root's version
                if target in faces:  # from a package's face
                    if name not in faces[target]:
                        bad.append(f"{module}: {name} is not in {target}.__all__")
                    continue
                if name not in _defined(known[target]):
                    bad.append(f"{module}: {name} from {target}, which only re-exports it")
                elif _package(module) != _package(target) and (
                        name.startswith("_") if base else
                        name not in faces.get(home, {}) and name != target.rpartition(".")[2]):
                    bad.append(f"{module}: {name} from {target} is not public ({home}.__all__)")
    return bad


def test_packages_import_only_public_names_from_where_they_are_defined():
    """Across packages a module imports only public names (its package's ``__all__``, or the
    module's own eponymous function: ``accuracy.evaluate.evaluate``), always from the module
    that defines them: no re-export through an unrelated module."""
    bad = _public_import_violations(_modules(), _faces())
    assert bad == [], bad


def test_the_public_name_check_has_teeth():
    known, faces = _modules(), _faces()
    faces = {**faces, "attnbench.results": dict(faces["attnbench.results"])}
    faces["attnbench.results"].pop("make_record")
    assert any("make_record" in line for line in _public_import_violations(known, faces))


# -- report/: a room per command, pointing down -------------------------------------------------

REPORT_ROOMS = ("read", "show", "export", "page", "compare", "history", "")
"""report's subpackages, lowest first; "" is report's own modules (``commands``, ``synthetic``,
the face), above every room. A room imports only rooms before it: reading the journal knows
no command, show and export know neither each other nor the page, and compare draws with the
page's figures and HTML (issue 38)."""


def _report_room(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["attnbench", "report"]:
        return None
    return parts[2] if len(parts) > 3 and parts[2] in REPORT_ROOMS else ""


def _report_upward(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, deps in graph.items():
        a = _report_room(module)
        for dep in deps:
            b = _report_room(dep)
            if a is not None and b is not None and a != b and \
                    REPORT_ROOMS.index(b) > REPORT_ROOMS.index(a):
                out.append(f"{module} -> {dep}")
    return sorted(out)


def test_report_rooms_are_every_subpackage_of_report():
    rooms = {p.name for p in (PACKAGE / "report").iterdir() if (p / "__init__.py").exists()}
    assert rooms == set(REPORT_ROOMS) - {""}, rooms


def test_no_upward_imports_between_the_rooms_of_report():
    assert _report_upward(_graph()) == []


def test_the_room_check_finds_an_upward_import():
    """A planted import of the compare room from the journal reader is reported."""
    graph = _graph()
    graph["attnbench.report.read.reader"] = graph["attnbench.report.read.reader"] | {
        "attnbench.report.compare.comparison"}
    assert _report_upward(graph) == [
        "attnbench.report.read.reader -> attnbench.report.compare.comparison"]


def test_the_old_report_names_import_as_the_moved_modules():
    """What users imported before the move still imports, as the very module (a patch through
    either name is seen by both), with a DeprecationWarning naming the new home; a mutant
    table entry pointing nowhere is an ImportError, not a silent second module."""
    code = ("import importlib, warnings\n"
            "warnings.simplefilter('error', DeprecationWarning)\n"
            "from attnbench.report import MOVED\n"
            "for old, new in MOVED.items():\n"
            "    try:\n"
            "        importlib.import_module('attnbench.report.' + old)\n"
            "    except DeprecationWarning as w:\n"
            "        assert 'attnbench.report.' + new in str(w), w\n"
            "    else:\n"
            "        raise AssertionError(old + ': no warning')\n"
            "warnings.simplefilter('ignore', DeprecationWarning)\n"
            "for old, new in MOVED.items():\n"
            "    a = importlib.import_module('attnbench.report.' + old)\n"
            "    b = importlib.import_module('attnbench.report.' + new)\n"
            "    assert a is b and a.__spec__.name == b.__name__, old\n"
            "import attnbench.report.page.panels.fp8 as f, attnbench.report.page.panels.fp8 as g\n"
            "assert f is g\n"
            "from attnbench import moved_modules\n"
            "moved_modules('attnbench.results', {'gone': 'nowhere.gone'})\n"
            "try:\n"
            "    import attnbench.results.gone\n"
            "except ImportError:\n"
            "    pass\n"
            "else:\n"
            "    raise AssertionError('a move to nowhere imported')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]


# -- the README's layout, generated from the docstrings ------------------------------------------

LAYOUT_START = ("<!-- layout: generated by tests/project/test_structure.py from the package "
                "docstrings -->")
LAYOUT_END = "<!-- /layout -->"
SUMMARY_LIMIT = 88


def _summary(path: Path) -> str:
    """The first line of a module's docstring: one sentence that says what it holds."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return doc.splitlines()[0].strip() if doc else ""


def layout() -> str:
    """The layout block of the README."""
    def plain(text: str) -> str:
        return text.replace("``", "")

    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    lines = ["attnbench/", *(f"  {name:<15}{plain(_summary(PACKAGE / name))}" for name in top)]
    for package in ORDER:
        if package in (BASE, TOP):
            continue
        folder = ROOT / "kernels" if package == "kernels" else PACKAGE / package
        contents = sorted(p.stem if p.is_file() else p.name + "/" for p in folder.iterdir()
                          if (p.suffix == ".py" and p.stem != "__init__")
                          or (p.is_dir() and (p / "__init__.py").exists()))
        where = SIDE_WORDS[SIDE[package]] + (", installed as attnbench.kernels"
                                             if package == "kernels" else "")
        lines.append(f"  {package + '/':<15}{plain(_summary(folder / '__init__.py'))}")
        lines += textwrap.wrap(f"{where}: {' '.join(contents)}", 98, initial_indent=" " * 17,
                               subsequent_indent=" " * 17)
        rooms = [p for p in folder.iterdir() if (p / "__init__.py").exists()]
        for room in sorted(rooms, key=lambda p: (REPORT_ROOMS.index(p.name)
                                                 if p.name in REPORT_ROOMS else 99, p.name)):
            lines.append(f"    {room.name + '/':<13}{plain(_summary(room / '__init__.py'))}")
    return "\n".join(["```", *lines, "```"])


SIDE_WORDS = {"client": "client, no torch", "client + worker": "client and Dask worker, no torch",
              "worker + rank": "Dask worker (no torch) and rank side", "rank": "rank side",
              "shared": "shared (torch only in device)", "top": "top",
              "user + shared": "any side, lazy torch",
              "driver + steps": "driver (no torch, no Dask) and its steps' processes"}


def _readme_layout(text: str) -> str:
    match = re.search(re.escape(LAYOUT_START) + r"\n(.*?)\n" + re.escape(LAYOUT_END), text, re.S)
    assert match, f"README.md lacks the layout markers {LAYOUT_START!r} ... {LAYOUT_END!r}"
    return match.group(1)


def test_every_package_and_top_level_module_says_what_it_holds_in_one_line():
    paths = [*PACKAGE.glob("*.py"), *PACKAGE.glob("*/__init__.py"),
             *PACKAGE.glob("*/*/__init__.py"), ROOT / "kernels" / "__init__.py"]
    bad = {str(p.relative_to(ROOT)): s for p in paths
           if not (s := _summary(p)) or len(s) > SUMMARY_LIMIT or not s.endswith((".", "?"))}
    assert bad == {}, (f"docstring first lines that are empty, over {SUMMARY_LIMIT} characters or "
                       f"not a whole sentence: {bad}")


def test_the_readme_layout_is_current():
    current = _readme_layout((ROOT / "README.md").read_text())
    assert current == layout(), ("README.md's layout is stale: run "
                                 "`python tests/project/test_structure.py`")


def write_readme_layout() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    text = text.replace(_readme_layout(text), layout())
    readme.write_text(text)


if __name__ == "__main__":
    write_readme_layout()
    print("README.md: layout rewritten")
