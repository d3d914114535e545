"""A2A's JSON-RPC 2.0 binding by raw HTTP through Envoy (the a2a-sdk client
runs every test of test_a2a.py over it too): answers and their ids, SSE
framing, A2A's error codes, and what JSON-RPC itself refuses (batches,
notifications, v0.3 names, hostile bodies) as JSON-RPC errors, never a 5xx
or Python's words, and never a session made."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.conftest import SharedMesh
from turnmesh.envoy.config import MAX_REQUEST_BODY_BYTES
from turnmesh.envoy.guards import MAX_HEADER_BYTES

pytestmark = pytest.mark.integration

A2A_DOMAIN = "a2a-protocol.org"


@pytest.fixture
async def http(shared_mesh: SharedMesh) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=f"http://{shared_mesh.edge}", timeout=60) as client:
        yield client


def _call(method: str, params: Any = None, request_id: Any = 1) -> dict[str, Any]:
    request: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        request["params"] = params
    return request


def _message(text: str, context_id: str = "") -> dict[str, Any]:
    message: dict[str, Any] = {
        "messageId": str(uuid.uuid4()),
        "role": "ROLE_USER",
        "parts": [{"text": text}] if text else [],
    }
    if context_id:
        message["contextId"] = context_id
    return {"message": message}


def _error(response: httpx.Response, request_id: Any = 1) -> dict[str, Any]:
    """The JSON-RPC error of an answer (HTTP 200, JSON, the request's id)."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert "Traceback" not in response.text and "Error:" not in response.text
    body = response.json()
    assert body["jsonrpc"] == "2.0" and "result" not in body, body
    assert body["id"] == request_id
    error: dict[str, Any] = body["error"]
    assert isinstance(error["code"], int) and error["message"]
    return error


def _reason(error: dict[str, Any]) -> tuple[str, str]:
    info = error["data"][0]
    assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
    return info["reason"], info["domain"]


def _frames(text: str) -> list[tuple[str, dict[str, Any]]]:
    """An SSE body's frames as (event, JSON data)."""
    frames = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        frames.append((fields.get("event", "message"), json.loads(fields["data"])))
    return frames


async def test_a_call_is_answered_with_its_id(http: httpx.AsyncClient) -> None:
    """SendMessage and GetTask: the result is the RPC's response in proto
    JSON, under the request's id (string or integer); the default agent also
    answers at the bare /jsonrpc."""
    sent = await http.post("/echo/jsonrpc", json=_call("SendMessage", _message("hi"), "a-1"))
    assert sent.status_code == 200, sent.text
    body = sent.json()
    assert (body["jsonrpc"], body["id"]) == ("2.0", "a-1")
    task = body["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert "hi" in task["artifacts"][0]["parts"][0]["text"]
    read = await http.post("/echo/jsonrpc", json=_call("GetTask", {"id": task["id"]}, 42))
    assert read.json()["id"] == 42
    assert read.json()["result"]["artifacts"] == task["artifacts"]
    # Another agent's endpoint does not find it.
    error = _error(await http.post("/demo/jsonrpc", json=_call("GetTask", {"id": task["id"]})))
    assert error["code"] == -32001
    default = await http.post("/jsonrpc", json=_call("SendMessage", _message("bare")))
    assert default.json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"


async def test_a_stream_is_sse_of_json_rpc_responses(http: httpx.AsyncClient) -> None:
    """SendStreamingMessage: SSE, each frame one JSON-RPC response with the
    request's id: the task, its updates, the answer in pieces, the end."""
    response = await http.post(
        "/echo/jsonrpc", json=_call("SendStreamingMessage", _message("stream me"), "s-1")
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = _frames(response.text)
    assert {event for event, _ in frames} == {"message"}
    assert all(data["jsonrpc"] == "2.0" and data["id"] == "s-1" for _, data in frames)
    results = [data["result"] for _, data in frames]
    assert "task" in results[0]
    assert results[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
    text = "".join(
        part["text"]
        for r in results
        if "artifactUpdate" in r
        for part in r["artifactUpdate"]["artifact"]["parts"]
    )
    assert "stream me" in text
    # A task that ended has nothing more to stream: a plain JSON error, not SSE.
    task_id = results[0]["task"]["id"]
    again = await http.post("/echo/jsonrpc", json=_call("SubscribeToTask", {"id": task_id}))
    assert _error(again)["code"] == -32004


async def test_a2a_errors_have_a2as_codes(http: httpx.AsyncClient) -> None:
    """The error table's JSON-RPC column: A2A's codes, ErrorInfo in data."""
    missing = _error(await http.post("/demo/jsonrpc", json=_call("GetTask", {"id": "nope"})))
    assert missing["code"] == -32001
    assert _reason(missing) == ("TASK_NOT_FOUND", A2A_DOMAIN)
    done = (await http.post("/demo/jsonrpc", json=_call("SendMessage", _message("x")))).json()
    task_id = done["result"]["task"]["id"]
    finished = _error(await http.post("/demo/jsonrpc", json=_call("CancelTask", {"id": task_id})))
    assert finished["code"] == -32002
    assert _reason(finished) == ("TASK_NOT_CANCELABLE", A2A_DOMAIN)
    push = _error(
        await http.post(
            "/demo/jsonrpc",
            json=_call("GetTaskPushNotificationConfig", {"taskId": task_id, "id": "c"}),
        )
    )
    assert push["code"] in (-32003, -32001)  # not served, or (once served) no such config
    listed = await http.post("/demo/jsonrpc", json=_call("ListTasks", {}))
    assert listed.status_code == 200 and "jsonrpc" in listed.json()
    # The mesh's own rows: an agent nobody serves is not found (-32050 - NOT_FOUND).
    nobody = _error(await http.post("/nobody/jsonrpc", json=_call("SendMessage", _message("x"))))
    assert nobody["code"] == -32055


async def test_bad_params_are_invalid_params_and_change_nothing(
    http: httpx.AsyncClient,
) -> None:
    context_id = f"jsonrpc-bad-{uuid.uuid4()}"
    empty = _error(
        await http.post("/demo/jsonrpc", json=_call("SendMessage", _message("", context_id)))
    )
    assert empty["code"] == -32602
    assert _reason(empty) == ("INVALID_PARAMS", A2A_DOMAIN)
    assert empty["data"][1]["@type"] == "type.googleapis.com/google.rpc.BadRequest"
    for method, params in (
        ("SendMessage", [1, 2]),  # not an object
        ("SendMessage", {"message": 5}),  # not the method's request
        ("SendMessage", {"message": {"parts": [{"text": "x"}]}}),  # no message id
        ("GetTask", {"historyLength": "many", "id": "x"}),
    ):
        error = _error(await http.post("/demo/jsonrpc", json=_call(method, params, 5)), 5)
        assert error["code"] == -32602, (params, error)
    # The path names the agent: params naming another are refused.
    other = _call("SendMessage", {**_message("x", context_id), "tenant": "echo"})
    assert _error(await http.post("/demo/jsonrpc", json=other))["code"] == -32602
    # None of them made the context.
    assert (await http.get(f"/v1/sessions/{context_id}")).status_code == 404


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", -32700),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "\xff\xfe"}}', -32700),
        (b"[" * 100 + b"]" * 100, -32600),  # a batch, however deep
        (b'{"a":' * 100 + b"1" + b"}" * 100, -32700),  # nested past the limit
        (b'"just a string"', -32600),
        (b"[]", -32600),
        (
            json.dumps([_call("GetTask", {"id": "x"}), _call("GetTask", {"id": "y"})]).encode(),
            -32600,
        ),
        (b'{"jsonrpc": "2.0", "method": "GetTask", "params": {"id": "x"}}', -32600),
        (b'{"jsonrpc": "1.0", "id": null, "method": "GetTask"}', -32600),
        (b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "GetTask"}', -32600),
        (b'{"jsonrpc": "2.0", "id": true, "method": "GetTask"}', -32600),
        (b'{"jsonrpc": "2.0", "id": null, "method": 7}', -32600),
        (b'{"jsonrpc": "2.0", "id": null, "method": "DropAllTables"}', -32601),
        (b'{"jsonrpc": "2.0", "id": null, "method": "' + b"x" * 10_000 + b'"}', -32601),
    ],
)
async def test_what_json_rpc_refuses(http: httpx.AsyncClient, body: bytes, code: int) -> None:
    """Not a request JSON-RPC serves: an error object with id null (it could
    not be read, or names no call to answer), HTTP 200, no 5xx."""
    response = await http.post(
        "/demo/jsonrpc", content=body, headers={"content-type": "application/json"}
    )
    error = _error(response, request_id=None)
    assert error["code"] == code, error
    assert len(response.content) < 2000  # nothing echoed back at length


async def test_v03_method_names_point_to_v10(http: httpx.AsyncClient) -> None:
    for name in ("message/send", "tasks/get", "tasks/resubscribe"):
        error = _error(await http.post("/demo/jsonrpc", json=_call(name, {"id": "x"}, 3)), 3)
        assert error["code"] == -32601
        assert "v0.3" in error["message"] and "SendMessage" in error["message"]


def _head_only(address: str, head: bytes) -> tuple[int, bytes]:
    """Send a request head (no body); the final status and body."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(head)
        data = b""
        while True:
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                assert chunk, data
                data += chunk
            block, _, data = data.partition(b"\r\n\r\n")
            lines = block.decode().split("\r\n")
            if int(lines[0].split()[1]) >= 200:  # past "100 Continue"
                break
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        while len(data) < int(headers.get("content-length", "0")):
            data += conn.recv(65536)
    return int(lines[0].split()[1]), data


async def test_the_edges_own_refusals_are_json_rpc_errors(
    http: httpx.AsyncClient, shared_mesh: SharedMesh
) -> None:
    """Envoy's local replies on a JSON-RPC endpoint (a body over the limit,
    headers over it) keep their status, in JSON-RPC's shape with id null."""
    size = MAX_REQUEST_BODY_BYTES + 1
    status, body = _head_only(
        shared_mesh.edge,
        f"POST /demo/jsonrpc HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {size}\r\nExpect: 100-continue\r\n\r\n".encode(),
    )
    assert status == 413
    refused = json.loads(body)
    assert (refused["jsonrpc"], refused["id"], refused["error"]["code"]) == ("2.0", None, -32600)
    assert isinstance(refused["error"]["code"], int)  # as JSON-RPC clients check it
    assert str(size) in refused["error"]["message"]
    assert refused["error"]["data"][0]["reason"] == "PAYLOAD_TOO_LARGE"
    big = await http.post(
        "/demo/jsonrpc",
        json=_call("GetTask", {"id": "x"}),
        headers={"x-big": "a" * MAX_HEADER_BYTES},
    )
    assert big.status_code == 431
    assert big.json()["error"]["code"] == -32600 and big.json()["id"] is None
    assert isinstance(big.json()["error"]["code"], int)
