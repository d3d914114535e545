"""Hostile input the fuzz test does not reach by chance: deep nesting, lone
surrogates, wrong JSON types on the compatibility surfaces, zip files that
lie about their size. Every answer is a 4xx problem (never a 5xx, never an
exception's text), and the server's event loop keeps answering meanwhile."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import subprocess

import grpc
import httpx
import pytest

from tests.conftest import SharedMesh
from tests.support.mesh import Mesh, eventually, until
from turnmesh.v1 import session_service_pb2 as spb


def _deep(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def _deep_list(depth: int) -> str:
    return "[" * depth + "]" * depth


CASES = [
    ("POST", "/v1/sessions", '{"metadata": ' + _deep(60) + "}"),
    ("POST", "/v1/sessions", '{"metadata": ' + _deep(2000) + "}"),
    ("POST", "/v1/sessions/{sid}/turns", '{"message": "hi", "metadata": ' + _deep(60) + "}"),
    ("POST", "/v1/sessions/{sid}/turns", '{"message": "\\ud800"}'),
    ("POST", "/v1/sessions/{sid}/turns", '{"message": "ok \\udfff tail"}'),
    ("POST", "/v1/chat/completions", '{"model": "echo", "messages": ' + _deep_list(100_000) + "}"),
    (
        "POST",
        "/v1/chat/completions",
        '{"model": "echo", "messages": [{"role": "user", "content": "\\ud800"}]}',
    ),
    (
        "POST",
        "/v1/chat/completions",
        '{"model": "echo", "messages": [{"role": "user", "content": ' + _deep(5000) + "}]}",
    ),
    ("POST", "/v1/responses", '{"model": "echo", "input": ' + _deep_list(100_000) + "}"),
    ("POST", "/v1/responses", '{"model": "echo", "input": "\\udc00"}'),
    (
        "POST",
        "/v1/agui",
        '{"threadId": "t", "runId": "r", "forwardedProps": {"policy": []},'
        ' "messages": [{"id": "m", "role": "user", "content": "hi"}]}',
    ),
    (
        "POST",
        "/v1/agui",
        '{"threadId": "t", "runId": "r", "messages": ' + _deep_list(100_000) + "}",
    ),
    ("POST", "/v1/agui", '{"threadId": "\\ud800", "runId": "r", "messages": []}'),
    ("POST", "/v1/chat", '{"message": "\\ud800"}'),
]


@pytest.mark.parametrize(("method", "path", "body"), CASES, ids=range(len(CASES)))
def test_hostile_bodies_get_a_clear_4xx(
    shared_mesh: SharedMesh, method: str, path: str, body: str
) -> None:
    with httpx.Client(base_url=f"http://{shared_mesh.edge}", timeout=60) as rest:
        sid = rest.post("/v1/sessions", json={"agentName": "echo"}).json()["session"]["sessionId"]
        response = rest.request(
            method,
            path.replace("{sid}", sid),
            content=body.encode(),
            headers={"content-type": "application/json"},
        )
        assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
        assert "Traceback" not in response.text and "Error(" not in response.text
        problem = json.loads(response.text)
        # problem+json, or on the OpenAI paths OpenAI's error shape.
        assert "status" in problem or problem["error"]["type"] == "invalid_request_error"


async def test_collected_requests_count_against_the_sessions_byte_budget(
    mesh_factory: Mesh,
) -> None:
    """While a turn runs, COLLECT requests with files pile onto one session:
    past its byte budget (1 MB here) they get 429 before anything more is
    held, and another session's turn runs meanwhile."""
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("probe", "probe_agent:ProbeAgent")
    server = mesh.spawn_server(
        "server", "--agent", "probe", "--max-pending-bytes", "1000000", "--metrics-port", "0"
    )
    mesh.wait_ready(worker, server)
    envoy = mesh.start_envoy([server])
    file = {
        "filename": "big.txt",
        "mime_type": "text/plain",
        "content": base64.b64encode(b"a" * 300_000).decode(),
    }
    async with httpx.AsyncClient(base_url=f"http://{envoy.listener_address}", timeout=120) as rest:
        sid = (await rest.post("/v1/sessions", json={})).json()["session"]["sessionId"]
        other = (await rest.post("/v1/sessions", json={})).json()["session"]["sessionId"]
        held = asyncio.create_task(
            rest.post(
                f"/v1/sessions/{sid}/turns",
                json={"message": "hold", "metadata": {"gate": "budget", "deltas": 2}},
            )
        )
        await until(lambda: any(mesh.probe_dir.glob("*.started")), what="the first turn")
        joined = [
            asyncio.create_task(
                rest.post(
                    f"/v1/sessions/{sid}/turns",
                    json={"message": f"m{i}", "files": [file], "metadata": {"deltas": 1}},
                )
            )
            for i in range(3)
        ]
        # The three fit (900 kB): wait until they are held, then one more does not.
        metrics = f"http://{server.info['metrics_address']}/metrics"

        async def all_held() -> bool:
            return await _pending_bytes(rest, metrics) >= 900_000

        await eventually(all_held, timeout=60, what="three coalesced requests held")
        refused = await rest.post(
            f"/v1/sessions/{sid}/turns",
            json={"message": "one more", "files": [file]},
        )
        assert refused.status_code == 429, refused.text
        assert "MiB of turns running or waiting" in refused.json()["detail"]
        innocent = await rest.post(
            f"/v1/sessions/{other}/turns", json={"message": "hi", "metadata": {"deltas": 1}}
        )
        assert innocent.status_code == 200 and "RUN_FINISHED" in innocent.text
        (mesh.probe_dir / "gate-budget").write_text("open")
        for response in [await held, *[await task for task in joined]]:
            assert response.status_code == 200 and "RUN_FINISHED" in response.text


