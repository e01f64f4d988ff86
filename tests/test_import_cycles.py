"""No file of the project's packages imports itself back through others (docs/architecture.md, "Import rules").

The graph is built from the source with `ast`, every import statement counted wherever it stands: at the top,
under `if TYPE_CHECKING:` (a type-only import is still a dependency mypy and a reader follow), inside a function
(a lazy import), and `importlib.import_module("...")` with a literal name. A package's `__init__.py` is a node of
its own, so a cycle through it counts too (import-linter's acyclic_siblings contract in pyproject.toml holds the
packages apart, but cannot see a cycle through a package's own `__init__`). The packages are import-linter's
root_packages. A failure names each cycle with the file and line of every import along it.
"""
from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    path: str
    line: int
    how: str  # "top", "type-only" or "in a function"


def project_packages() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(config["tool"]["importlinter"]["root_packages"])


def module_files(root: Path, packages: list[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under the packages (a package's name is its __init__'s)."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


class _Imports(ast.NodeVisitor):
    """Every import of one module, with how it stands: at the top, type-only or inside a function."""

    def __init__(self):
        self.found: list[tuple[ast.AST, str]] = []
        self._context: list[str] = []

    def _how(self) -> str:
        return self._context[-1] if self._context else "top"

    def visit_If(self, node: ast.If) -> None:
        type_only = "TYPE_CHECKING" in ast.unparse(node.test)
        self._context.append("type-only" if type_only else self._how())
        for child in node.body:
            self.visit(child)
        self._context.pop()
        for child in node.orelse:
            self.visit(child)

    def _function(self, node) -> None:
        self._context.append("in a function")
        self.generic_visit(node)
        self._context.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node: ast.Import) -> None:
        self.found.append((node, self._how()))

    visit_ImportFrom = visit_Import

    def visit_Call(self, node: ast.Call) -> None:
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name == "import_module" and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and not node.args[0].value.startswith("."):
            self.found.append((node, self._how()))
        self.generic_visit(node)


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The module `name` refers to: itself, else its longest prefix that is one (`a.b.attr` -> `a.b`)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path], root: Path) -> list[Edge]:
    visitor = _Imports()
    visitor.visit(ast.parse(path.read_text(), str(path)))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    edges = []
    for node, how in visitor.found:
        if isinstance(node, ast.Import):
            targets = [_known(alias.name, modules) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [(_known(f"{base}.{alias.name}", modules) if alias.name != "*" else None) or _known(base, modules)
                       for alias in node.names]
        else:
            targets = [_known(node.args[0].value, modules)]
        rel = str(path.relative_to(root))
        edges += [Edge(module, t, rel, node.lineno, how) for t in dict.fromkeys(targets) if t and t != module]
    return edges


def import_graph(root: Path, packages: list[str]) -> dict[str, list[Edge]]:
    modules = module_files(root, packages)
    return {m: imports_of(m, path, modules, root) for m, path in modules.items()}


def cycles(graph: dict[str, list[Edge]]) -> list[list[Edge]]:
    """One shortest cycle per strongly connected component of two or more modules, from its first module by name."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def connect(v: str) -> None:  # Tarjan, iteratively: the graph may be deep
        work = [(v, iter(graph[v]))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, edges = work[-1]
            for edge in edges:
                w = edge.imported
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.add(w)
                        if w == node:
                            break
                    if len(component) > 1:
                        components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted((_shortest_cycle(graph, c) for c in components), key=lambda path: path[0].importer)


def _shortest_cycle(graph: dict[str, list[Edge]], component: set[str]) -> list[Edge]:
    start = min(component)
    came: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for edge in sorted(graph[v], key=lambda e: (e.imported, e.line)):
                w = edge.imported
                if w == start:
                    path = [edge]
                    while path[0].importer != start:
                        path.insert(0, came[path[0].importer])
                    return path
                if w in component and w not in came:
                    came[w] = edge
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")  # a component of two or more always has one


def describe(path: list[Edge]) -> str:
    steps = [f"{e.importer} ({e.path}:{e.line}, {e.how})" for e in path]
    return " -> ".join(steps + [path[0].importer])


def test_no_file_cycle_in_the_projects_packages():
    packages = project_packages()
    assert {"contract", "controller", "engine", "gitops", "profiler_job", "schemas", "templates", "worker"} <= set(
        packages)
    graph = import_graph(ROOT, packages)
    assert set(packages) <= set(graph)
    assert "worker.emitter" in {e.imported for e in graph["worker.scheduler"]}  # the imports were read
    found = cycles(graph)
    assert not found, "file cycles (move what both need into a module below them):\n" + "\n".join(
        describe(c) for c in found)


# Each case: files of a package `pkg` in a temporary root, and the cycle the check must report (None: none).
CASES = {
    "top-level-imports": ({"a.py": "from pkg import b\n", "b.py": "import pkg.a\n"}, ["pkg.a", "pkg.b"]),
    "type-only-import": ({"a.py": "from pkg.b import B\n",
                          "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n"},
                         ["pkg.a", "pkg.b"]),
    "function-level-import": ({"a.py": "import pkg.b\n", "b.py": "def f():\n    from .a import x\n    return x\n"},
                              ["pkg.a", "pkg.b"]),
    "relative-import-of-the-package": ({"__init__.py": "from .m import make\n", "m.py": "from . import Base\n"},
                                       ["pkg", "pkg.m"]),
    "three-files": ({"a.py": "from .b import x\n", "b.py": "from .c import y\n", "c.py": "from .a import z\n"},
                    ["pkg.a", "pkg.b", "pkg.c"]),
    "subpackages": ({"sub/__init__.py": "", "sub/x.py": "from ..y import f\n", "y.py": "from pkg.sub.x import g\n"},
                    ["pkg.sub.x", "pkg.y"]),
    "import-module-literal": ({"a.py": "import importlib\nB = importlib.import_module('pkg.b')\n",
                               "b.py": "from pkg.a import B\n"}, ["pkg.a", "pkg.b"]),
    "else-of-type-checking-counts": ({"a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\n"
                                              "else:\n    import pkg.b\n", "b.py": "import pkg.a\n"},
                                     ["pkg.a", "pkg.b"]),
    "no-cycle-a-chain": ({"a.py": "from .b import x\n", "b.py": "from .c import y\nimport os\n", "c.py": "import json\n"},
                         None),
    "no-cycle-an-attribute-of-the-package": ({"__init__.py": "VERSION = 1\n", "a.py": "from pkg import VERSION\n"},
                                             None),
}


@pytest.mark.parametrize("files, want", list(CASES.values()), ids=list(CASES))
def test_the_check_finds_every_kind_of_cycle(tmp_path, files, want):
    for name, text in {"__init__.py": "", **files}.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    found = cycles(import_graph(tmp_path, ["pkg"]))
    if want is None:
        assert found == []
        return
    assert len(found) == 1
    assert sorted(e.importer for e in found[0]) == want
    assert [e.imported for e in found[0]] == [e.importer for e in found[0][1:]] + [found[0][0].importer]
    assert all(e.path.startswith("pkg/") and e.line >= 1 for e in found[0])


def test_a_cycle_is_reported_with_the_file_line_and_kind_of_each_import(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("import os\nfrom pkg.b import B\n")
    (tmp_path / "pkg" / "b.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from pkg.a import A\n")
    [cycle] = cycles(import_graph(tmp_path, ["pkg"]))
    assert describe(cycle) == "pkg.a (pkg/a.py:2, top) -> pkg.b (pkg/b.py:4, type-only) -> pkg.a"
