"""The worker process: load one agent, serve ``WorkerService``, join the mesh."""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Annotated

import grpc
from pydantic import Field

from turnmesh.agent import AgentLoadError, AgentRunnable, load_agent
from turnmesh.files import Sandbox
from turnmesh.files.fair import DEFAULT_QUEUE_BYTES, DEFAULT_QUEUE_FILES
from turnmesh.runtime import metrics
from turnmesh.runtime.config import Flag, MemberConfig
from turnmesh.runtime.ids import new_member_id
from turnmesh.runtime.interceptors import MeshKeyInterceptor
from turnmesh.runtime.logs import setup_logging
from turnmesh.runtime.membership import MemberInfo, Membership
from turnmesh.runtime.metrics import serve_metrics
from turnmesh.runtime.serving import (
    MAX_RUN_REQUEST_BYTES,
    GrpcProcess,
    check_bind_host,
    wait_for_signal,
    write_ready_file,
)
from turnmesh.runtime.tls import Transport
from turnmesh.runtime.tracing import setup_tracing
from turnmesh.v1 import router_service_pb2, worker_service_pb2, worker_service_pb2_grpc
from turnmesh.worker.extract_cache import DEFAULT_MAX_BYTES as TEXT_CACHE_BYTES
from turnmesh.worker.extract_cache import DEFAULT_MAX_ENTRIES, ExtractCache
from turnmesh.worker.history_cache import DEFAULT_MAX_BYTES
from turnmesh.worker.service import WorkerServicer

# Every method needs the mesh key when one is set (GetInfo tells who runs what).
_SERVICE = worker_service_pb2.DESCRIPTOR.services_by_name["WorkerService"]
PROTECTED_METHODS = frozenset(f"/{_SERVICE.full_name}/{name}" for name in _SERVICE.methods_by_name)

__all__ = ["WorkerConfig", "serve"]

log = logging.getLogger(__name__)

SERVICE_NAME = worker_service_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name


class WorkerConfig(MemberConfig):
    """Settings of one worker process."""

    router_address: str | None = Field(
        default=None, description="the router, host:port (None: stand-alone, no membership)"
    )
    agent: Annotated[str, Flag("--agent")] = Field(
        default="demo",
        description="a built-in agent (demo, echo, openai), package.module:Class, or an agent file",
    )
    advertise_host: Annotated[str | None, Flag("--advertise-host")] = Field(
        default=None, description="how other members reach this worker, if not `host`"
    )
    grace_seconds: Annotated[float, Flag("--grace-seconds")] = Field(
        default=10.0, ge=0, description="how long SIGTERM waits for running turns"
    )
    # Reading an attached file: at most this long and this much memory, in
    # its own process; this many files at once.
    file_timeout_seconds: Annotated[float, Flag("--file-timeout", env="file_timeout")] = Field(
        default=30.0, gt=0, description="seconds to read one attached file before it fails"
    )
    file_memory_mb: Annotated[int, Flag("--file-memory-mb")] = Field(
        default=2048, ge=256, description="memory one file's reader process may use"
    )
    file_concurrency: Annotated[int, Flag("--file-concurrency")] = Field(
        default=2, ge=1, le=64, description="attached files read at once (each in its own process)"
    )
    # Files waiting for a reader, slots shared fairly (files/fair.py): one
    # principal may hold half of this queue (at least 100 MB: half of it
    # still takes the largest file), one turn its own file limits.
    file_queue: Annotated[int, Flag("--file-queue")] = Field(
        default=DEFAULT_QUEUE_FILES, ge=1, description="attached files that may wait for a reader"
    )
    file_queue_mb: Annotated[int, Flag("--file-queue-mb")] = Field(
        default=DEFAULT_QUEUE_BYTES // (1024 * 1024),
        ge=100,
        description="MB of attached files that may wait for a reader",
    )
    history_cache_mb: Annotated[int, Flag("--history-cache-mb")] = Field(
        default=DEFAULT_MAX_BYTES // 2**20,
        ge=1,
        description=(
            "memory the histories of recent sessions may take (the least recent beyond it"
            " are dropped; the server then sends the whole history again)"
        ),
    )

    # Texts of files already read, per principal (worker/extract_cache.py).
    file_text_cache_entries: Annotated[int, Flag("--file-text-cache-entries")] = Field(
        default=DEFAULT_MAX_ENTRIES,
        ge=0,
        description="texts of attached files kept, so a file sent again is not read again",
    )
    file_text_cache_mb: Annotated[int, Flag("--file-text-cache-mb")] = Field(
        default=TEXT_CACHE_BYTES // 2**20,
        ge=0,
        description="memory the texts of attached files already read may take (0: none kept)",
    )


