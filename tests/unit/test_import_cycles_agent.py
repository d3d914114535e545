"""Imports among ``turnmesh.agent``'s modules go one way: no cycle, counting
the imports inside functions too (a lazy import still ties two modules), and
no module imports another's private name (a helper two modules share is
public in the module where it belongs)."""

from __future__ import annotations

import ast
from pathlib import Path

import turnmesh.agent

PACKAGE = "turnmesh.agent"
ROOT = Path(turnmesh.agent.__file__).parent


def _modules(root: Path, package: str) -> dict[str, Path]:
    """Every module below ``root``, by its dotted name."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, str]]:
    """(module imported, name taken from it or "") for every import in the
    file, at any depth, that names one of ``modules``. The package a module
    sits in is imported first by Python itself, and not counted: only what
    the module's own import statements name."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = alias.name
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target:
                    found.append((target, ""))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in modules:
                    found.append((submodule, ""))
                elif base in modules:
                    found.append((base, alias.name))
    return found


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules in order, the first again at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(edges.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(edges):
        if module not in state and (cycle := visit(module)) is not None:
            return cycle
    return None


def _graph(root: Path, package: str) -> tuple[dict[str, set[str]], list[str]]:
    """The import edges between the package's modules, and every import of
    another module's private name (``module: from target import _name``)."""
    modules = _modules(root, package)
    edges: dict[str, set[str]] = {}
    private: list[str] = []
    for name, path in modules.items():
        for target, imported in _imports(name, path, modules):
            if target != name:
                edges.setdefault(name, set()).add(target)
            if imported.startswith("_"):
                private.append(f"{name}: from {target} import {imported}")
    return edges, private


def test_the_agent_modules_import_one_another_one_way() -> None:
    edges, _ = _graph(ROOT, PACKAGE)
    assert edges, "no imports found: is ROOT the package?"
    cycle = _cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_no_agent_module_imports_another_modules_private_name() -> None:
    _, private = _graph(ROOT, PACKAGE)
    assert private == []


def test_a_cycle_through_a_lazy_import_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import helper\n")
    (package / "b.py").write_text("def helper():\n    from pkg import a\n    from . import _c\n")
    (package / "_c.py").write_text("from .a import _private\n")
    edges, private = _graph(package, "pkg")
    assert _cycle(edges) == ["pkg._c", "pkg.a", "pkg.b", "pkg._c"]
    assert private == ["pkg._c: from pkg.a import _private"]
