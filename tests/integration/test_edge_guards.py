"""The edge guards on a real Envoy (envoy/guards.py), in front of the shared
mesh's servers: a per-client-IP request limit, a per-connection stream cap,
load shed as 429 (never 503), the Host allow-list and cross-origin bodies.

Clients take other loopback addresses (127.0.0.2, 127.0.0.3) to be other
client IPs; 127.0.0.1 is never limited per IP (the shared mesh's tests and the
benchmark)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import httpx
import pytest
from hpack import Decoder, Encoder
from hyperframe.frame import DataFrame, Frame, HeadersFrame, PingFrame, SettingsFrame

from tests.conftest import SharedMesh
from tests.support.mesh import until
from turnmesh.envoy import EdgeConfig, EdgeGuards
from turnmesh.envoy.process import RunningEnvoy, write_config
from turnmesh.envoy.process import start as start_envoy
from turnmesh.runtime.errors import PROBLEM_BASE

RATE = 1  # a second per client IP: a burst of 2, then 429
STREAMS = 2
CONNECTIONS = 10
ALLOWED = "api.example.com"
FOREIGN_ORIGIN = "http://evil.example"
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3


def _stop(envoy: RunningEnvoy) -> None:
    envoy.proc.terminate()
    try:
        envoy.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        envoy.proc.kill()
        envoy.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def guarded(shared_mesh: SharedMesh) -> Iterator[RunningEnvoy]:
    """A keyless edge: small per-IP and per-connection limits, one allowed host."""
    guards = EdgeGuards(rate_limit_per_ip=RATE, max_streams_per_connection=STREAMS,
                        allowed_hosts=(ALLOWED,))  # fmt: skip
    envoy = shared_mesh.mesh.start_envoy(shared_mesh.servers, "guarded-edge", guards=guards)
    yield envoy
    _stop(envoy)
    shared_mesh.mesh.envoys.remove(envoy)


@pytest.fixture(scope="module")
def keyed(shared_mesh: SharedMesh) -> Iterator[RunningEnvoy]:
    """An edge whose servers check keys, and a small connection cap."""
    mesh = shared_mesh.mesh
    config = EdgeConfig(upstreams=[s.address for s in shared_mesh.servers], port=0,
                        admin_port=0, api_keys=True, max_connections=CONNECTIONS)  # fmt: skip
    path = write_config(config, mesh.workdir / "keyed-edge.json")
    with (mesh.workdir / "keyed-edge.log").open("wb") as log:
        envoy = start_envoy(path, mesh.workdir, stdout=log)
    yield envoy
    _stop(envoy)


@asynccontextmanager
async def _client(
    envoy: RunningEnvoy, source: str = "127.0.0.1"
) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.AsyncHTTPTransport(local_address=source)
    base = f"http://{envoy.listener_address}"
    async with httpx.AsyncClient(transport=transport, base_url=base, timeout=60) as client:
        yield client


def _problem(response: httpx.Response, status: int, slug: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert (body["status"], body["type"]) == (status, PROBLEM_BASE + slug)


async def _until_throttled(
    client: httpx.AsyncClient, method: str, path: str, json: object = None
) -> httpx.Response:
    """Requests until one is throttled: the bucket refills one token a
    second, so a few more than the burst always reach an empty one."""
    for _ in range(5):
        response = await client.request(method, path, json=json)
        if response.status_code == 429:
            return response
    raise AssertionError(f"{path}: never throttled")


async def test_one_client_ip_gets_its_burst_then_429(guarded: RunningEnvoy) -> None:
    async with _client(guarded, "127.0.0.2") as client:
        for _ in range(2 * RATE):  # the bucket starts full
            assert (await client.get("/ready")).status_code == 200
        throttled = await _until_throttled(client, "GET", "/ready")
        _problem(throttled, 429, "resource-exhausted")
        assert throttled.headers["retry-after"] == "1"
        # Its own X-Forwarded-For does not give a client a fresh bucket.
        spoofed = [
            (await client.get("/ready", headers={"x-forwarded-for": f"198.51.100.{i}"})).status_code
            for i in range(10)
        ]
        assert 429 in spoofed
        openai = await _until_throttled(client, "POST", "/v1/chat/completions", {"model": "echo"})
        assert openai.status_code == 429
        assert openai.json()["error"]["type"] == "rate_limit_error"
    # Another address has a bucket of its own; loopback's is never empty.
    async with _client(guarded, "127.0.0.3") as other:
        assert (await other.get("/ready")).status_code == 200
    async with _client(guarded) as local:
        for _ in range(5 * RATE):
            assert (await local.get("/ready")).status_code == 200


def _read_frame(sock: socket.socket) -> Frame | None:
    """The next HTTP/2 frame, or None once the connection is closed."""

    def exactly(size: int) -> bytes | None:
        data = b""
        while len(data) < size:
            chunk = sock.recv(size - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    header = exactly(9)
    if header is None:
        return None
    frame, length = Frame.parse_frame_header(memoryview(header))
    body = exactly(length)
    if body is None:
        return None
    frame.parse_body(memoryview(body))
    return frame


def test_one_connection_holds_at_most_its_streams(guarded: RunningEnvoy) -> None:
    host, port = guarded.listener_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + SettingsFrame(0).serialize())
        while not isinstance(frame := _read_frame(sock), SettingsFrame) or "ACK" in frame.flags:
            assert frame is not None
        assert frame.settings[SETTINGS_MAX_CONCURRENT_STREAMS] == STREAMS
        ack = SettingsFrame(0)
        ack.flags.add("ACK")
        sock.sendall(ack.serialize())
        encoder = Encoder()

        def open_stream(stream_id: int) -> None:
            # A body announced and never sent: the stream stays open.
            headers = HeadersFrame(stream_id, flags=["END_HEADERS"])
            headers.data = encoder.encode(
                [(":method", "POST"), (":scheme", "http"), (":path", "/v1/sessions"),
                 (":authority", guarded.listener_address), ("content-type", "application/json"),
                 ("content-length", "2")]
            )  # fmt: skip
            sock.sendall(headers.serialize())

        for stream_id in range(1, 2 * STREAMS, 2):
            open_stream(stream_id)
        sock.sendall(PingFrame(0, opaque_data=b"streams!").serialize())
        while not isinstance(frame := _read_frame(sock), PingFrame):
            assert frame is not None, "the connection closed within its stream limit"
        open_stream(2 * STREAMS + 1)
        while (frame := _read_frame(sock)) is not None:
            pass  # the peer that ignored the limit loses the connection
    errors = guarded.admin("/stats?filter=^http.public.downstream_cx_protocol_error$")
    assert int(errors.split(":")[1]) >= 1


async def test_other_host_names_are_refused_with_421_health_is_not(
    guarded: RunningEnvoy, keyed: RunningEnvoy
) -> None:
    async with _client(guarded) as client:
        rebound = await client.post(
            "/v1/sessions", json={"sessionId": "edge-guards-rebound"},
            headers={"host": "evil.example"},
        )  # fmt: skip
        _problem(rebound, 421, "misdirected-request")
        assert (await client.get("/v1/sessions/edge-guards-rebound")).status_code == 404
        assert (await client.get("/", headers={"host": "evil.example"})).status_code == 421
        openai = await client.post(
            "/v1/chat/completions", json={}, headers={"host": "evil.example:8080"}
        )
        assert openai.status_code == 421
        assert openai.json()["error"]["type"] == "invalid_request_error"
        for host in (f"{ALLOWED}:8443", "localhost", "[::1]:1234", guarded.listener_address):
            assert (await client.get("/health", headers={"host": host})).status_code == 200
            created = await client.post("/v1/sessions", json={}, headers={"host": host})
            assert created.status_code == 200, (host, created.text)
        # Probes name the pod's address: health answers to any Host.
        for path in ("/ready", "/health", "/v1/chat/health"):
            assert (await client.get(path, headers={"host": "10.1.2.3:8080"})).status_code == 200
    # Where the servers check keys, any Host is answered unless hosts are named.
    async with _client(keyed) as client:
        assert (await client.get("/health", headers={"host": "evil.example"})).status_code == 200


async def test_a_cross_origin_post_without_json_is_refused_with_415(
    guarded: RunningEnvoy,
) -> None:
    body = b'{"sessionId": "edge-guards-csrf"}'
    async with _client(guarded) as client:
        for content_type in (
            "text/plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            None,
        ):
            headers = {"origin": FOREIGN_ORIGIN}
            if content_type:
                headers["content-type"] = content_type
            refused = await client.post("/v1/sessions", content=body, headers=headers)
            _problem(refused, 415, "unsupported-media-type")
        assert (await client.get("/v1/sessions/edge-guards-csrf")).status_code == 404
        openai = await client.post(
            "/v1/chat/completions", content=b"{}",
            headers={"origin": FOREIGN_ORIGIN, "content-type": "text/plain"},
        )  # fmt: skip
        assert openai.status_code == 415
        assert openai.json()["error"]["type"] == "invalid_request_error"
        # An origin CORS allows, no origin (curl -d), and the playground's own.
        own = f"http://{guarded.listener_address}"
        for headers in (
            {"origin": "http://localhost:3000", "content-type": "text/plain"},
            {"content-type": "application/x-www-form-urlencoded"},
            {"origin": own, "content-type": "application/json"},
        ):
            accepted = await client.post("/v1/sessions", content=b"{}", headers=headers)
            assert accepted.status_code == 200, (headers, accepted.text)
        page = await client.get("/", headers={"origin": own})
        assert page.status_code == 200 and "<html" in page.text.lower()


async def test_near_the_connection_cap_connections_close_after_each_response(
    keyed: RunningEnvoy,
) -> None:
    host, port = keyed.listener_address.rsplit(":", 1)
    idle = [socket.create_connection((host, int(port))) for _ in range(CONNECTIONS - 1)]
    try:
        await until(
            lambda: "disable_http_keepalive.active: 1" in keyed.admin("/stats?filter=overload"),
            what="keepalive disabled near the cap",
        )
        stats = keyed.admin("/stats?filter=reduce_timeouts.scale_percent")
        assert int(stats.split(":")[1]) > 0  # idle connections are cut sooner
        async with _client(keyed) as client:
            pressed = await client.get("/ready")
            assert pressed.status_code == 200
            assert pressed.headers["connection"] == "close"
    finally:
        for sock in idle:
            sock.close()
    await until(
        lambda: "disable_http_keepalive.active: 0" in keyed.admin("/stats?filter=overload"),
        what="keepalive back",
    )
    async with _client(keyed) as client:
        assert "connection" not in (await client.get("/ready")).headers


def _h2_request(
    envoy: RunningEnvoy, method: str, path: str, body: bytes = b""
) -> tuple[dict[str, str], bytes]:
    """One request over HTTP/2 (prior knowledge): the answer's headers and body."""
    host, port = envoy.listener_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + SettingsFrame(0).serialize())
        headers = HeadersFrame(1, flags=["END_HEADERS"] + ([] if body else ["END_STREAM"]))
        headers.data = Encoder().encode(
            [(":method", method), (":scheme", "http"), (":path", path),
             (":authority", envoy.listener_address), ("content-type", "application/json")]
        )  # fmt: skip
        sock.sendall(headers.serialize())
        if body:
            sock.sendall(DataFrame(1, data=body, flags=["END_STREAM"]).serialize())
        answer: dict[str, str] = {}
        data = b""
        while (frame := _read_frame(sock)) is not None:
            if frame.stream_id != 1:
                continue
            if isinstance(frame, HeadersFrame):
                answer = {k.decode(): v.decode() for k, v in Decoder().decode(frame.data, raw=True)}
            elif isinstance(frame, DataFrame):
                data += frame.data
            if "END_STREAM" in frame.flags:
                break
    return answer, data


