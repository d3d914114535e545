"""Hostile input on A2A's HTTP+JSON and gRPC bindings, and the edge's own
replies on A2A's paths.

Every refusal is a 4xx in A2A's error shape (over HTTP+JSON Google's error
object with an ErrorInfo; over gRPC a status that is not INTERNAL/UNKNOWN),
never Python's text, and a refused message makes nothing (its client-chosen
context is never made). What Envoy answers by itself there (a refused key,
a body or headers too large, a rate limit, no route, no server) is in the
same shape, which the real a2a-sdk client reads into its error classes.
GetExtendedAgentCard is the spec's ExtendedAgentCardNotConfigured."""

from __future__ import annotations

import base64
import json
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest
from a2a.client import A2AClientError, ClientConfig, ClientFactory
from a2a.types import a2a_pb2, a2a_pb2_grpc
from a2a.utils.errors import ExtendedAgentCardNotConfiguredError, InvalidRequestError
from google.protobuf import struct_pb2
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.conftest import SharedMesh
from tests.support.a2a_clients import Agents, message, sent
from tests.support.mesh import Mesh
from turnmesh.envoy import EdgeGuards
from turnmesh.envoy.config import MAX_REQUEST_BODY_BYTES
from turnmesh.envoy.guards import MAX_HEADER_BYTES
from turnmesh.envoy.process import RunningEnvoy
from turnmesh.runtime import sanitize
from turnmesh.server.compat.a2a.messages import MAX_PARTS
from turnmesh.server.sessions.validation import MAX_MESSAGE_CHARS, MAX_METADATA_BYTES

pytestmark = pytest.mark.integration

A2A_DOMAIN = "a2a-protocol.org"
MESH_DOMAIN = "turnmesh.dev"
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
TEN_KIB = "x" * 10 * 1024


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _a2a_error(response: httpx.Response, status: int) -> dict[str, Any]:
    """A2A's HTTP+JSON error: the status, Google's error object, an ErrorInfo;
    no Python text."""
    assert response.status_code == status, (status, response.status_code, response.text[:500])
    assert response.headers["content-type"].startswith("application/json"), response.headers
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == status
    assert error["status"] and error["message"]
    assert [d for d in error["details"] if d["@type"] == ERROR_INFO], error
    assert not sanitize.is_internal(response.text), response.text[:500]
    return error


def _reason(error: dict[str, Any]) -> tuple[str, str]:
    (info,) = [d for d in error["details"] if d["@type"] == ERROR_INFO]
    return info["reason"], info["domain"]


async def _absent(rest: httpx.AsyncClient, context_id: str, **headers: str) -> None:
    found = await rest.get(f"/v1/sessions/{context_id}", headers=headers)
    assert found.status_code == 404, found.text


# -- hostile HTTP+JSON bodies ------------------------------------------------------


