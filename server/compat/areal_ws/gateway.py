"""The AReaL gateway's WebSocket endpoint (``/ws``), served by a session
server on a listener of its own: gRPC servers cannot take a WebSocket, so
Envoy routes ``/ws`` upgrades here over HTTP/1.1.

A socket is one caller: its ``token`` query parameter is an API key (a
browser cannot set headers), checked with the server's keys as any call's
key is; a wrong or missing one, on a keyed mesh, closes the socket with 4001
"Invalid admin key" after the handshake, as the seed does. Its requests run
one after another (a bounded queue), as the seed runs them. Everything is
bounded: sockets per server (past it the handshake is 503), a frame's size
(past it the library closes with 1009), requests queued per socket, and a
silent peer (the library's ping, Envoy's stream idle timeout)."""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
import ssl
from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

# The path the edge's health check asks (envoy/ws_route.py writes it into
# the edge's config): answered 200 while this listener takes sockets.
from turnmesh.envoy.ws_route import HEALTH_PATH as HEALTH_PATH
from turnmesh.runtime import principals
from turnmesh.runtime.auth import ApiKeys
from turnmesh.runtime.errors import InvalidArgument
from turnmesh.runtime.principals import ANONYMOUS_PRINCIPAL, Principal
from turnmesh.runtime.ratelimit import RequestRates
from turnmesh.runtime.tls import TlsFiles
from turnmesh.server.compat._common import ON_DISCONNECT_HEADER, Mesh, on_disconnect
from turnmesh.server.compat.areal_ws import frames
from turnmesh.server.compat.areal_ws.runs import run
from turnmesh.v1 import session_service_pb2 as spb

log = logging.getLogger(__name__)

PATH = "/ws"
# The seed's close for a wrong admin key.
INVALID_KEY_CODE = 4001
INVALID_KEY_REASON = "Invalid admin key"
# A frame holds one message (at most 10,000 characters, 4 bytes each in
# UTF-8, escaped JSON up to 6) and a few short fields.
MAX_FRAME_BYTES = 64 * 1024
DEFAULT_MAX_CONNECTIONS = 1_000
# Requests waiting on one socket behind the one that runs.
MAX_QUEUED = 16
# The library's keepalive: a peer that answers no ping in this long is gone.
PING_SECONDS = 20.0


def _server_tls(files: TlsFiles) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(files.ca_file))
    context.load_cert_chain(str(files.cert_file), str(files.key_file))
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def health(ready: bool, open_sockets: int, max_connections: int) -> tuple[http.HTTPStatus, str]:
    """The answer to ``HEALTH_PATH``: 200 while the listener takes sockets."""
    if not ready:
        return http.HTTPStatus.SERVICE_UNAVAILABLE, "not ready\n"
    if open_sockets >= max_connections:
        return http.HTTPStatus.SERVICE_UNAVAILABLE, "full\n"
    return http.HTTPStatus.OK, "ok\n"


