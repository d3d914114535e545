"""Imports go one way among the modules of the folders in ``FOLDERS``,
read from their source (ast, nothing imported). Every import counts as an
edge: module-level, inside a function (a lazy import only hides a cycle
until someone calls it) or under ``if TYPE_CHECKING:``. Edges leaving the
folders are ignored; a cycle that crosses from one listed folder to another
counts. And no module takes another's private name (``from x import _y``): a
helper two modules share is public where it belongs.
"""

from __future__ import annotations

import ast
import graphlib
import tomllib
from collections.abc import Collection, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Checked together, so a cycle through two of them is found too.
FOLDERS = ["server", "cli", "envoy", "agent", "worker", "runtime", "router", "client", "files"]


def package_of(folder: str) -> str:
    """The dotted package of a checkout folder, by pyproject.toml's
    ``package-dir`` (``server/stores`` is ``turnmesh.server.stores``)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping: dict[str, str] = pyproject["tool"]["setuptools"]["package-dir"]
    # The longest mapped folder the folder is in (``agent/builtin`` over ``agent``).
    for package, mapped in sorted(mapping.items(), key=lambda item: -len(item[1])):
        if folder == mapped or folder.startswith(mapped + "/"):
            rest = folder.removeprefix(mapped).strip("/")
            return ".".join([package, *rest.split("/")]) if rest else package
    raise ValueError(f"{folder} is in no package of pyproject.toml")


def modules_in(folder: Path, package: str) -> dict[str, Path]:
    """Dotted name -> file, for the folder's modules (subfolders included)."""
    found: dict[str, Path] = {}
    for path in sorted(folder.rglob("*.py")):
        parts = list(path.relative_to(folder).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join([package, *parts])] = path
    return found


def imports_of(module: str, path: Path, known: Collection[str]) -> set[str]:
    """The modules of ``known`` that an import anywhere in the file names:
    ``import X`` names X; ``from X import a`` names ``X.a`` if that is a
    module, else X (whose ``__init__`` defines ``a``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                # Relative: counted from the module's package (a package's own
                # ``__init__`` is in that package).
                package = module.split(".")
                if path.name != "__init__.py":
                    package.pop()
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                names.add(submodule if submodule in known else base)
    return (names & set(known)) - {module}


def import_graph(folders: Mapping[Path, str]) -> dict[str, set[str]]:
    """Module -> the modules it imports, among the folders' (folder -> its package)."""
    files: dict[str, Path] = {}
    for folder, package in folders.items():
        files.update(modules_in(folder, package))
    return {module: imports_of(module, path, files.keys()) for module, path in files.items()}


def cycle_in(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One import cycle (its first module repeated last), or None."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        cycle: list[str] = exc.args[1]
        return cycle
    return None


def test_the_folders_have_no_import_cycle() -> None:
    graph = import_graph({ROOT / folder: package_of(folder) for folder in FOLDERS})
    # The graph was read at all: a known edge is in it.
    assert "turnmesh.server.stores.base" in graph["turnmesh.server.stores.sqlite"]
    cycle = cycle_in(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def private_imports(folders: Mapping[Path, str]) -> list[str]:
    """Every ``from turnmesh... import _name`` (any depth) in the folders."""
    found = []
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("turnmesh"):
                    for alias in node.names:
                        if alias.name.startswith("_") and not alias.name.startswith("__"):
                            found.append(f"{path.relative_to(folder)}: {node.module}.{alias.name}")
    return found


def test_no_module_imports_another_modules_private_name() -> None:
    assert private_imports({ROOT / folder: package_of(folder) for folder in FOLDERS}) == []


def test_a_private_import_is_found(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("def f() -> None:\n    from turnmesh.x import _y, z\n")
    assert private_imports({tmp_path: "pkg"}) == ["a.py: turnmesh.x._y"]


def test_a_cycle_through_a_lazy_or_relative_import_is_found(tmp_path: Path) -> None:
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "a.py").write_text("from pkg.b import thing\n")
    (tmp_path / "b.py").write_text("def later() -> None:\n    from pkg import a\n")
    (tmp_path / "c.py").write_text("from . import b\nimport os\n")
    graph = import_graph({tmp_path: "pkg"})
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.b"}}
    assert cycle_in(graph) in (["pkg.a", "pkg.b", "pkg.a"], ["pkg.b", "pkg.a", "pkg.b"])
    (tmp_path / "b.py").write_text("")
    assert cycle_in(import_graph({tmp_path: "pkg"})) is None