def _deep(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def _send(parts: str = '[{"text": "hi"}]', extra: str = "", message_extra: str = "") -> str:
    return (
        '{"message": {"messageId": "m-{ctx}", "role": "ROLE_USER", "contextId": "{ctx}",'
        f' "parts": {parts}{message_extra}}}{extra}}}'
    )


HOSTILE_BODIES = [
    # Nesting: in the message's metadata, in a data part, in the request's metadata.
    _send(message_extra=', "metadata": ' + _deep(80)),
    _send(message_extra=', "metadata": ' + _deep(3000)),
    _send('[{"text": "hi"}, {"data": ' + _deep(80) + "}]"),
    _send('[{"text": "hi"}, {"data": ' + "[" * 100_000 + "]" * 100_000 + "}]"),
    _send(extra=', "metadata": ' + _deep(3000)),
    # Sizes: metadata, parts, text.
    _send(message_extra=', "metadata": {"big": "' + "m" * (MAX_METADATA_BYTES + 1) + '"}'),
    _send("[" + ", ".join(['{"text": "p"}'] * (MAX_PARTS + 1)) + "]"),
    _send('[{"text": "' + "t" * (MAX_MESSAGE_CHARS + 1) + '"}]'),
    # Text that is not text.
    _send('[{"text": "\\ud800"}]'),
    _send('[{"text": "ok \\udfff tail"}]'),
    # Wrong types.
    _send('"parts"'),
    _send('[{"text": ["a"]}]'),
    _send('[{"text": "hi"}]', extra=', "configuration": {"historyLength": "all"}'),
    _send('[{"text": "hi"}]', message_extra=', "role": "ROLE_AGENT"'),
    '{"message": 5}',
    "[]",
    "null",
    # Ids of 10 KiB, and ids that climb out of their place.
    _send().replace('"m-{ctx}"', f'"{TEN_KIB}"'),
    _send(message_extra=f', "taskId": "{TEN_KIB}"'),
    _send(message_extra=', "taskId": "../../etc/passwd"'),
    _send(message_extra=f', "taskId": "01J0000000000000000000000.{_b64("acme/secret")}"'),
    _send(message_extra=f', "taskId": "x.{_b64("../../../etc/passwd")}"'),
    _send('[{"text": "hi"}, {"file": "x"}, {}]'),
]


@pytest.mark.parametrize("body", HOSTILE_BODIES, ids=range(len(HOSTILE_BODIES)))
async def test_hostile_http_json_bodies_get_an_a2a_4xx(
    shared_mesh: SharedMesh, rest: httpx.AsyncClient, body: str
) -> None:
    context_id = f"hostile-{uuid.uuid4()}"
    response = await rest.post(
        "/demo/message:send",
        content=body.replace("{ctx}", context_id).encode(),
        headers={"content-type": "application/json"},
    )
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
    _a2a_error(response, response.status_code)
    assert TEN_KIB not in response.text  # a long id is never echoed back
    await _absent(rest, context_id)


async def test_bytes_that_are_not_utf8_or_json(rest: httpx.AsyncClient) -> None:
    for body in (b"\xff\xfe{}", b'{"message": {"parts": [{"text": "\xc3\x28"}]}}', b"{not json"):
        response = await rest.post(
            "/demo/message:send", content=body, headers={"content-type": "application/json"}
        )
        error = _a2a_error(response, 400)
        assert _reason(error) == ("INVALID_REQUEST", A2A_DOMAIN)


async def test_unknown_fields_are_ignored(rest: httpx.AsyncClient) -> None:
    """As proto3 JSON readers do (A2A adds fields between versions): a
    message with fields this version does not know is served."""
    body = _send(extra=', "future": {"x": 1}', message_extra=', "alsoFuture": [1]')
    context_id = f"future-{uuid.uuid4()}"
    response = await rest.post(
        "/echo/message:send",
        content=body.replace("{ctx}", context_id).encode(),
        headers={"content-type": "application/a2a+json"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["task"]["status"]["state"] == "TASK_STATE_COMPLETED"


HOSTILE_READS = [
    ("GET", f"/demo/tasks/{TEN_KIB}", 404, "TASK_NOT_FOUND"),
    ("GET", "/demo/tasks/..%2F..%2Fetc%2Fpasswd", 404, "TASK_NOT_FOUND"),
    ("GET", f"/demo/tasks/x.{_b64('../../etc/passwd')}", 404, "TASK_NOT_FOUND"),
    # The scoped form of another principal's session: no public id has "/".
    ("GET", f"/demo/tasks/01J0000000000000000000000.{_b64('acme/s1')}", 404, "TASK_NOT_FOUND"),
    ("POST", f"/demo/tasks/x.{_b64('acme/s1')}:cancel", 404, "TASK_NOT_FOUND"),
    ("GET", "/demo/tasks/%00", 404, "TASK_NOT_FOUND"),
    ("GET", f"/demo/tasks/x?historyLength={2**40}", 400, "INVALID_PARAMS"),
    ("GET", "/demo/tasks/x?historyLength=-1", 404, "TASK_NOT_FOUND"),
    # Wrong methods: no A2A method is there.
    ("DELETE", "/demo/message:send", 404, "METHOD_NOT_FOUND"),
    ("GET", "/demo/message:stream", 404, "METHOD_NOT_FOUND"),
    ("PUT", "/demo/tasks/x", 404, "METHOD_NOT_FOUND"),
    ("PATCH", "/demo/tasks", 404, "METHOD_NOT_FOUND"),
    ("GET", "/demo/tasks/x:frobnicate", 404, "TASK_NOT_FOUND"),  # the id is "x:frobnicate"
    ("POST", "/demo/extendedAgentCard", 404, "METHOD_NOT_FOUND"),
]


@pytest.mark.parametrize(("method", "path", "status", "reason"), HOSTILE_READS)
async def test_hostile_paths_and_methods(
    rest: httpx.AsyncClient, method: str, path: str, status: int, reason: str
) -> None:
    response = await rest.request(method, path)
    error = _a2a_error(response, status)
    assert _reason(error)[0] == reason
    assert TEN_KIB not in response.text


async def test_a_long_tenant_is_refused_without_an_echo(rest: httpx.AsyncClient) -> None:
    context_id = f"hostile-{uuid.uuid4()}"
    body = _send().replace("{ctx}", context_id)
    response = await rest.post(
        f"/{TEN_KIB}/message:send", content=body, headers={"content-type": "application/json"}
    )
    assert 400 <= response.status_code < 500, response.text[:300]
    _a2a_error(response, response.status_code)
    assert TEN_KIB not in response.text
    await _absent(rest, context_id)


# -- hostile gRPC ------------------------------------------------------------------

BAD_CODES = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
hostile_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "../../etc/passwd",
            "..%2F..",
            "a/b",
            "%00",
            "\u202e",
            "🙂" * 50,
            TEN_KIB,
            "",
            f"x.{_b64('acme/s1')}",
            f"x.{_b64('../x')}",
            "demo",
        ]
    ),
)


