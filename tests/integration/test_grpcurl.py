"""Operators debug with grpcurl: reflection on every process, a Turn by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SharedMesh

GRPCURL = str(Path(sys.executable).parent / "grpcurl")


def grpcurl(*args: str) -> str:
    result = subprocess.run(
        [GRPCURL, "-plaintext", *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _objects(text: str) -> list[dict[str, object]]:
    """grpcurl prints a stream as pretty JSON objects one after another."""
    decoder = json.JSONDecoder()
    objects, index = [], 0
    text = text.strip()
    while index < len(text):
        obj, end = decoder.raw_decode(text, index)
        objects.append(obj)
        index = end
        while index < len(text) and text[index].isspace():
            index += 1
    return objects


@pytest.mark.parametrize(
    ("component", "service"),
    [
        ("router", "turnmesh.v1.RouterService"),
        ("server", "turnmesh.v1.SessionService"),
        ("worker", "turnmesh.v1.WorkerService"),
    ],
)
def test_grpcurl_lists_services(shared_mesh: SharedMesh, component: str, service: str) -> None:
    address = {
        "router": shared_mesh.router.address,
        "server": shared_mesh.servers[0].address,
        "worker": shared_mesh.workers[0].address,
    }[component]
    services = grpcurl(address, "list").split()
    assert service in services
    assert "grpc.health.v1.Health" in services
    assert "grpc.reflection.v1alpha.ServerReflection" in services


def test_grpcurl_conversation(shared_mesh: SharedMesh) -> None:
    address = shared_mesh.servers[1].address
    created = json.loads(
        grpcurl(
            "-d",
            '{"session_id": "grpcurl-thread-1"}',
            address,
            "turnmesh.v1.SessionService/CreateSession",
        )
    )
    assert created["session"]["session_id"] == "grpcurl-thread-1"

    out = grpcurl(
        "-d",
        '{"session_id": "grpcurl-thread-1", "message": "What is 6*7?"}',
        address,
        "turnmesh.v1.SessionService/Turn",
    )
    events = _objects(out)
    assert events[0]["type"] == "RUN_STARTED"
    assert events[-1]["type"] == "RUN_FINISHED"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    text = "".join(str(e.get("delta", "")) for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert "42" in text

    history = json.loads(
        grpcurl(
            "-d",
            '{"session_id": "grpcurl-thread-1"}',
            address,
            "turnmesh.v1.SessionService/GetHistory",
        )
    )
    assert [m["role"] for m in history["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert history["messages"][1]["tool_calls"][0]["function"]["name"] == "calculator"

    health = json.loads(grpcurl(address, "grpc.health.v1.Health/Check"))
    assert health["status"] == "SERVING"


def test_grpcurl_through_envoy(shared_mesh: SharedMesh) -> None:
    edge = shared_mesh.edge
    services = grpcurl(edge, "list").split()
    assert "turnmesh.v1.SessionService" in services
    described = grpcurl(edge, "describe", "turnmesh.v1.SessionService")
    assert (
        "rpc Turn ( .turnmesh.v1.TurnRequest ) returns ( stream .turnmesh.v1.Event )" in described
    )
    created = json.loads(
        grpcurl("-d", '{"agent_name": "echo"}', edge, "turnmesh.v1.SessionService/CreateSession")
    )
    sid = created["session"]["session_id"]
    events = _objects(
        grpcurl(
            "-d",
            json.dumps({"session_id": sid, "message": "through the edge"}),
            edge,
            "turnmesh.v1.SessionService/Turn",
        )
    )
    assert events[-1]["type"] == "RUN_FINISHED"
    text = "".join(str(e.get("delta", "")) for e in events)
    assert text == "through the edge"
