"""The Buf module (`make proto-lint`): it builds offline, its lint exceptions
are only the declared ones, and the breaking check guards the public protos
while leaving the internal ones free to change."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUF = ROOT / "tools" / "node_modules" / ".bin" / "buf"


@pytest.fixture
def module(tmp_path: Path) -> Path:
    """A copy of the module (protos, vendored imports, config, baseline)."""
    assert BUF.exists(), "buf comes with `make install` (tools/package.json)"
    for name in ("proto", "third_party"):
        shutil.copytree(ROOT / name, tmp_path / name)
    for name in ("buf.yaml", "buf.baseline.binpb"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def buf(module: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BUF), *args], cwd=module, capture_output=True, text=True, timeout=120, check=False
    )


def edit(module: Path, name: str, old: str, new: str) -> None:
    path = module / "proto" / "turnmesh" / "v1" / name
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_the_module_builds_lints_and_breaks_nothing(module: Path) -> None:
    for args in (["build"], ["lint"], ["breaking", "proto", "--against", "buf.baseline.binpb"]):
        result = buf(module, *args)
        assert result.returncode == 0, (args, result.stdout, result.stderr)


def test_a_break_in_a_public_proto_fails_the_check(module: Path) -> None:
    edit(module, "session_service.proto", "string message = 2;", "bytes message = 2;")
    result = buf(module, "breaking", "proto", "--against", "buf.baseline.binpb")
    assert result.returncode != 0
    assert "TurnRequest" in result.stdout


def test_internal_protos_are_free_to_change(module: Path) -> None:
    edit(module, "worker_service.proto", "int32 history_base = 7;", "int64 history_base = 7;")
    result = buf(module, "breaking", "proto", "--against", "buf.baseline.binpb")
    assert result.returncode == 0, result.stdout


def test_lint_exceptions_cover_only_what_they_name(module: Path) -> None:
    # A new enum in a public proto must follow Buf's style (only AG-UI's
    # EventType is exempt).
    path = module / "proto" / "turnmesh" / "v1" / "message.proto"
    path.write_text(path.read_text() + "\nenum Color {\n  RED = 0;\n}\n")
    result = buf(module, "lint")
    assert result.returncode != 0
    assert "COLOR_" in result.stdout