def _grpc_case(name: str) -> a2a_pb2.SendMessageRequest:
    request = message("hi", f"grpc-hostile-{uuid.uuid4()}")
    request.tenant = "echo"
    sent_message = request.message
    if name == "long message id":
        sent_message.message_id = TEN_KIB
    elif name == "long context id":
        sent_message.context_id = TEN_KIB
    elif name == "long task id":
        sent_message.task_id = TEN_KIB
    elif name == "task of a scoped session":
        sent_message.task_id = f"01J0000000000000000000000.{_b64('acme/s1')}"
    elif name == "climbing context id":
        sent_message.context_id = "../../etc/passwd"
    elif name == "huge metadata":
        sent_message.metadata.update({"big": "m" * (MAX_METADATA_BYTES + 1)})
    elif name == "huge request metadata":
        request.metadata.update({"big": "m" * (MAX_METADATA_BYTES + 1)})
    elif name == "many parts":
        for _ in range(MAX_PARTS):
            sent_message.parts.add(text="p")
    elif name == "huge text":
        sent_message.parts[0].text = "t" * (MAX_MESSAGE_CHARS + 1)
    elif name == "an agent's role":
        sent_message.role = a2a_pb2.ROLE_AGENT
    elif name == "an unknown role":
        sent_message.role = 77  # type: ignore[assignment]  # any int, on purpose
    elif name == "an empty part":
        sent_message.parts.add()
    elif name == "long tenant":
        request.tenant = TEN_KIB
    elif name == "climbing tenant":
        request.tenant = "../echo"
    return request


GRPC_CASES = [
    "long message id",
    "long context id",
    "long task id",
    "task of a scoped session",
    "climbing context id",
    "huge metadata",
    "huge request metadata",
    "many parts",
    "huge text",
    "an agent's role",
    "an unknown role",
    "an empty part",
    "long tenant",
    "climbing tenant",
]


@pytest.mark.parametrize("name", GRPC_CASES)
async def test_hostile_grpc_messages_are_refused(shared_mesh: SharedMesh, name: str) -> None:
    """Natively over gRPC through the edge: a 4xx-kind status with an
    ErrorInfo, no Python text, no long id echoed, and nothing made."""
    request = _grpc_case(name)
    async with grpc.aio.insecure_channel(shared_mesh.edge) as channel:
        stub = a2a_pb2_grpc.A2AServiceStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.SendMessage(request, timeout=60)
    error = refused.value
    assert error.code() in (
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
    ), (error.code(), error.details())
    details = str(error.details())
    assert not sanitize.is_internal(details) and TEN_KIB not in details
    trailers: Any = error.trailing_metadata()
    assert b"google.rpc.ErrorInfo" in dict(trailers)["grpc-status-details-bin"]
    assert rest_get_status(shared_mesh, f"/v1/sessions/{request.message.context_id}") in (
        400,
        404,
    )


