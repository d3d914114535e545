"""docs/architecture.md says what the code does: the module table of a turn's
path matches the imports, and the per-hop message limits are the code's."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from turnmesh.runtime import serving

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
MODULE = re.compile(r"`([a-z_/]+\.py)`")


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(title)
    end = text.index("\n## ", start)
    return text[start:end]


def _hops() -> list[tuple[str, list[str]]]:
    """(the hop's module, the helpers beside it), row by row."""
    rows = []
    for line in _section("### Reading a turn, one module per hop").splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[0].isdigit():
            named = MODULE.findall(cells[1])
            rows.append((named[0], named[1:]))
    return rows


def _dotted(path: str) -> str:
    """The import name of a checkout path (``server/sessions/core.py``)."""
    return "turnmesh." + path.removesuffix(".py").replace("/", ".")


def _imports(path: str) -> set[str]:
    """Every module a file imports, at its top or inside functions."""
    tree = ast.parse((ROOT / path).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_turn_path_table_names_modules_that_exist() -> None:
    hops = _hops()
    assert len(hops) == 7
    for module, helpers in hops:
        for path in (module, *helpers):
            assert (ROOT / path).is_file(), path


def test_each_module_of_the_turn_path_is_imported_where_the_table_says() -> None:
    """From hop 3 on (hop 2 is where gRPC calls in, hop 7 where the runner's
    call goes out), each module is imported by its hop's module or by an
    earlier hop's: the table shows calls that the code can make."""
    hops = _hops()
    for index, (module, helpers) in enumerate(hops[1:6], start=1):
        earlier = [m for m, _ in hops[1:index]]
        for path in (module, *helpers):
            if path == module and index == 1:
                continue
            importers = [m for m in (module, *earlier) if m != path]
            assert any(_dotted(path) in _imports(m) for m in importers), (
                f"{path} (hop {index + 1}) is imported by none of {importers}"
            )


def test_the_stated_count_is_the_tables() -> None:
    hops = _hops()
    modules = sum(1 + len(helpers) for _, helpers in hops)
    section = _section("### Reading a turn, one module per hop")
    assert f"That is {len(hops)} hops and {modules} modules" in section


def test_the_per_hop_message_limits_are_the_codes() -> None:
    text = " ".join(DOC.read_text().split())
    mib = 2**20
    assert f"at most a Turn ({serving.MAX_TURN_REQUEST_BYTES // mib} MiB)" in text
    assert f"checkpoint ({serving.MAX_RUN_REQUEST_BYTES // mib} MiB)" in text
    assert f"the router {serving.MAX_ROUTER_REQUEST_BYTES // mib} MiB" in text