class Gateway:
    """The ``/ws`` listener of one session server."""

    def __init__(
        self,
        mesh: Mesh,
        keys: ApiKeys,
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        rates: RequestRates | None = None,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self._mesh = mesh
        self._keys = keys
        self._max_connections = max_connections
        self._rates = rates
        self._ready = ready
        self._open = 0
        self._server: Server | None = None

    async def start(self, host: str, port: int, tls: TlsFiles | None = None) -> int:
        """Listen (with the mesh's mutual TLS when it has it: only Envoy, with
        a mesh certificate, connects); the bound port."""
        self._server = await serve(
            self._handle,
            host,
            port,
            ssl=_server_tls(tls) if tls is not None else None,
            process_request=self._admit,
            compression=None,  # no inflating: a frame costs what it weighs
            max_size=MAX_FRAME_BYTES,
            max_queue=MAX_QUEUED,
            ping_interval=PING_SECONDS,
            ping_timeout=PING_SECONDS,
            server_header=None,
            logger=log,
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Close every socket (their running turns go on) and stop listening."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    @property
    def open_sockets(self) -> int:
        return self._open

    def _admit(self, connection: ServerConnection, request: Request) -> Response | None:
        """Only ``/ws``, and only while this server has room for a socket;
        ``HEALTH_PATH`` (the edge's health check) says whether it has and is
        ready (not starting, not draining)."""
        path = urlsplit(request.path).path
        if path == HEALTH_PATH:
            return connection.respond(*health(self._ready(), self._open, self._max_connections))
        if path != PATH:
            return connection.respond(http.HTTPStatus.NOT_FOUND, f"only {PATH} is served here\n")
        if _policy(request) is None:
            return connection.respond(
                http.HTTPStatus.BAD_REQUEST, f"{ON_DISCONNECT_HEADER} must be cancel or continue\n"
            )
        if self._open >= self._max_connections:
            return connection.respond(
                http.HTTPStatus.SERVICE_UNAVAILABLE,
                "this server has no room for another WebSocket; retry\n",
            )
        return None

    def _principal(self, token: str) -> Principal | None:
        if not self._keys.configured:
            return ANONYMOUS_PRINCIPAL
        return self._keys.match(token) if token else None

    async def _handle(self, connection: ServerConnection) -> None:
        self._open += 1
        try:
            await self._serve(connection)
        finally:
            self._open -= 1

    async def _serve(self, connection: ServerConnection) -> None:
        query = parse_qs(urlsplit(connection.request.path if connection.request else "").query)
        token = (query.get("token") or [""])[0]
        principal = self._principal(token)
        if principal is None:
            await connection.close(INVALID_KEY_CODE, INVALID_KEY_REASON)
            return
        # This socket's task (the library runs each in its own) acts for it.
        principals.set_current(principal)
        principals.set_caller_known(True)
        mesh = self._mesh.for_caller([("authorization", f"Bearer {token}")] if token else [])
        queue: asyncio.Queue[frames.AgentRequest] = asyncio.Queue(MAX_QUEUED)
        # Checked at the handshake already (an unknown policy was 400).
        policy = _policy(connection.request) if connection.request else None
        if policy is None:
            policy = spb.DISCONNECT_POLICY_CONTINUE
        runner = asyncio.create_task(_run_queued(connection, mesh, queue, policy))
        try:
            async for frame in connection:
                answer = await self._take(frame, principal, queue)
                if answer is not None:
                    await connection.send(answer)
        except ConnectionClosed:
            pass
        finally:
            # Requests not yet started are dropped; the running one's turn
            # goes on (its stream is left, with on_disconnect CONTINUE).
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await runner

    async def _take(
        self,
        frame: str | bytes,
        principal: Principal,
        queue: asyncio.Queue[frames.AgentRequest],
    ) -> str | None:
        """Queue the frame's request; else the ``res`` failed to send now."""
        if isinstance(frame, bytes):
            return frames.failed(frames.UNKNOWN_ID, "frames must be JSON text, not binary")
        try:
            request = frames.parse(frame)
        except frames.FrameError as exc:
            return frames.failed(exc.request_id, exc.reason)
        if self._rates is not None and await self._rates.admit(principal.name.encode()) > 0:
            return frames.failed(
                request.id,
                f"this caller may make {self._rates.rate:g} requests a second",
                code="RATE_LIMITED",
            )
        try:
            queue.put_nowait(request)
        except asyncio.QueueFull:
            return frames.failed(
                request.id,
                f"{MAX_QUEUED} requests wait on this socket already; send more as they finish",
                code="QUEUE_FULL",
            )
        return None


def _policy(request: Request) -> spb.DisconnectPolicy.ValueType | None:
    """What a closed socket does to its running turn: continue (the seed's
    way), or cancel with the other surfaces' header; None: not a policy."""
    header = request.headers.get(ON_DISCONNECT_HEADER)
    if header is None:
        return spb.DISCONNECT_POLICY_CONTINUE
    try:
        return on_disconnect(header)
    except InvalidArgument:
        return None


async def _run_queued(
    connection: ServerConnection,
    mesh: Mesh,
    queue: asyncio.Queue[frames.AgentRequest],
    policy: spb.DisconnectPolicy.ValueType,
) -> None:
    """The socket's requests, one after another."""
    while True:
        request = await queue.get()
        try:
            async for answer in run(mesh, request, policy):
                await connection.send(answer)
        except (ConnectionClosed, asyncio.CancelledError):
            raise
        except Exception:
            # A fault of ours: the request fails in words, the socket goes on.
            log.exception("a /ws request failed")
            await connection.send(
                frames.failed(request.id, "the mesh could not run this request", code="INTERNAL")
            )
