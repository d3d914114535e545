"""The protos as other languages' tools use them, from this checkout alone:
googleapis' files are vendored under third_party/ (identical to what
googleapis-common-protos ships), protoc compiles proto/ with only that, and
@grpc/proto-loader plus @grpc/grpc-js run a real turn through Envoy."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import google.api
import google.rpc

from tests.conftest import SharedMesh

ROOT = Path(__file__).resolve().parents[2]
THIRD_PARTY = ROOT / "third_party"
GRPC_JS = ROOT / "clients" / "grpc-js"


def test_vendored_googleapis_files_are_the_ones_the_python_package_ships() -> None:
    vendored = sorted(THIRD_PARTY.rglob("*.proto"))
    assert vendored, "third_party/ holds no protos"
    packages = {
        "api": Path(next(iter(google.api.__path__))),
        "rpc": Path(next(iter(google.rpc.__path__))),
    }
    for path in vendored:
        relative = path.relative_to(THIRD_PARTY / "google")
        shipped = packages[relative.parts[0]] / Path(*relative.parts[1:])
        assert path.read_bytes() == shipped.read_bytes(), f"{relative} differs from the package's"


def test_protoc_compiles_the_public_protos_from_the_checkout(tmp_path: Path) -> None:
    from importlib import resources

    from grpc_tools import protoc

    # The well-known types (struct, timestamp, descriptor) ship with protoc;
    # grpc_tools keeps them beside its own copy.
    well_known = resources.files("grpc_tools") / "_proto"
    protos = sorted(str(p.relative_to(ROOT / "proto")) for p in (ROOT / "proto").rglob("*.proto"))
    code = protoc.main(
        [
            "protoc",
            f"-I{ROOT / 'proto'}",
            f"-I{THIRD_PARTY}",
            f"-I{well_known}",
            f"--descriptor_set_out={tmp_path / 'out.binpb'}",
            *protos,
        ]
    )
    assert code == 0
    assert (tmp_path / "out.binpb").stat().st_size > 0


async def test_grpc_js_runs_a_turn_with_protos_loaded_from_the_checkout(
    shared_mesh: SharedMesh,
) -> None:
    assert (GRPC_JS / "node_modules" / "@grpc" / "grpc-js").is_dir(), "run `make install`"
    result = await asyncio.to_thread(
        subprocess.run,
        ["node", str(GRPC_JS / "turn.mjs"), shared_mesh.edge, "What is 6*7?"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    events, summary = lines[:-1], lines[-1]
    assert events[0]["type"] == "RUN_STARTED"
    assert events[-1]["type"] == "RUN_FINISHED"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert "42" in "".join(e.get("delta", "") for e in events)
    assert summary == {"history": 4}  # the user's message, the tool call, its result, the answer
