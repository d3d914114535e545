"""Every error a REST client can get through Envoy is application/problem+json;
native gRPC callers on the same port keep plain gRPC statuses."""

from __future__ import annotations

import json
import socket

import grpc
import httpx
import pytest

from tests.conftest import SharedMesh
from tests.support.mesh import Mesh
from turnmesh.client import AsyncClient, InvalidArgumentError, UnavailableError
from turnmesh.envoy.config import MAX_REQUEST_BODY_BYTES
from turnmesh.envoy.guards import MAX_HEADER_BYTES
from turnmesh.envoy.process import RunningEnvoy
from turnmesh.runtime.errors import PROBLEM_BASE
from turnmesh.v1.session_service_pb2 import GetSessionRequest


def _problem(response: httpx.Response, status: int) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, object] = response.json()
    assert body["status"] == status
    assert str(body["type"]).startswith("https://turnmesh.dev/problems/")
    assert body["title"]
    assert "detail" in body
    assert "Traceback" not in response.text
    return body


async def _session(rest: httpx.AsyncClient, **body: object) -> str:
    return str((await rest.post("/v1/sessions", json=body)).json()["session"]["sessionId"])


async def test_blank_message_is_400_with_the_field_violation(rest: httpx.AsyncClient) -> None:
    sid = await _session(rest)
    body = _problem(await rest.post(f"/v1/sessions/{sid}/turns", json={"message": "   "}), 400)
    assert body["violations"] == [{"field": "message", "description": "must not be blank"}]
    assert body["type"] == "https://turnmesh.dev/problems/invalid-argument"
    assert (await rest.get(f"/v1/sessions/{sid}/history")).json() == {
        "messages": []
    }  # nothing changed


async def test_several_violations_are_all_listed(rest: httpx.AsyncClient) -> None:
    sid = await _session(rest)
    bad_file = {
        "content": "aGk=",
        "mime_type": "application/zip",
        "filename": 'a [weird] "name" }.zip',
    }
    body = _problem(
        await rest.post(f"/v1/sessions/{sid}/turns", json={"message": "", "files": [bad_file]}),
        400,
    )
    violations = body["violations"]
    assert isinstance(violations, list)
    assert [v["field"] for v in violations] == ["message", "files[0].mime_type"]
    assert 'a [weird] "name" }.zip' in violations[1]["description"]


async def test_unknown_session_is_404(rest: httpx.AsyncClient) -> None:
    body = _problem(await rest.get("/v1/sessions/no-such-session"), 404)
    assert "no-such-session" in str(body["detail"])
    body = _problem(
        await rest.post("/v1/sessions/no-such-session/turns", json={"message": "hi"}), 404
    )
    assert body["reason"] == "NOT_FOUND"


async def test_busy_session_is_409(rest: httpx.AsyncClient, client: AsyncClient) -> None:
    sid = await _session(rest, agentName="probe")
    async with client.stream_turn(sid, "slow", metadata={"deltas": 1000, "delay_ms": 50}) as s:
        async for event in s:
            if event.delta:
                body = _problem(
                    await rest.post(
                        f"/v1/sessions/{sid}/turns",
                        json={"message": "hi", "policy": "TURN_POLICY_REJECT"},
                    ),
                    409,
                )
                assert body["reason"] == "SESSION_BUSY"
                await client.cancel_turn(sid, event.run_id)
                break  # deltas already sent may follow the cancel: no second try


async def test_unknown_path_and_query_parameter(rest: httpx.AsyncClient) -> None:
    _problem(await rest.get("/v1/nothing-here"), 404)
    _problem(await rest.get("/v1/sessions/x", params={"unknown": "1"}), 400)


async def test_bad_json_and_bad_enum_are_400(rest: httpx.AsyncClient) -> None:
    response = await rest.post(
        "/v1/sessions", content=b"{not json", headers={"content-type": "application/json"}
    )
    _problem(response, 400)
    sid = await _session(rest)
    _problem(
        await rest.post(f"/v1/sessions/{sid}/turns", json={"message": "x", "policy": "NOPE"}),
        400,
    )