async def _pending_bytes(rest: httpx.AsyncClient, metrics: str) -> float:
    """What the server's turns hold (turnmesh_pending_turn_bytes)."""
    for line in (await rest.get(metrics)).text.splitlines():
        if line.startswith("turnmesh_pending_turn_bytes "):
            return float(line.split()[1])
    return 0.0


def test_the_playground_is_never_framed_by_another_page(shared_mesh: SharedMesh) -> None:
    page = httpx.get(f"http://{shared_mesh.edge}/", timeout=30)
    assert page.status_code == 200
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"


@pytest.mark.parametrize(
    "encoding", [None, "gzip", "no-such-codec"], ids=["no-encoding", "gzip", "unknown"]
)
def test_a_grpc_message_with_a_bad_compression_changes_nothing(
    shared_mesh: SharedMesh, encoding: str | None
) -> None:
    """A message whose compressed flag is set but that no declared encoding
    decodes (none declared, not gzip data, an encoding gRPC does not know) is
    refused by gRPC core before turnmesh's code sees the call: INTERNAL, with
    gRPC's own short message (docs/api.md, "Errors"). Nothing is created."""
    session_id = f"bad-compression-{encoding or 'none'}"
    message = spb.CreateSessionRequest(session_id=session_id).SerializeToString()
    frame = b"\x01" + len(message).to_bytes(4, "big") + message  # flag 1: "compressed"
    headers = ["content-type: application/grpc", "te: trailers"]
    if encoding is not None:
        headers.append(f"grpc-encoding: {encoding}")
    answer = subprocess.run(
        [
            "curl",
            "-sS",
            "-v",
            "--http2-prior-knowledge",
            "--max-time",
            "60",
            *[arg for header in headers for arg in ("-H", header)],
            "--data-binary",
            "@-",
            f"http://{shared_mesh.edge}/turnmesh.v1.SessionService/CreateSession",
        ],
        input=frame,
        capture_output=True,
        timeout=90,
        check=False,
    )
    trace = answer.stderr.decode(errors="replace")
    status = re.search(r"< grpc-status: (\d+)", trace)
    assert status is not None, trace
    assert status.group(1) == str(grpc.StatusCode.INTERNAL.value[0])
    shown = re.search(r"< grpc-message: (.*)", trace)
    assert shown is not None and "Traceback" not in shown.group(1) and "File " not in shown.group(1)
    with httpx.Client(base_url=f"http://{shared_mesh.edge}", timeout=60) as rest:
        assert rest.get(f"/v1/sessions/{session_id}").status_code == 404
        assert rest.get("/ready").status_code == 200
