"""The edge under hostile clients, through a real Envoy on a keyed mesh: the
key is checked on the headers (ext_authz) before any body is read, and slow
clients are cut by Envoy's timeouts (short ones here, so the tests wait
little; production's are in EdgeTimeouts)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from tests.support.mesh import Component, Mesh, eventually, until
from turnmesh.envoy import EdgeConfig, EdgeGuards
from turnmesh.envoy.process import RunningEnvoy, write_config
from turnmesh.envoy.process import start as start_envoy
from turnmesh.envoy.timeouts import EdgeTimeouts
from turnmesh.runtime import errors

KEY = "tm-edge-key-0123456789abcdef"
MESH_KEY = "tm-edge-mesh-key-fedcba9876543210"
PRINCIPAL = "acme"
# A second for headers and two for a whole request (the key check included:
# a healthy one takes milliseconds): what the slow-client tests wait for.
TIMEOUTS = EdgeTimeouts(request_headers=1.0, request=2.0)
# How long any one answer may take on a busy 2-core machine (a healthy run
# answers in milliseconds, or in a timeout above).
BOUND = 60.0
MIB = 1024 * 1024
# The heap of the edge whose uploads outgrow it (its own is about 12 MiB).
SMALL_HEAP_MB = 96


@dataclass
class Edge:
    mesh: Mesh
    server: Component
    envoy: RunningEnvoy  # checks keys (ext_authz)
    plain: RunningEnvoy  # the same server without the edge's check

    @property
    def address(self) -> str:
        return self.envoy.listener_address

    def access_log(self, name: str = "envoy") -> list[str]:
        return (self.mesh.workdir / f"{name}.log").read_text().splitlines()


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    mesh = Mesh(tmp_path_factory.mktemp("edge-hostile"), common_args=("--mesh-key", MESH_KEY))
    try:
        keys = mesh.workdir / "api-keys"
        keys.write_text(f"{PRINCIPAL}\t{KEY}\n")
        mesh.start_router()
        worker = mesh.spawn_worker("worker", "echo")
        server = mesh.spawn_server("server", "--api-keys-file", str(keys), "--agent", "echo")
        mesh.wait_ready(worker, server)
        envoy = mesh.start_envoy([server], timeouts=TIMEOUTS)
        plain = mesh.start_envoy([server], "envoy-plain", api_keys=False)
        yield Edge(mesh, server, envoy, plain)
    finally:
        mesh.stop()


@pytest.fixture
async def rest(edge: Edge) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(
        base_url=f"http://{edge.address}", headers=headers, timeout=BOUND
    ) as client:
        yield client


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


async def _until_closed(reader: asyncio.StreamReader) -> bytes:
    """What arrives until Envoy closes the connection: it resets one whose
    client is still sending (its unread bytes), after the answer."""
    answer = b""
    with contextlib.suppress(ConnectionResetError):
        while block := await reader.read(65536):
            answer += block
    return answer


async def _never_ending_upload(
    host: str, port: int, head: bytes, size: int = 120 * MIB
) -> tuple[bytes, int]:
    """Send head, then a chunked body of up to size bytes, until Envoy answers
    and closes the connection: what it answered, and the bytes sent by then
    (what the socket buffers took in, when the rest of the body is never read)."""
    chunk = b"%x\r\n" % MIB + b" " * MIB + b"\r\n"
    reader, writer = await asyncio.open_connection(host, port)
    sent = 0

    async def send() -> None:
        nonlocal sent
        writer.write(head)
        while sent < size:
            writer.write(chunk)
            await writer.drain()
            sent += MIB

    sender = asyncio.create_task(send())
    try:
        answer = await asyncio.wait_for(_until_closed(reader), BOUND)
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await sender
        writer.close()
    return answer, sent


def _request_head(path: str, edge: Edge, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {edge.address}", *extra, "", ""]
    return "\r\n".join(lines).encode()


async def _logged(edge: Edge, predicate: object, count: int, name: str = "envoy") -> list[str]:
    """The access log's lines for which predicate holds, once there are count
    (Envoy flushes its log every quarter second)."""
    await until(
        lambda: len([x for x in edge.access_log(name) if predicate(x)]) >= count,  # type: ignore[operator]
        timeout=BOUND,
        what=f"{count} access log lines",
    )
    return [x for x in edge.access_log(name) if predicate(x)]  # type: ignore[operator]


async def _session(rest: httpx.AsyncClient) -> str:
    response = await rest.post("/v1/sessions", json={"agentName": "echo"})
    assert response.status_code == 200, response.text
    return str(response.json()["session"]["sessionId"])


async def _turn_completes(rest: httpx.AsyncClient, sid: str) -> None:
    response = await rest.post(f"/v1/sessions/{sid}/turns", json={"message": "still here?"})
    assert response.status_code == 200, response.text
    events = [json.loads(x[6:]) for x in response.text.splitlines() if x.startswith("data: ")]
    assert events[-1]["type"] == "RUN_FINISHED", events[-1]


async def test_unauthenticated_uploads_are_refused_before_their_bodies(
    edge: Edge, rest: httpx.AsyncClient
) -> None:
    """Ten chunked uploads of 120 MB without a key, that never finish: each
    is answered 401 on its headers and its connection closed, Envoy's memory
    stays bounded, and a client with a key has its turn meanwhile."""
    sid = await _session(rest)
    other = await _session(rest)
    host, port = _host_port(edge.address)
    head = _request_head(
        f"/v1/sessions/{sid}/turns",
        edge,
        "Content-Type: application/json",
        "Transfer-Encoding: chunked",
    )
    baseline = peak = _rss(edge.envoy.proc.pid)

    async def upload() -> tuple[bytes, int]:
        answer, sent = await _never_ending_upload(host, port, head)
        return answer.partition(b"\r\n")[0], sent

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, _rss(edge.envoy.proc.pid))
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    try:
        uploads = asyncio.gather(*(upload() for _ in range(10)))
        await _turn_completes(rest, other)
        results = await uploads
    finally:
        sampler.cancel()
    assert [status for status, _ in results] == [b"HTTP/1.1 401 Unauthorized"] * 10
    # What the kernel's socket buffers and Envoy's 1 MiB connection buffer
    # took in, not the 120 MB each offered.
    assert max(sent for _, sent in results) < 32 * MIB, [sent for _, sent in results]
    assert peak - baseline <= 200 * MIB, (baseline, peak)
    refused = await _logged(edge, lambda x: f"/v1/sessions/{sid}/turns" in x, 10)
    # Refused by the key check: never sent to a server.
    assert all(" 401 " in x and "up=- flags=UAEX" in x for x in refused), refused


def _heap_in_use(envoy: RunningEnvoy) -> int:
    """What Envoy's heap monitor counts: tcmalloc's heap less its free pages."""
    memory = json.loads(envoy.admin("/memory"))
    free = int(memory["pageheap_unmapped"]) + int(memory["pageheap_free"])
    return int(memory["heap_size"]) - free


async def test_uploads_that_never_finish_are_cut_at_the_heap_limit(
    edge: Edge, rest: httpx.AsyncClient
) -> None:
    """Four chunked uploads with a key that never finish, each larger than a
    small edge's whole heap: Envoy resets only HTTP/2 streams under memory
    pressure, so each HTTP/1 upload is answered 429 and closed once the heap
    is full; the heap stays near its limit (it held all 480 MiB before) and a
    caller with the key is served again."""
    limit = SMALL_HEAP_MB * MIB
    envoy = await asyncio.to_thread(
        edge.mesh.start_envoy,
        [edge.server],
        "envoy-small-heap",
        guards=EdgeGuards(max_heap_mb=SMALL_HEAP_MB),
    )
    sid = await _session(rest)
    head = _request_head(
        f"/v1/sessions/{sid}/turns",
        edge,
        f"Authorization: Bearer {KEY}",
        "Content-Type: application/json",
        "Transfer-Encoding: chunked",
    )
    peak = 0

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, await asyncio.to_thread(_heap_in_use, envoy))
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    try:
        host, port = _host_port(envoy.listener_address)
        results = await asyncio.gather(
            *(_never_ending_upload(host, port, head, size=limit + 24 * MIB) for _ in range(4))
        )
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    statuses = [answer.partition(b"\r\n")[0] for answer, _ in results]
    assert statuses == [b"HTTP/1.1 429 Too Many Requests"] * 4, [a[:200] for a, _ in results]
    assert all(sent < limit + 24 * MIB for _, sent in results), [s for _, s in results]
    assert peak <= 2 * limit, peak
    shed = "overload.envoy.load_shed_points.http1_server_abort_dispatch.shed_load_count"
    assert int(envoy.admin(f"/stats?filter={shed}").split(":")[1]) >= 4
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(
        base_url=f"http://{envoy.listener_address}", headers=headers, timeout=BOUND
    ) as http:

        async def served() -> bool:
            return (await http.get(f"/v1/sessions/{sid}")).status_code == 200

        await eventually(served, timeout=BOUND, what="a call served once the uploads are cut")


async def test_unauthenticated_grpc_messages_are_refused_unread(edge: Edge) -> None:
    """Native gRPC skips the edge's check; the server refuses a call without
    a key before receiving its message, not after holding all 100 MiB."""
    message = b"\x0a\x80\x80\x80\x32" + b"a" * (100 * MIB)  # field 1: 100 MiB of id
    baseline = peak = _rss(edge.server.pid)
    options = [("grpc.max_send_message_length", 128 * MIB)]
    async with grpc.aio.insecure_channel(edge.address, options=options) as channel:
        call: Any = channel.unary_unary("/turnmesh.v1.SessionService/GetSession")
        calls = asyncio.gather(
            *(call(message, timeout=BOUND) for _ in range(3)), return_exceptions=True
        )
        while not calls.done():
            peak = max(peak, _rss(edge.server.pid))
            await asyncio.sleep(0.01)
        refusals = await calls
    for refusal in refusals:
        assert isinstance(refusal, grpc.aio.AioRpcError), refusal
        assert refusal.code() == grpc.StatusCode.UNAUTHENTICATED
        assert ("www-authenticate", 'Bearer realm="turnmesh"') in list(refusal.trailing_metadata())
    assert peak - baseline <= 64 * MIB, (baseline, peak)  # it held 730 MiB for these three


async def test_a_wrong_key_is_refused_at_the_edge_as_the_server_would(edge: Edge) -> None:
    """The edge's 401 is the server's own, byte for byte in JSON, on REST and
    on OpenAI's paths, and the server never sees the call."""
    calls = [
        ("/v1/sessions", {}),
        ("/v1/chat/completions", {"model": "echo", "messages": [{"role": "user", "content": "x"}]}),
    ]
    async with httpx.AsyncClient(timeout=BOUND) as http:
        answers = [
            await asyncio.gather(
                *(
                    http.post(f"http://{envoy.listener_address}{path}", json=body, headers=headers)
                    for envoy in (edge.envoy, edge.plain)
                )
            )
            for path, body in calls
            for headers in ({}, {"Authorization": "Bearer wrong-key"}, {"Authorization": KEY})
        ]
    for at_edge, at_server in answers:
        where = (at_edge.request.url.path, at_edge.request.headers.get("authorization"))
        assert at_edge.status_code == at_server.status_code == 401, at_edge.text
        # The same body, but for the request's own id (a problem's `instance`;
        # OpenAI's error shape has none).
        edge_body, server_body = at_edge.json(), at_server.json()
        if at_edge.headers["content-type"] == "application/problem+json":
            assert edge_body.pop("instance") == at_edge.headers["x-request-id"], where
            assert server_body.pop("instance") == at_server.headers["x-request-id"], where
        assert edge_body == server_body, where
        for name in ("content-type", "www-authenticate"):
            assert at_edge.headers[name] == at_server.headers[name], (name, where)
        assert "wrong-key" not in at_edge.text
    assert answers[-1][0].json()["error"]["type"] == errors.Unauthenticated.row().openai_type
    refused = await _logged(edge, lambda x: '"POST /v1/' in x and " 401 " in x, 6)
    assert all("up=- flags=UAEX" in x for x in refused), refused
    # Through the plain edge the server itself refused them.
    reached = await _logged(edge, lambda x: " 401 " in x, 6, "envoy-plain")
    assert all(f"up={edge.server.address}" in x for x in reached), reached