def _nested_struct(depth: int) -> bytes:
    """A Struct nested past protobuf's decoding limit, as bytes (the Python
    library refuses to build one that deep): {"a": {"a": ... "bottom"}}."""
    value = struct_pb2.Value(string_value="bottom").SerializeToString()
    for _ in range(depth):
        # Struct.fields (1) { key (1) "a", value (2) Value }
        entry = b"\x0a\x01a" + b"\x12" + _varint(len(value)) + value
        struct = b"\x0a" + _varint(len(entry)) + entry
        value = b"\x2a" + _varint(len(struct)) + struct  # Value.struct_value (5)
    return struct


def _varint(n: int) -> bytes:
    out = b""
    while True:
        low, n = n & 0x7F, n >> 7
        out += bytes([low | (0x80 if n else 0)])
        if not n:
            return out


def test_grpc_methods_survive_hostile_fields(shared_mesh: SharedMesh) -> None:
    """Every A2A method, natively through the edge, with hostile strings in
    every id and the tenant; nothing answers INTERNAL or UNKNOWN or Python's
    text, and no context a refused message named is made."""
    channel = grpc.insecure_channel(shared_mesh.edge)
    stub = a2a_pb2_grpc.A2AServiceStub(channel)  # type: ignore[no-untyped-call]
    refused: list[str] = []  # fresh contexts of refused messages

    def send(t: str, n: int) -> object:
        fresh = f"fz-{uuid.uuid4()}"
        request = message(t or "hi", fresh if n % 2 else t)
        request.tenant = t if n % 3 == 0 else "echo"
        request.message.message_id = t or "m"
        request.message.task_id = t if n % 5 == 0 else ""
        request.configuration.return_immediately = True
        if n % 7 == 0:
            request.message.parts.add(raw=t.encode(), media_type=t, filename=t)
        try:
            return stub.SendMessage(request, timeout=30)
        except grpc.RpcError:
            if n % 2:
                refused.append(fresh)
            raise

    calls: dict[str, Callable[[str, int], object]] = {
        "SendMessage": send,
        "GetTask": lambda t, n: stub.GetTask(
            a2a_pb2.GetTaskRequest(id=t, tenant=t, history_length=n), timeout=30
        ),
        "CancelTask": lambda t, n: stub.CancelTask(
            a2a_pb2.CancelTaskRequest(id=t, tenant=t), timeout=30
        ),
        "SubscribeToTask": lambda t, n: list(
            stub.SubscribeToTask(a2a_pb2.SubscribeToTaskRequest(id=t, tenant=t), timeout=30)
        ),
        "ListTasks": lambda t, n: stub.ListTasks(
            a2a_pb2.ListTasksRequest(context_id=t, page_token=t, page_size=n), timeout=30
        ),
        "GetExtendedAgentCard": lambda t, n: stub.GetExtendedAgentCard(
            a2a_pb2.GetExtendedAgentCardRequest(tenant=t), timeout=30
        ),
        "GetTaskPushNotificationConfig": lambda t, n: stub.GetTaskPushNotificationConfig(
            a2a_pb2.GetTaskPushNotificationConfigRequest(task_id=t, id=t), timeout=30
        ),
    }

    @FUZZ
    @given(
        name=st.sampled_from(sorted(calls)),
        text=hostile_text,
        number=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    )
    # A message to a fresh context under an agent no one has: always refused,
    # so the refusals are reached whatever the random examples are.
    @example(name="SendMessage", text="no such agent\x00", number=3)
    def hit(name: str, text: str, number: int) -> None:
        error: Any = None
        try:
            calls[name](text, number)
        except grpc.RpcError as exc:
            error = exc
        if error is not None:
            assert error.code() not in BAD_CODES, (name, text[:80], number, error.details())
            assert not sanitize.is_internal(error.details() or ""), error.details()

    try:
        hit()
        # Bytes no A2A message decodes from: nesting past the limit, garbage.
        raw: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            "/lf.a2a.v1.A2AService/SendMessage"
        )
        valid = message("hi", f"deep-{uuid.uuid4()}")
        valid.tenant = "echo"
        nested = _nested_struct(200)
        deep = valid.SerializeToString() + b"\x22" + _varint(len(nested)) + nested  # metadata (4)
        shallow = _nested_struct(20)
        ok = a2a_pb2.SendMessageRequest.FromString(
            valid.SerializeToString() + b"\x22" + _varint(len(shallow)) + shallow
        )
        assert "a" in ok.metadata.fields  # the bytes are a Struct, as meant
        for payload in (deep, b"\xff" * 64, b"\x0a\xff\xff\xff\xff\x0f"):
            with pytest.raises(grpc.RpcError) as undecodable:
                raw(payload, timeout=30)
            assert undecodable.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "cannot be decoded" in str(undecodable.value.details())
            # A2A's InvalidParams, as the SDK's gRPC client reads it.
            trailers: Any = undecodable.value.trailing_metadata()
            assert b"INVALID_PARAMS" in dict(trailers)["grpc-status-details-bin"]
        assert rest_get_status(shared_mesh, f"/v1/sessions/{valid.message.context_id}") == 404
    finally:
        channel.close()
    with httpx.Client(base_url=f"http://{shared_mesh.edge}", timeout=30) as rest:
        for component in shared_mesh.mesh.components:
            assert component.proc.poll() is None, component.name
        assert rest.get("/health").status_code == 200
        assert refused  # the fuzz reached refusals
        for context_id in refused:
            assert rest.get(f"/v1/sessions/{context_id}").status_code == 404, context_id


