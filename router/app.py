"""The router process: RouterService behind the shared gRPC runtime."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Annotated

import grpc
from pydantic import Field, model_validator

from turnmesh.router.service import RouterServicer
from turnmesh.router.state import Role, RouterState
from turnmesh.runtime import metrics
from turnmesh.runtime.config import Flag, MemberConfig
from turnmesh.runtime.interceptors import MeshKeyInterceptor
from turnmesh.runtime.logs import setup_logging
from turnmesh.runtime.metrics import serve_metrics
from turnmesh.runtime.serving import (
    MAX_ROUTER_REQUEST_BYTES,
    GrpcProcess,
    check_bind_host,
    wait_for_signal,
    write_ready_file,
)
from turnmesh.runtime.tls import Transport
from turnmesh.runtime.tracing import setup_tracing
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1 import router_service_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME: str = rpb.DESCRIPTOR.services_by_name["RouterService"].full_name

# Every method needs the key when one is set: Route assigns ownership (and
# its unreachable hint evicts servers), and ListMembers tells who is where.
PROTECTED_METHODS: frozenset[str] = frozenset(
    f"/{SERVICE_NAME}/{method}"
    for method in rpb.DESCRIPTOR.services_by_name["RouterService"].methods_by_name
)


class RouterConfig(MemberConfig):
    """Settings of the router process."""

    heartbeat_interval: Annotated[float, Flag("--heartbeat-interval")] = Field(
        default=1.0, gt=0, description="seconds between a member's heartbeats (told to members)"
    )
    heartbeat_timeout: Annotated[float, Flag("--heartbeat-timeout")] = Field(
        default=3.0, gt=0, description="seconds without a heartbeat before a member is dropped"
    )
    grace_seconds: float = Field(default=2.0, ge=0, description="how long SIGTERM waits")
    orphan_seconds: Annotated[float | None, Flag("--orphan-seconds")] = Field(
        default=None,
        gt=0,
        description=(
            "how long the sessions of a server that left or went silent wait for it to come"
            " back before they are forgotten (default: ten heartbeat timeouts)"
        ),
    )
    max_request_bytes: Annotated[int, Flag("--max-request-bytes")] = Field(
        default=MAX_ROUTER_REQUEST_BYTES, gt=0, description="largest request the router takes"
    )

    @model_validator(mode="after")
    def _timeout_exceeds_interval(self) -> RouterConfig:
        # Otherwise a healthy member is dropped between two heartbeats.
        if self.heartbeat_timeout <= self.heartbeat_interval:
            raise ValueError("heartbeat_timeout must exceed heartbeat_interval")
        return self


def _member_count(state: RouterState, role: Role) -> int:
    return len(state.list_members(role))


def build_process(config: RouterConfig, state: RouterState) -> GrpcProcess:
    """The router's gRPC process, not yet started (tests start it in-process)."""
    servicer = RouterServicer(state, heartbeat_interval=config.heartbeat_interval)

    def register(server: grpc.aio.Server) -> None:
        router_service_pb2_grpc.add_RouterServiceServicer_to_server(servicer, server)

    return GrpcProcess(
        host=config.host,
        port=config.port,
        service_names=[SERVICE_NAME],
        register=register,
        interceptors=[MeshKeyInterceptor(config.mesh_key, PROTECTED_METHODS)],
        transport=Transport.from_files(config.tls),
        max_receive_bytes=config.max_request_bytes,
    )


async def expire_members(state: RouterState, period: float) -> None:
    """Drop silent members even when no RPC arrives to trigger it."""
    while True:
        await asyncio.sleep(period)
        dropped = state.expire()  # RouterState logs each drop
        if dropped:
            log.debug("expiry sweep dropped %d member(s)", len(dropped))


async def serve(config: RouterConfig) -> None:
    setup_logging("router", config.log_level)
    stop_tracing = setup_tracing("router", config.otlp_endpoint)
    check_bind_host(config.host, bool(config.mesh_key or config.tls), config.allow_open)
    state = RouterState(config.heartbeat_timeout, orphan_ttl=config.orphan_seconds)
    process = build_process(config, state)
    await process.start()
    sweeper = asyncio.create_task(
        expire_members(state, config.heartbeat_interval / 2), name="router-expiry"
    )
    try:
        await process.set_serving(True)
        for role in Role:  # read at scrape time
            metrics.ROUTER_MEMBERS.labels(role.name.lower()).set_function(
                functools.partial(_member_count, state, role)
            )
        metrics_address = serve_metrics(config.host, config.metrics_port)
        write_ready_file(
            config.ready_file, address=process.address, metrics_address=metrics_address
        )
        log.info("router serving on %s", process.address)
        await wait_for_signal()
        log.info("router stopping")
    finally:
        sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeper
        await process.stop(config.grace_seconds)
        stop_tracing()
