"""The package's shape: no import cycles among its modules (a helper living inside one of its
users is how they start), no module too large to find one's way in, and commands that only read
results or sweeps never import torch."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "attnbench"
MAX_LINES = 600


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path, known: dict[str, Path]) -> set[str]:
    """Project modules ``path`` imports anywhere (function bodies too), except under
    ``if TYPE_CHECKING:`` (annotations only: no import at run time)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            names = []
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


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


def test_no_import_cycles_among_the_packages_modules():
    known = _modules()
    graph = {}
    for name, path in known.items():
        graph[name] = _imports(path, known) - {name}
    cycles = _cycles(graph)
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_over_the_size_limit():
    big = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert big == {}, f"modules over {MAX_LINES} lines: {big}"


def test_spec_depends_on_nothing_above_it():
    known = _modules()
    deps = _imports(known["attnbench.sweep.load"], known) | _imports(known["attnbench.sweep.case"],
                                                                       known)
    packed = {"attnbench.sweep.packed_rules", "attnbench.sweep.length_mix",  # pure-Python rules
              "attnbench.sweep.decode_rules", "attnbench.sweep.fp8_rules", "attnbench.sweep.options"}
    allowed = {"attnbench.errors", "attnbench.validation", "attnbench.sweep.axes",
               "attnbench.sweep.case"}
    assert deps <= allowed | packed, deps
    for name in packed:
        assert _imports(known[name], known) <= {"attnbench.errors", "attnbench.validation"}
    # ranges, zips and overrides know no field by name: the field table is handed to them
    assert _imports(known["attnbench.sweep.axes"], known) <= {"attnbench.errors",
                                                             "attnbench.validation"}
    # the typed value rules and strict readers, shared with store and the dashboards: below spec
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