def _raw_request(address: str, head: str) -> tuple[int, dict[str, str], bytes]:
    """Send only a request head (no body) and read the final response,
    skipping interim 1xx responses such as "100 Continue"."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(head.encode())
        data = b""
        while True:
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    raise ConnectionError(f"connection closed after {data!r}")
                data += chunk
            header_block, _, data = data.partition(b"\r\n\r\n")
            lines = header_block.decode().split("\r\n")
            status = int(lines[0].split()[1])
            if status >= 200:
                break
        headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:])}
        while len(data) < int(headers.get("content-length", "0")):
            data += conn.recv(65536)
    return status, headers, data


async def test_oversize_body_is_413_before_it_is_sent(
    rest: httpx.AsyncClient, shared_mesh: SharedMesh
) -> None:
    sid = await _session(rest, agentName="echo")
    size = MAX_REQUEST_BODY_BYTES + 1  # one byte over
    status, headers, body = _raw_request(
        shared_mesh.edge,
        f"POST /v1/sessions/{sid}/turns HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nContent-Length: {size}\r\n"
        "Expect: 100-continue\r\n\r\n",
    )
    assert status == 413  # decided from the head: the body is never uploaded
    assert headers["content-type"] == "application/problem+json"
    problem = json.loads(body)
    assert problem["status"] == 413
    assert str(size) in problem["detail"]
    assert (await rest.get(f"/v1/sessions/{sid}/history")).json() == {"messages": []}


async def test_oversized_headers_get_431_in_each_surfaces_shape(
    rest: httpx.AsyncClient, shared_mesh: SharedMesh
) -> None:
    """Headers past the edge's limit get 431 in the caller's shape, naming no
    header Envoy adds; headers within it (the path counted twice upstream)
    reach a server, which accepts them: never gRPC's 429 "metadata size
    exceeds hard limit"."""
    sid = await _session(rest, agentName="echo")
    over = {"x-big": "a" * MAX_HEADER_BYTES}
    problem = await rest.get(f"/v1/sessions/{sid}", headers=over)
    assert _problem(problem, 431)["type"] == PROBLEM_BASE + "request-header-fields-too-large"
    chat = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
    openai = await rest.post("/v1/chat/completions", json=chat, headers=over)
    assert openai.status_code == 431, openai.text
    assert openai.json()["error"]["type"] == "invalid_request_error"
    assert openai.headers["x-should-retry"] == "false"
    for refused in (problem, openai):
        assert str(MAX_HEADER_BYTES) in refused.text
        assert "x-envoy" not in refused.text and "x-turnmesh" not in refused.text
    # Within the limit: a 5 KiB path (sent on twice) and 5 KiB more.
    under = {"x-big": "a" * (5 * 1024)}
    long_id = "s" * (5 * 1024)
    reached = await rest.get(f"/v1/sessions/{long_id}", headers=under)
    assert reached.status_code in (400, 404), reached.text  # the server's answer
    served = await rest.post("/v1/chat/completions", json=chat, headers=under)
    assert served.status_code == 200, served.text
    async with grpc.aio.insecure_channel(shared_mesh.edge) as channel:
        get: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            "/turnmesh.v1.SessionService/GetSession"
        )
        message = GetSessionRequest(session_id=sid).SerializeToString()
        assert await get(message, metadata=tuple(under.items()), timeout=60)
        with pytest.raises(grpc.aio.AioRpcError) as refused_call:
            await get(message, metadata=tuple(over.items()), timeout=60)
    assert refused_call.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert str(MAX_HEADER_BYTES) in str(refused_call.value.details())


@pytest.fixture
def dead_edge(mesh_factory: Mesh) -> RunningEnvoy:
    """An Envoy whose only upstream is a server that has stopped."""
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("echo", "echo")
    server = mesh.spawn_server("server")
    mesh.wait_ready(worker, server)
    envoy = mesh.start_envoy([server])
    mesh.kill(server)
    return envoy


async def test_upstream_down_is_503_and_plain_unavailable_for_grpc(
    dead_edge: RunningEnvoy,
) -> None:
    async with httpx.AsyncClient(base_url=f"http://{dead_edge.listener_address}") as rest:
        body = _problem(await rest.post("/v1/sessions", json={}), 503)
        assert body["type"] == "https://turnmesh.dev/problems/unavailable"
        assert body["title"] == "Service unavailable"
    async with AsyncClient(dead_edge.listener_address, timeout=10) as client:
        with pytest.raises(UnavailableError) as info:
            await client.create_session()
        assert info.value.code == grpc.StatusCode.UNAVAILABLE


async def test_native_grpc_errors_stay_grpc(shared_mesh: SharedMesh) -> None:
    async with AsyncClient(shared_mesh.edge) as client:
        sid = (await client.create_session()).session_id
        with pytest.raises(InvalidArgumentError) as info:
            await client.send(sid, "   ")
        assert info.value.violations == {"message": "must not be blank"}
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
