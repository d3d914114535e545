"""Type-check every hand-written module with mypy (strict; see pyproject.toml).

The folders map onto the ``turnmesh`` package through setuptools'
``package-dir`` (``runtime/`` is ``turnmesh.runtime``), which mypy cannot
follow: this script lays the same mapping out as symlinks under
``build/typecheck`` and runs mypy there, then prints paths as they are in the
checkout. Generated code (``gen/``) is type-checked only as what it exports.

Usage: python scripts/typecheck.py [mypy options]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"
# Checked beside the package, under their own names.
OTHER_PACKAGES = ("tests", "bench", "scripts")


def package_dirs() -> dict[str, str]:
    """``turnmesh.x`` -> folder, from pyproject.toml (the one mapping)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping: dict[str, str] = pyproject["tool"]["setuptools"]["package-dir"]
    return mapping


def build_tree() -> dict[Path, Path]:
    """Symlinks for every mapped package; returns tree path -> checkout path."""
    links: dict[Path, Path] = {}
    mapping = package_dirs()
    for module, folder in mapping.items():
        parent, _, name = module.rpartition(".")
        if module == "turnmesh":
            continue  # its own files are linked one by one below
        if parent in mapping and parent != "turnmesh" and folder == f"{mapping[parent]}/{name}":
            continue  # inside a folder linked already (turnmesh.agent.builtin)
        links[TREE / Path(*module.split("."))] = ROOT / folder
    for name in OTHER_PACKAGES:
        links[TREE / name] = ROOT / name
    package = TREE / "turnmesh"
    package.mkdir(parents=True, exist_ok=True)
    for entry in (ROOT / "turnmesh").iterdir():
        if entry.suffix in (".py", ".typed"):
            links[package / entry.name] = entry
    for link, target in links.items():
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() and link.resolve() == target.resolve():
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target, target_is_directory=target.is_dir())
    return links


def main() -> int:
    links = build_tree()
    command = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        str(ROOT / "pyproject.toml"),
        "--cache-dir",
        str(ROOT / ".mypy_cache"),
        "-p",
        "turnmesh",
        *(arg for name in OTHER_PACKAGES for arg in ("-p", name)),
        *sys.argv[1:],
    ]
    result = subprocess.run(
        command, cwd=TREE, capture_output=True, text=True, env={**os.environ, "MYPYPATH": ""}
    )
    # Longest links first, so turnmesh/server/compat maps before turnmesh/server.
    by_length = sorted(links.items(), key=lambda item: -len(str(item[0])))
    for line in (result.stdout + result.stderr).splitlines():
        for link, target in by_length:
            relative = str(link.relative_to(TREE))
            if line.startswith(relative + os.sep):
                line = str(target.relative_to(ROOT)) + line[len(relative) :]
                break
        print(line)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