def rest_get_status(shared_mesh: SharedMesh, path: str) -> int:
    with httpx.Client(base_url=f"http://{shared_mesh.edge}", timeout=30) as rest:
        return rest.get(path).status_code


# -- GetExtendedAgentCard ----------------------------------------------------------


async def test_no_extended_card_is_configured(agents: Agents, rest: httpx.AsyncClient) -> None:
    """The card says there is none (capabilities.extendedAgentCard false), so
    the a2a-sdk client answers with the public card; a client that asks
    anyway gets A2A's ExtendedAgentCardNotConfigured."""
    client = await agents.client("demo", streaming=False)
    card = await client.get_extended_agent_card(a2a_pb2.GetExtendedAgentCardRequest())
    assert card.name == "demo" and not card.capabilities.extended_agent_card
    card.capabilities.extended_agent_card = True  # as if the card offered one
    async with httpx.AsyncClient(timeout=60) as http:
        config = ClientConfig(
            streaming=False,
            httpx_client=http,
            grpc_channel_factory=grpc.aio.insecure_channel,
            supported_protocol_bindings=[agents.binding],
        )
        asking = ClientFactory(config).create(card)
        with pytest.raises(ExtendedAgentCardNotConfiguredError):
            await asking.get_extended_agent_card(a2a_pb2.GetExtendedAgentCardRequest())
        await asking.close()
    error = _a2a_error(await rest.get("/demo/extendedAgentCard"), 400)
    assert (error["status"], _reason(error)) == (
        "FAILED_PRECONDITION",
        ("EXTENDED_AGENT_CARD_NOT_CONFIGURED", A2A_DOMAIN),
    )


# -- the edge's own replies --------------------------------------------------------

KEY = "key-of-hostile-tests"
KEYS = {"hostile": KEY, "other": "key-of-another-principal"}
MESH_KEY = "tm-a2a-hostile-mesh-key-0123456789"