async def serve(config: WorkerConfig) -> None:
    """Run a worker until SIGINT or SIGTERM; refuse to start with an unusable agent."""
    setup_logging("worker", config.log_level)
    stop_tracing = setup_tracing("worker", config.otlp_endpoint)
    try:
        agent_name, agent = load_agent(config.agent)
    except AgentLoadError as exc:
        log.error("cannot start the worker: %s", exc)
        raise SystemExit(2) from exc

    member_id = new_member_id("worker")
    sandbox = Sandbox(
        timeout_seconds=config.file_timeout_seconds,
        memory_bytes=config.file_memory_mb * 1024 * 1024,
        concurrency=config.file_concurrency,
        queue_files=config.file_queue,
        queue_bytes=config.file_queue_mb * 1024 * 1024,
    )
    metrics.FILE_QUEUE_DEPTH.set_function(lambda: sandbox.scheduler.waiting)
    servicer = WorkerServicer(
        agent,
        agent_name=agent_name,
        worker_id=member_id,
        sandbox=sandbox,
        history_cache_bytes=config.history_cache_mb * 2**20,
        file_texts=ExtractCache(
            max_entries=config.file_text_cache_entries,
            max_bytes=config.file_text_cache_mb * 2**20,
        ),
    )

    def register(server: grpc.aio.Server) -> None:
        worker_service_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, server)

    transport = Transport.from_files(config.tls)
    process = GrpcProcess(
        host=config.host,
        port=config.port,
        service_names=[SERVICE_NAME],
        register=register,
        # With a key set, only mesh members (holding it) may run turns.
        interceptors=[MeshKeyInterceptor(config.mesh_key, PROTECTED_METHODS)],
        transport=transport,
        max_receive_bytes=MAX_RUN_REQUEST_BYTES,
    )
    membership: Membership | None = None
    try:
        check_bind_host(config.host, bool(config.mesh_key or config.tls), config.allow_open)
        await process.start()
        address = _advertised_address(config, process)
        await process.set_serving(True)
        if config.router_address:
            membership = Membership(
                config.router_address,
                MemberInfo(
                    member_id=member_id,
                    role=router_service_pb2.MEMBER_ROLE_WORKER,
                    address=address,
                    agent_name=agent_name,
                ),
                mesh_key=config.mesh_key,
                inflight=lambda: servicer.inflight,
                transport=transport,
            )
            membership.start()
        metrics_address = serve_metrics(config.host, config.metrics_port)
        log.info("worker %s serving agent %r on %s", member_id, agent_name, address)

        async def ready() -> None:
            # Ready once servers can find it (as a server is): a caller that
            # waits for the file and then sends a turn finds this worker.
            if membership is not None:
                await membership.registered.wait()
            write_ready_file(
                config.ready_file,
                address=address,
                member_id=member_id,
                agent=agent_name,
                metrics_address=metrics_address,
            )

        readiness = asyncio.create_task(ready(), name="readiness")
        await wait_for_signal()
        readiness.cancel()
        log.info("stopping: %d turn(s) in flight", servicer.inflight)
    finally:
        servicer.ready = False
        if membership is not None:
            await membership.stop()  # leave first, so no server picks us meanwhile
        # Health NOT_SERVING, new calls refused, then drain: the servers'
        # relays end once the turns have (they never end by themselves).
        stopping = asyncio.create_task(process.stop(config.grace_seconds))
        await servicer.close_relays_when_idle(config.grace_seconds)
        await stopping
        await _close_agent(agent)
        stop_tracing()  # flushes the last spans


def _advertised_address(config: WorkerConfig, process: GrpcProcess) -> str:
    if not config.advertise_host:
        return process.address
    host = config.advertise_host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6 literal
    return f"{host}:{process.bound_port}"


async def _close_agent(agent: AgentRunnable) -> None:
    close = getattr(agent, "close", None)
    if close is None:
        return
    try:
        result = close()
        if inspect.isawaitable(result):
            await result
    except Exception:
        log.exception("the agent's close() hook failed")