async def test_an_allowed_call_names_its_principal_in_the_access_log(
    edge: Edge, rest: httpx.AsyncClient
) -> None:
    response = await rest.get("/v1/sessions/nobody-has-this-one")
    assert response.status_code == 404  # the server answered: the edge let it through
    (line,) = await _logged(edge, lambda x: "nobody-has-this-one" in x, 1)
    assert f" principal={PRINCIPAL} rid=" in line, line
    assert KEY not in "\n".join(edge.access_log())
    # Health and readiness never depend on keys.
    async with httpx.AsyncClient(base_url=f"http://{edge.address}", timeout=BOUND) as anonymous:
        assert (await anonymous.get("/health")).status_code == 200
        assert (await anonymous.get("/ready")).status_code == 200


async def test_half_sent_headers_are_closed(edge: Edge) -> None:
    """Slowloris: headers that never end are cut after the headers timeout."""
    reader, writer = await asyncio.open_connection(*_host_port(edge.address))
    try:
        writer.write(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        await writer.drain()
        # EOF, long before the 60 s a silent connection would be kept.
        answer = await asyncio.wait_for(_until_closed(reader), BOUND / 2)
    finally:
        writer.close()
    assert b" 200 " not in answer


async def test_an_upload_that_trickles_is_cut(edge: Edge, rest: httpx.AsyncClient) -> None:
    """With a key, a body that never finishes arriving gets 408 once the
    request timeout passes; the server never sees it."""
    sid = await _session(rest)
    reader, writer = await asyncio.open_connection(*_host_port(edge.address))
    head = _request_head(
        f"/v1/sessions/{sid}/turns",
        edge,
        f"Authorization: Bearer {KEY}",
        "Content-Type: application/json",
        "Transfer-Encoding: chunked",
    )

    async def trickle() -> None:
        writer.write(head + b"1\r\n{\r\n")
        while True:  # a byte every 100 ms: never idle, never done
            await asyncio.sleep(0.1)
            writer.write(b"1\r\n \r\n")
            await writer.drain()

    sender = asyncio.create_task(trickle())
    began = time.monotonic()
    try:
        answer = await asyncio.wait_for(_until_closed(reader), BOUND)
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await sender
        writer.close()
    status, _, rest_of_answer = answer.partition(b"\r\n")
    assert status == b"HTTP/1.1 408 Request Timeout", answer[:300]
    assert b"application/problem+json" in rest_of_answer
    assert b"request-timeout" in rest_of_answer
    # Cut by the request timeout, not by anything slower.
    assert time.monotonic() - began >= TIMEOUTS.request
    (line,) = await _logged(edge, lambda x: f"/v1/sessions/{sid}/turns" in x, 1)
    assert " 408 " in line and "up=-" in line, line


async def test_a_check_that_fails_refuses_the_call(edge: Edge) -> None:
    """failure_mode_allow is false: when the check itself fails (here Envoy
    asks the router, which serves no Authorization), the call is refused with
    503, never let through to the upstream that answers it."""
    mesh = edge.mesh
    assert mesh.router is not None
    config = EdgeConfig(
        upstreams=[mesh.router.address], port=0, admin_port=0, playground=None, timeouts=TIMEOUTS
    )
    written = write_config(config, mesh.workdir / "envoy-failing.json")
    with (mesh.workdir / "envoy-failing.log").open("wb") as log:
        envoy = await asyncio.to_thread(start_envoy, written, mesh.workdir, stdout=log)
    mesh.envoys.append(envoy)  # stopped with the mesh
    healthy = f"session_servers::{mesh.router.address}::health_flags::healthy"
    await until(lambda: healthy in envoy.admin("/clusters"), timeout=BOUND, what="a healthy host")
    async with httpx.AsyncClient(base_url=f"http://{envoy.listener_address}") as http:
        for path in ("/v1/sessions/x", "/v1/responses/resp_x"):
            response = await http.get(path, headers={"Authorization": f"Bearer {KEY}"})
            assert response.status_code == 503, response.text
            assert response.headers["retry-after"] == "1"
            text = json.dumps(response.json())
            assert "could not be checked" in text
    lines = await _logged(edge, lambda x: '"GET /v1/' in x, 2, "envoy-failing")
    assert all(" 503 " in x and "up=- flags=UAEX" in x for x in lines), lines


@pytest.mark.parametrize(
    ("method", "path", "content_type"),
    [
        # Transcoded as REST (Envoy's gRPC is application/grpc or grpc+NAME
        # only), so it must be checked like REST, not waved through as gRPC.
        ("POST", "/v1/sessions", "application/grpc-web"),
        ("POST", "/v1/sessions", "application/grpcx"),
        # Routes that need no key read no body either.
        ("POST", "/health", "application/json"),
        ("GET", "/health", "application/json"),
        ("GET", "/", "text/plain"),
    ],
)
async def test_no_route_buffers_an_unauthenticated_body(
    edge: Edge, method: str, path: str, content_type: str
) -> None:
    """A never-ending body without a key is answered and its connection
    closed after at most what the socket buffers took in, whatever route its
    method, path and content type pick."""
    host, port = _host_port(edge.address)
    head = _request_head(path, edge, f"Content-Type: {content_type}", "Transfer-Encoding: chunked")
    head = head.replace(b"POST ", method.encode() + b" ", 1)
    answer, sent = await _never_ending_upload(host, port, head)
    status = answer.partition(b"\r\n")[0]
    assert status.startswith(b"HTTP/1.1 "), answer[:200]
    assert sent < 32 * MIB, (status, sent)  # answered, not read to the end


async def test_the_key_check_is_not_served_to_callers(edge: Edge) -> None:
    """The check's own method answers 404 at the edge: it would tell anyone
    which principal a key names, with no rate limit."""
    async with grpc.aio.insecure_channel(edge.address) as channel:
        check: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            "/envoy.service.auth.v3.Authorization/Check"
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await check(b"", timeout=BOUND)
    assert refused.value.code() in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.NOT_FOUND)