@dataclass
class Keyed:
    mesh: Mesh
    edge: RunningEnvoy
    guarded: RunningEnvoy
    # An edge whose only server the test that needs it stops.
    doomed_edge: RunningEnvoy
    doomed: Any
    lone: Mesh


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keyed]:
    """A mesh with API keys, an edge in front of it, a second edge that
    allows one request a second per client IP, and a third in front of a
    server of its own."""
    workdir = tmp_path_factory.mktemp("a2a-keyed")
    keys = workdir / "api-keys"
    keys.write_text("".join(f"{who}\t{key}\n" for who, key in KEYS.items()))
    mesh = Mesh(workdir / "mesh", common_args=("--mesh-key", MESH_KEY))
    # The server a test kills has a mesh of its own: in the shared one the
    # router would place new sessions on it until its heartbeat lapsed, and
    # a later test's session would find its owner away.
    lone = Mesh(workdir / "lone", common_args=("--mesh-key", MESH_KEY))
    try:
        mesh.start_router()
        lone.start_router()
        worker = mesh.spawn_worker("worker-echo", "echo")
        server = mesh.spawn_server("server", "--api-keys-file", str(keys), "--agent", "echo")
        doomed = lone.spawn_server("doomed", "--api-keys-file", str(keys), "--agent", "echo")
        mesh.wait_ready(worker, server)
        # A server is ready once its default agent has a worker.
        lone.wait_ready(lone.spawn_worker("worker-echo", "echo"), doomed)
        edge = mesh.start_envoy([server])
        guarded = mesh.start_envoy([server], "guarded", guards=EdgeGuards(rate_limit_per_ip=1))
        doomed_edge = lone.start_envoy([doomed], "doomed")
        yield Keyed(mesh, edge, guarded, doomed_edge, doomed, lone)
    finally:
        lone.stop()
        mesh.stop()