async def test_overload_is_shed_as_429_never_503(shared_mesh: SharedMesh) -> None:
    """An Envoy whose heap limit is already behind it sheds every request.
    HTTP/1 requests are refused before their path is read (the load-shed
    point that cuts HTTP/1 uploads: problem+json on every path); HTTP/2
    callers get their surface's shape."""
    mesh = shared_mesh.mesh
    config = EdgeConfig(upstreams=[s.address for s in shared_mesh.servers], port=0,
                        admin_port=0, guards=EdgeGuards(max_heap_mb=1))  # fmt: skip
    path = write_config(config, mesh.workdir / "overloaded-edge.json")
    with (mesh.workdir / "overloaded-edge.log").open("wb") as log:
        envoy = start_envoy(path, mesh.workdir, stdout=log)
    try:
        await until(
            lambda: "stop_accepting_requests.active: 1" in envoy.admin("/stats?filter=overload"),
            what="overload",
        )
        async with _client(envoy) as client:
            for response in (
                await client.post("/v1/sessions", json={}),
                await client.get("/ready"),
            ):
                _problem(response, 429, "resource-exhausted")
                assert response.headers["retry-after"] == "1"
                assert response.headers["connection"] == "close"
        headers, body = await asyncio.to_thread(
            _h2_request, envoy, "POST", "/v1/chat/completions", b"{}"
        )
        assert headers[":status"] == "429"
        assert headers["retry-after"] == "1"
        assert json.loads(body)["error"]["type"] == "rate_limit_error"
    finally:
        _stop(envoy)
