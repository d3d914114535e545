"""Building, starting and stopping a turnmesh gRPC process.

Every process serves ``grpc.health.v1.Health`` and server reflection beside its
own services, maps errors at one boundary, and stops in the same order: health
goes NOT_SERVING first (so load balancers stop sending), then in-flight RPCs
get a grace period, then the server stops.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from turnmesh.agent._contract import MAX_CHECKPOINT_BYTES
from turnmesh.runtime.exposure import is_loopback
from turnmesh.runtime.interceptors import ErrorMappingInterceptor
from turnmesh.runtime.reclaim import ReclaimInterceptor, Trimmer
from turnmesh.runtime.tls import PLAINTEXT, Transport
from turnmesh.runtime.tracing import TracingInterceptor

log = logging.getLogger(__name__)

# The largest valid Turn: 100 MiB of files, plus a message of 10,000 characters,
# 64 KiB of metadata, ten file names and framing, well under 1 MiB more. Public
# ports receive no more than this, and clients send no more.
MAX_TURN_REQUEST_BYTES = 101 * 1024 * 1024
# A worker's Run carries a Turn's files, the history the worker lacks and
# the checkpoint an agent left with a pause.
MAX_HISTORY_BYTES = 64 * 1024 * 1024
MAX_RUN_REQUEST_BYTES = MAX_TURN_REQUEST_BYTES + MAX_HISTORY_BYTES + MAX_CHECKPOINT_BYTES
# The router's largest message: a server re-registering with every session it
# owns (100,000 ids of up to 128 characters).
MAX_ROUTER_REQUEST_BYTES = 32 * 1024 * 1024
# A call's metadata (gRPC counts names, values and 32 bytes an entry). gRPC's
# defaults refuse some calls from 8 KiB and all from 16 KiB, naming the largest
# headers in the error; this is one limit, with no random zone, above what
# the edge lets through (envoy/guards.py) plus what Envoy adds.
MAX_METADATA_BYTES = 64 * 1024


def server_options(max_receive_bytes: int) -> Sequence[tuple[str, int | str]]:
    return (
        ("grpc.max_receive_message_length", max_receive_bytes),
        ("grpc.max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.absolute_max_metadata_size", MAX_METADATA_BYTES),
        # Replies (a whole history) may be as large as anything a member sends.
        ("grpc.max_send_message_length", MAX_RUN_REQUEST_BYTES),
        ("grpc.so_reuseport", 0),
        ("grpc.keepalive_permit_without_calls", 1),
        # Members ping every 5 s (see _KEEPALIVE); allow it, data or not.
        ("grpc.http2.min_ping_interval_without_data_ms", 4000),
        ("grpc.http2.max_ping_strikes", 0),
    )


SERVER_OPTIONS = server_options(MAX_TURN_REQUEST_BYTES)

_KEEPALIVE: Sequence[tuple[str, int | str]] = (
    # A peer that froze or whose host vanished (no FIN, no RST) is found out
    # in seconds even while a stream waits for its first message: pings keep
    # going without data (gRPC stops after two by default).
    ("grpc.keepalive_time_ms", 5_000),
    ("grpc.keepalive_timeout_ms", 3_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    # Reconnect quickly to a member that came back (default backoff up to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
)

# Between mesh members: a server sends workers a Run, the largest message.
CHANNEL_OPTIONS: Sequence[tuple[str, int | str]] = (
    ("grpc.max_receive_message_length", MAX_RUN_REQUEST_BYTES),
    ("grpc.max_send_message_length", MAX_RUN_REQUEST_BYTES),
    *_KEEPALIVE,
)

# Public clients send at most a Turn and may receive a whole history.
CLIENT_CHANNEL_OPTIONS: Sequence[tuple[str, int | str]] = (
    ("grpc.max_receive_message_length", MAX_RUN_REQUEST_BYTES),
    ("grpc.max_send_message_length", MAX_TURN_REQUEST_BYTES),
    *_KEEPALIVE,
)


def insecure_channel(address: str) -> grpc.aio.Channel:
    """A plaintext channel with turnmesh's standard options."""
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)


def mesh_channel(address: str, transport: Transport = PLAINTEXT) -> grpc.aio.Channel:
    """A channel to another mesh member: mutual TLS when the mesh has it."""
    return transport.channel(address, CHANNEL_OPTIONS)


@dataclass
class GrpcProcess:
    """One gRPC server with health, reflection and error mapping."""

    host: str
    port: int
    service_names: list[str]
    register: Callable[[grpc.aio.Server], None]
    interceptors: list[grpc.aio.ServerInterceptor] = field(default_factory=list)
    health: health.aio.HealthServicer = field(default_factory=health.aio.HealthServicer)
    transport: Transport = PLAINTEXT
    # Methods that start a trace when the caller sent none (the public API).
    trace_roots: tuple[str, ...] = ()
    max_receive_bytes: int = MAX_TURN_REQUEST_BYTES
    _server: grpc.aio.Server | None = None
    bound_port: int = 0
    trimmer: Trimmer = field(default_factory=Trimmer)

    @property
    def address(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"{host}:{self.bound_port}"

    async def start(self) -> None:
        # Tracing outermost but for the trimmer (which only looks at a call's
        # end), so a refused call is in the trace with its status.
        interceptors = [
            ReclaimInterceptor(self.trimmer),
            TracingInterceptor(self.trace_roots),
            *self.interceptors,
            ErrorMappingInterceptor(),
        ]
        server = grpc.aio.server(
            interceptors=interceptors, options=server_options(self.max_receive_bytes)
        )
        self.register(server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            [*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
        )
        self.bound_port = self.transport.bind(server, f"{self.host}:{self.port}")
        if self.bound_port == 0:
            raise OSError(f"cannot bind {self.host}:{self.port}")
        # Not serving until the component says it is ready.
        await self.set_serving(False)
        await server.start()
        self._server = server

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *self.service_names):
            await self.health.set(name, status)

    async def stop(self, grace: float) -> None:
        if self._server is None:
            return
        await self.health.enter_graceful_shutdown()
        await self._server.stop(grace)
        self._server = None
        await self.trimmer.close()

    async def wait_for_termination(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()


def write_ready_file(path: str | None, **info: object) -> None:
    """Announce a started process to whoever launched it (tests, `turnmesh up`)."""
    if not path:
        return
    target = Path(path)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(json.dumps(info))
    os.replace(tmp, target)  # atomic: a reader never sees half a file


async def wait_for_signal(
    signals: Iterable[signal.Signals] = (signal.SIGINT, signal.SIGTERM),
) -> None:
    """Return when the process is asked to stop."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


MESH_SECURITY = "a mesh key or mutual TLS"


def check_bind_host(
    host: str, secured: bool, allow_open: bool, missing: str = MESH_SECURITY
) -> None:
    """Unsecured (``missing`` says what is not configured: by default the
    mesh key and mutual TLS), bind loopback only unless explicitly
    overridden."""
    if secured:
        return
    if not is_loopback(host):
        if not allow_open:
            raise SystemExit(
                f"refusing to bind {host} without {missing}: configure it (TURNMESH_MESH_KEY "
                "or --tls-* for the mesh, --api-keys or --api-keys-file for callers), or pass "
                "--allow-open to expose an unauthenticated mesh"
            )
    log.warning("%s not configured: the mesh is open to anyone who can reach %s", missing, host)