def _head_only(address: str, head: str) -> tuple[int, bytes]:
    """Send a request head only and read the final response."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(head.encode())
        data = b""
        while True:
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                assert chunk, data
                data += chunk
            head_block, _, data = data.partition(b"\r\n\r\n")
            lines = head_block.decode().split("\r\n")
            status = int(lines[0].split()[1])
            if status >= 200:
                break
        headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:])}
        while len(data) < int(headers.get("content-length", "0")):
            data += conn.recv(65536)
    return status, data


async def test_the_edges_own_replies_are_in_a2a_shape(keyed: Keyed) -> None:
    key = {"authorization": f"Bearer {KEY}"}
    body = json.loads(_send().replace("{ctx}", f"edge-{uuid.uuid4()}"))
    edge = keyed.edge.listener_address
    async with httpx.AsyncClient(base_url=f"http://{edge}", timeout=60) as rest:
        # A refused key, on an agent's path and on the default agent's.
        for path, headers in (
            ("/echo/message:send", {}),
            ("/echo/message:send", {"authorization": "Bearer wrong"}),
            ("/message:send", {}),
        ):
            error = _a2a_error(await rest.post(path, json=body, headers=headers), 401)
            assert (error["status"], _reason(error)) == (
                "UNAUTHENTICATED",
                ("UNAUTHENTICATED", MESH_DOMAIN),
            )
        # Other paths keep problem+json.
        problem = await rest.post("/v1/sessions", json={})
        assert problem.headers["content-type"] == "application/problem+json"
        # Headers too large, a cross-origin body that is not JSON, no method there.
        over = {**key, "x-big": "a" * MAX_HEADER_BYTES}
        for response, status in (
            (await rest.get("/echo/tasks/x", headers=over), 431),
            (
                await rest.post(
                    "/echo/message:send",
                    content=b"hi",
                    headers={**key, "content-type": "text/plain", "origin": "https://x.example"},
                ),
                415,
            ),
        ):
            assert _reason(_a2a_error(response, status)) == ("INVALID_REQUEST", A2A_DOMAIN)
        missing = _a2a_error(await rest.delete("/echo/message:send", headers=key), 404)
        assert _reason(missing) == ("METHOD_NOT_FOUND", A2A_DOMAIN)
        # A body over the limit, refused from its length before it is sent.
        status, raw = _head_only(
            edge,
            f"POST /echo/message:send HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {MAX_REQUEST_BODY_BYTES + 1}\r\n"
            "Expect: 100-continue\r\n\r\n",
        )
        assert status == 413
        error = json.loads(raw)["error"]
        assert (error["code"], _reason(error)) == (413, ("INVALID_REQUEST", A2A_DOMAIN))

        # The real a2a-sdk client reads them: its own error class where A2A
        # has one, else its HTTP error with the status.
        config = ClientConfig(
            streaming=False, httpx_client=rest, supported_protocol_bindings=["HTTP+JSON"]
        )
        client = await ClientFactory(config).create_from_url(f"http://{edge}/echo")
        with pytest.raises(A2AClientError, match="401"):
            await sent(client, message("hi"))
        rest.headers.update(over)
        with pytest.raises(InvalidRequestError):
            await sent(client, message("hi"))
        await client.close()

    # A rate limit (429, Retry-After), read by the client as what it is.
    guarded = keyed.guarded.listener_address
    # From 127.0.0.2: loopback's own address is never limited.
    transport = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
    async with httpx.AsyncClient(
        transport=transport, base_url=f"http://{guarded}", timeout=60, headers=key
    ) as rest:
        for _ in range(20):  # the bucket holds 2 and refills 1 a second: never 20
            throttled = await rest.get("/echo/tasks/x")
            if throttled.status_code == 429:
                break
        error = _a2a_error(throttled, 429)
        assert _reason(error) == ("RESOURCE_EXHAUSTED", MESH_DOMAIN)
        assert throttled.headers["retry-after"]

    # No server behind the edge: 503.
    keyed.lone.kill(keyed.doomed)
    doomed = keyed.doomed_edge.listener_address
    async with httpx.AsyncClient(base_url=f"http://{doomed}", timeout=60, headers=key) as rest:
        error = _a2a_error(await rest.post("/echo/message:send", json=body), 503)
        assert (error["status"], _reason(error)) == ("UNAVAILABLE", ("UNAVAILABLE", MESH_DOMAIN))


@pytest.fixture
async def rest(shared_mesh: SharedMesh) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=f"http://{shared_mesh.edge}", timeout=60) as client:
        yield client


async def test_a_task_id_naming_another_principals_session(keyed: Keyed) -> None:
    """A task id carries its session's id as its caller names it; one that
    names another principal's session, by its id or by the mesh's scoped
    form (``principal/id``), is not found, exactly as an id never made."""
    edge = keyed.edge.listener_address
    context_id = f"mine-{uuid.uuid4()}"
    body = json.loads(_send().replace("{ctx}", context_id))
    mine, theirs = ({"authorization": f"Bearer {KEYS[who]}"} for who in ("hostile", "other"))
    async with httpx.AsyncClient(base_url=f"http://{edge}", timeout=60) as rest:
        sent_task = await rest.post("/echo/message:send", json=body, headers=mine)
        assert sent_task.status_code == 200, sent_task.text
        task = sent_task.json()["task"]
        turn_id = task["id"].partition(".")[0]
        assert (await rest.get(f"/echo/tasks/{task['id']}", headers=mine)).status_code == 200
        for task_id in (
            task["id"],
            f"{turn_id}.{_b64(f'hostile/{context_id}')}",
            f"{turn_id}.{_b64(f'other/../hostile/{context_id}')}",
        ):
            for verb, path in (("GET", ""), ("POST", ":cancel")):
                response = await rest.request(verb, f"/echo/tasks/{task_id}{path}", headers=theirs)
                assert _reason(_a2a_error(response, 404)) == ("TASK_NOT_FOUND", A2A_DOMAIN)
        # The scoped form is no id of the owner's either.
        scoped = f"{turn_id}.{_b64(f'hostile/{context_id}')}"
        refused = await rest.get(f"/echo/tasks/{scoped}", headers=mine)
        assert _reason(_a2a_error(refused, 404)) == ("TASK_NOT_FOUND", A2A_DOMAIN)
        # Nothing of the owner's changed: the task is still theirs, done.
        again = await rest.get(f"/echo/tasks/{task['id']}", headers=mine)
        assert again.json()["status"]["state"] == "TASK_STATE_COMPLETED"
