"""gen/ is exactly what scripts/gen_protos.py makes from proto/."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parents[2]


def _files(root: Path) -> set[str]:
    return {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_generated_code_matches_protos(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), str(tmp_path)],
        check=True,
        capture_output=True,
    )
    committed = ROOT / "gen"
    assert _files(tmp_path) == _files(committed), "run `make gen` and commit"
    changed = [
        name
        for name in _files(committed)
        if not filecmp.cmp(tmp_path / name, committed / name, shallow=False)
    ]
    assert not changed, f"gen/ is stale ({changed}): run `make gen` and commit"


def test_descriptor_set_holds_what_envoy_needs() -> None:
    fds = descriptor_pb2.FileDescriptorSet.FromString(
        (ROOT / "gen" / "turnmesh" / "v1" / "turnmesh.binpb").read_bytes()
    )
    names = {f.name for f in fds.file}
    assert "turnmesh/v1/session_service.proto" in names
    assert "google/rpc/error_details.proto" in names
    assert "google/api/annotations.proto" in names
    services = {f"{f.package}.{s.name}" for f in fds.file for s in f.service}
    assert {
        "turnmesh.v1.SessionService",
        "turnmesh.v1.RouterService",
        "turnmesh.v1.WorkerService",
    } <= services


def test_every_public_rpc_has_an_http_rule() -> None:
    from google.api import annotations_pb2

    from turnmesh.v1 import session_service_pb2

    service = session_service_pb2.DESCRIPTOR.services_by_name["SessionService"]
    for method in service.methods:
        rule = method.GetOptions().Extensions[annotations_pb2.http]
        assert rule.WhichOneof("pattern"), f"{method.name} has no google.api.http rule"


def test_event_type_names_are_agui_names() -> None:
    from turnmesh.v1 import event_pb2

    names = set(event_pb2.EventType.keys())
    assert {
        "RUN_STARTED",
        "RUN_FINISHED",
        "RUN_ERROR",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
    } <= names


def test_api_reference_matches_protos(tmp_path: Path) -> None:
    out = tmp_path / "api.md"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_api_docs.py"), str(out)],
        check=True,
        capture_output=True,
    )
    assert out.read_text() == (ROOT / "docs" / "api.md").read_text(), (
        "docs/api.md is stale: run `make gen` and commit"
    )


def test_envoy_loads_a2a_exactly_as_the_pinned_sdk_ships_it() -> None:
    """One contract for lf.a2a.v1: the descriptor Envoy transcodes with is the
    pinned a2a-sdk's own, not a copy that could drift from it."""
    from a2a.types import a2a_pb2

    from turnmesh.envoy import config as envoy_config
    from turnmesh.envoy.edge_config import DESCRIPTOR_SET, EdgeConfig

    fds = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SET.read_bytes())
    (loaded,) = [f for f in fds.file if f.package == "lf.a2a.v1"]
    assert loaded == descriptor_pb2.FileDescriptorProto.FromString(a2a_pb2.DESCRIPTOR.serialized_pb)
    # Its imports come before it, as Envoy builds the pool in order.
    names = [f.name for f in fds.file]
    assert all(names.index(d) < names.index(loaded.name) for d in loaded.dependency)
    manager = envoy_config.render(EdgeConfig(upstreams=["127.0.0.1:1"]))["static_resources"][
        "listeners"
    ][0]["filter_chains"][0]["filters"][0]["typed_config"]
    (transcoder,) = [
        f["typed_config"]
        for f in manager["http_filters"]
        if f["name"] == "envoy.filters.http.grpc_json_transcoder"
    ]
    assert transcoder["proto_descriptor"] == str(DESCRIPTOR_SET)
    assert "lf.a2a.v1.A2AService" in transcoder["services"]
