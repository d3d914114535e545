"""The session server process: configuration, start-up, readiness, drain."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import TYPE_CHECKING, cast

import grpc
from a2a.types import a2a_pb2_grpc
from grpc_health.v1 import health_pb2

from turnmesh import __version__
from turnmesh.runtime.auth import ApiKeys
from turnmesh.runtime.ext_authz import CHECK_METHOD, authorization_handler
from turnmesh.runtime.ids import new_member_id
from turnmesh.runtime.interceptors import ApiKeyInterceptor, ReceiptInterceptor
from turnmesh.runtime.membership import MemberInfo, Membership
from turnmesh.runtime.metrics import (
    EVENT_LOG_BYTES,
    REQUESTS_WAITING_TO_BE_READ,
    serve_metrics,
    watch_loop_lag,
)
from turnmesh.runtime.principals import ANONYMOUS
from turnmesh.runtime.receipts import ReceiptSlots
from turnmesh.runtime.serving import (
    MESH_SECURITY,
    GrpcProcess,
    check_bind_host,
    wait_for_signal,
    write_ready_file,
)
from turnmesh.runtime.tls import Transport
from turnmesh.runtime.tracing import setup_tracing
from turnmesh.server.compat import ChatUploadServicer, CompatServicer, Mesh, Models
from turnmesh.server.compat.a2a import SERVICE_NAME as A2A_SERVICE_NAME
from turnmesh.server.compat.a2a import A2AServicer, AgentCards, PushNotifications
from turnmesh.server.compat.areal_ws import Gateway
from turnmesh.server.config import ServerConfig
from turnmesh.server.event_stream import EventStreamServicer
from turnmesh.server.mesh import task_calls
from turnmesh.server.mesh.forwarding import Forwarder
from turnmesh.server.mesh.leases import Leases, LeaseStore
from turnmesh.server.mesh.limits import request_rates, turn_leases
from turnmesh.server.mesh.ownership import SessionOwnership
from turnmesh.server.mesh.routing import RouterClient
from turnmesh.server.service import SessionServicer
from turnmesh.server.sessions.core import SessionCore
from turnmesh.server.stores import open_store
from turnmesh.server.webhooks.sender import WebhookSender
from turnmesh.server.webhooks.settings import settings_from
from turnmesh.server.workers.pool import WorkerPool
from turnmesh.server.workers.readiness import AGENT_HEALTH_SERVICE
from turnmesh.v1 import chat_upload_pb2 as upb
from turnmesh.v1 import (
    chat_upload_pb2_grpc,
    compat_service_pb2_grpc,
    event_stream_pb2_grpc,
    session_service_pb2_grpc,
)
from turnmesh.v1 import compat_service_pb2 as cpb
from turnmesh.v1 import event_stream_pb2 as espb
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1 import session_service_pb2 as spb

if TYPE_CHECKING:
    from turnmesh.v1.session_service_pb2_grpc import SessionServiceAsyncStub

log = logging.getLogger(__name__)

SERVICE_NAME = spb.DESCRIPTOR.services_by_name["SessionService"].full_name
COMPAT_SERVICE_NAME = cpb.DESCRIPTOR.services_by_name["CompatService"].full_name
UPLOAD_SERVICE_NAME = upb.DESCRIPTOR.services_by_name["ChatUploadService"].full_name
EVENT_STREAM_SERVICE_NAME = espb.DESCRIPTOR.services_by_name["EventStreamService"].full_name


class SessionServer:
    """One session server: explicit lifecycle from INITIALIZING to STOPPED."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.state: spb.LifecycleState.ValueType = spb.LIFECYCLE_STATE_INITIALIZING
        self.member_id = new_member_id("server")
        self._process: GrpcProcess | None = None
        self._membership: Membership | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # What start() opened, closed in reverse by stop() (or by a failed start).
        self._opened = contextlib.AsyncExitStack()
        # AReaL's /ws listener, once bound (with --ws-port).
        self.ws_address: str | None = None

    def lifecycle(self) -> spb.LifecycleState.ValueType:
        if self.state in (spb.LIFECYCLE_STATE_READY, spb.LIFECYCLE_STATE_RUNNING):
            return (
                spb.LIFECYCLE_STATE_RUNNING
                if self.core.running_turns
                else spb.LIFECYCLE_STATE_READY
            )
        return self.state

    async def start(self) -> None:
        """Open the store, bind, and join the mesh; READY once registered and
        a worker is known. Whatever was opened is closed if a step fails."""
        if self._process is not None or self.state != spb.LIFECYCLE_STATE_INITIALIZING:
            raise RuntimeError("a SessionServer starts once")
        try:
            await self._start()
        except BaseException:
            await self._opened.aclose()
            raise

    async def _start(self) -> None:
        """The steps of ``start``, in order; each pushes onto ``_opened`` what
        ``stop`` closes."""
        transport = self._secured()
        await self._open_store()
        placeholder = await self._join_mesh(transport)
        self._build_core()
        servicer, compat = self._build_services()
        address = await self._serve(servicer, compat, transport)
        await self._serve_websockets()
        # The address is known only once bound; membership reports it.
        placeholder.address = address
        await self._go_live(address)
        log.info("session server %s listening on %s", self.member_id, address)

    def _secured(self) -> Transport:
        """The API keys, and a refusal of a bind that would open the mesh."""
        c = self.config
        self.api_keys = ApiKeys(c.api_keys, c.api_keys_file)
        # Open to anyone who can reach it unless both the public API and the
        # mesh have keys.
        meshed, keyed = bool(c.mesh_key or c.tls), self.api_keys.configured
        missing = [part for part, ok in ((MESH_SECURITY, meshed), ("API keys", keyed)) if not ok]
        check_bind_host(c.host, meshed and keyed, c.allow_open, " and ".join(missing))
        if self.api_keys.configured and not (c.mesh_key or c.tls):
            # Servers forward callers' calls to each other; without a mesh key
            # (or mTLS) they could only do so by handing a caller's key to
            # whatever registered with the router.
            raise SystemExit(
                "API keys need a mesh key (TURNMESH_MESH_KEY) or mutual TLS (--tls-*):"
                " servers forward calls to each other with it, never with a caller's key"
            )
        return Transport.from_files(c.tls)

    async def _open_store(self) -> None:
        """The store, and the webhook sender that delivers from its outbox."""
        c = self.config
        # Sessions from before principals belong to the one principal of a
        # mesh with one (its users keep them), else to the anonymous one.
        named = self.api_keys.principals()
        legacy = next(iter(named)) if len(named) == 1 else ANONYMOUS
        self.store = open_store(c.store, c.event_log_ttl_seconds, legacy)
        self._opened.push_async_callback(self.store.close)
        await self.store.open()
        try:
            webhook_settings = settings_from(
                c.webhook_allow,
                c.webhook_secret_file,
                c.webhook_max_attempts,
                c.webhook_retry_seconds,
                c.webhook_timeout_seconds,
            )
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
        if not webhook_settings.secret and self.api_keys.webhook_principals():
            log.warning(
                "the API keys file names webhooks, but without --webhook-secret-file none are sent"
            )
        # Delivers from the store's outbox; stopped before the store closes.
        # Each principal's destinations and secret: the keys file's, if it names them.
        self.webhooks = WebhookSender(webhook_settings, self.store.outbox(), trust=self.api_keys)
        self.webhooks.start()
        self._opened.push_async_callback(self.webhooks.stop)

    async def _join_mesh(self, transport: Transport) -> MemberInfo:
        """Leases, membership, the worker pool, the router and ownership (not
        started yet); returns the member info whose address is set once bound."""
        c = self.config
        # A shared store decides who owns a session, by lease.
        self.leases = (
            Leases(
                cast(LeaseStore, self.store),
                self.member_id,
                c.lease_seconds,
                # Ownership is built below; a lease lapses only once held, after start.
                on_lapse=lambda: self.ownership.after_lapse(),
            )
            if self.store.shared
            else None
        )
        placeholder = MemberInfo(
            self.member_id, rpb.MEMBER_ROLE_SERVER, "", shared_store=self.store.shared
        )
        self._membership = Membership(
            c.router_address,
            placeholder,
            mesh_key=c.mesh_key,
            inflight=lambda: self.core.running_turns,
            accepting=lambda: self.state != spb.LIFECYCLE_STATE_SHUTTING_DOWN,
            owned_sessions=lambda: self.ownership.verified(),
            on_rejoined=lambda: self.ownership.forget_routes(),
            transport=transport,
            report_page_size=c.report_page_size,
        )
        self.workers = WorkerPool(self._membership, on_listed=self._workers_listed)
        self.router = RouterClient(self._membership)
        self.ownership = SessionOwnership(
            self.member_id,
            self.router,
            holds=lambda session_id: self.core.holds(session_id),
            leases=self.leases,
        )
        if not self.store.shared:
            # A store no other server has (SQLite, locked to us): every
            # session in it is ours, and the router learns so when we register.
            for session_id in await self.store.idle_sessions(math.inf):
                self.ownership.claim(session_id)
        self._opened.push_async_callback(self.router.close)
        return placeholder

    def _build_core(self) -> None:
        """The sessions this server owns (a ServerConfig is their limits);
        with Redis, the turn quota is the whole mesh's."""
        c = self.config
        leases = turn_leases(self.store, self.member_id, c.lease_seconds, c.max_turns_per_principal)
        self.core = SessionCore(
            self.store, self.workers, c.default_agent, c, self.ownership, leases, self.webhooks
        )
        if leases is not None:
            leases.start()
            self._opened.push_async_callback(leases.stop)

    def _build_services(self) -> tuple[SessionServicer, CompatServicer]:
        """The public SessionService, and the other APIs' surfaces, which
        call it in-process."""
        c = self.config
        servicer = SessionServicer(
            self.core,
            self.ownership,
            Forwarder(self.ownership, self.router.stub),
            self.lifecycle,
            router_connected=lambda: self._membership is not None and self._membership.connected,
            mesh_key=c.mesh_key,
            # mTLS alone proves a peer is in the mesh, but only a caller's key
            # opens it; a mesh key opens it by itself.
            forward_credentials=bool(c.tls) and not c.mesh_key,
            other_servers=self._other_servers,
        )
        self._compat_mesh = Mesh()
        self._compat_mesh.connect(servicer)
        self._opened.push_async_callback(self._compat_mesh.close)
        # A2A pushes: configs in the store, sent at a turn's end by the outbox.
        self._push = PushNotifications(
            self.store, self.ownership.owns, self.webhooks, c.turn_record_ttl_seconds
        )
        self.core.records.on_end = self._push.turn_ended
        cards = AgentCards(
            self.workers.agents,
            c.default_agent,
            lambda: self.api_keys.configured,
            __version__,
            lambda: self._push.enabled,
        )
        # One A2A servicer for both its gRPC service and its JSON-RPC binding.
        self._a2a = A2AServicer(self._compat_mesh, self._push)
        return servicer, CompatServicer(
            self._compat_mesh, Models(self.workers.agents), cards, self._a2a
        )

    async def _serve(
        self, servicer: SessionServicer, compat: CompatServicer, transport: Transport
    ) -> str:
        """Bind and serve, behind the key and receipt interceptors; the
        address the mesh reaches this server at."""
        c = self.config

        def register(server: grpc.aio.Server) -> None:
            # The servicer takes owner_calls.Context (gRPC's, or an in-process
            # call); the generated stub types it as gRPC's merged contexts.
            session_service_pb2_grpc.add_SessionServiceServicer_to_server(
                cast("session_service_pb2_grpc.SessionServiceServicer", servicer), server
            )
            compat_service_pb2_grpc.add_CompatServiceServicer_to_server(compat, server)
            event_stream_pb2_grpc.add_EventStreamServiceServicer_to_server(
                EventStreamServicer(servicer), server
            )
            chat_upload_pb2_grpc.add_ChatUploadServiceServicer_to_server(
                ChatUploadServicer(self._compat_mesh), server
            )
            # a2a-sdk's generated stubs carry no types for this one function.
            a2a_pb2_grpc.add_A2AServiceServicer_to_server(  # type: ignore[no-untyped-call]
                self._a2a, server
            )
            # Envoy's key check on each REST request: the key is in the request.
            server.add_generic_rpc_handlers((authorization_handler(self.api_keys),))
            # A2A task records between servers (forwarded calls only).
            server.add_generic_rpc_handlers(
                (
                    task_calls.handler(
                        servicer.forwarded,
                        {
                            "Get": servicer.get_task_record,
                            "Put": servicer.put_task_record,
                            "List": servicer.list_task_records,
                        },
                    ),
                )
            )

        open_methods = frozenset(
            f"/{SERVICE_NAME}/{name}" for name in ("GetHealth", "GetReadiness")
        ) | {
            CHECK_METHOD,
            f"/{COMPAT_SERVICE_NAME}/GetChatHealth",
            # A2A clients read an agent's card before anything else, keyless.
            f"/{COMPAT_SERVICE_NAME}/GetAgentCard",
        }
        receipts = ReceiptSlots(c.max_receiving_per_principal)
        REQUESTS_WAITING_TO_BE_READ.set_function(lambda: receipts.waiting)
        self._process = GrpcProcess(
            host=c.host,
            port=c.port,
            service_names=[
                SERVICE_NAME,
                COMPAT_SERVICE_NAME,
                UPLOAD_SERVICE_NAME,
                EVENT_STREAM_SERVICE_NAME,
                A2A_SERVICE_NAME,
            ],
            trace_roots=(
                f"/{SERVICE_NAME}/",
                f"/{COMPAT_SERVICE_NAME}/",
                f"/{UPLOAD_SERVICE_NAME}/",
                f"/{EVENT_STREAM_SERVICE_NAME}/",
                f"/{A2A_SERVICE_NAME}/",
            ),
            register=register,
            interceptors=[
                ApiKeyInterceptor(
                    self.api_keys,
                    open_methods,
                    c.mesh_key,
                    rate_limit=request_rates(self.store, c.rate_limit, c.rate_burst),
                ),
                ReceiptInterceptor(
                    receipts,
                    open_methods,
                    c.mesh_key,
                    # Their JSON bodies are decoded after they are read.
                    decoded_later=frozenset(
                        f"/{COMPAT_SERVICE_NAME}/{name}"
                        for name in ("CreateChatCompletion", "CreateResponse", "RunAgent")
                    )
                    | {f"/{UPLOAD_SERVICE_NAME}/{n}" for n in ("UploadChat", "UploadChatStream")},
                ),
            ],
            transport=transport,
        )
        await self._process.start()
        await self._publish_agent_readiness()
        self._opened.push_async_callback(self._process.stop, 1.0)
        self.metrics_address = serve_metrics(c.host, c.metrics_port)
        if c.advertise_host:
            return f"{c.advertise_host}:{self._process.bound_port}"
        return self._process.address

    async def _serve_websockets(self) -> None:
        """AReaL's gateway protocol (/ws) on a listener of its own, if asked."""
        c = self.config
        if c.ws_port is None:
            return
        gateway = Gateway(
            self._compat_mesh,
            self.api_keys,
            max_connections=c.ws_max_connections,
            rates=request_rates(self.store, c.rate_limit, c.rate_burst),
            ready=lambda: self.state == spb.LIFECYCLE_STATE_READY,
        )
        port = await gateway.start(c.host, c.ws_port, c.tls)
        self._opened.push_async_callback(gateway.stop)
        self.ws_address = f"{c.advertise_host or c.host}:{port}"

    async def _go_live(self, address: str) -> None:
        """Hold the lease, join the router, find workers, and start the
        server's own loops."""
        assert self._membership is not None
        if self.leases is not None:
            # Held before the router can route anything here; given up (last
            # thing before the store closes) so our sessions move at once.
            await self.leases.start(address)
            self._opened.push_async_callback(self.leases.stop)
        self._membership.start()
        self._opened.push_async_callback(self._membership.stop)
        self.workers.start()
        self._opened.push_async_callback(self.workers.stop)
        self._tasks.append(asyncio.create_task(self._become_ready(), name="readiness"))
        self._tasks.append(asyncio.create_task(self._expire_loop(), name="expiry"))
        self._tasks.append(asyncio.create_task(self._event_log_sweep(), name="event-logs"))
        self._tasks.append(asyncio.create_task(self._turn_sweep(), name="turn-sweep"))
        self._tasks.append(asyncio.create_task(watch_loop_lag(), name="loop-lag"))

    async def _other_servers(self) -> list[SessionServiceAsyncStub]:
        return [self.router.stub(owner) for owner in await self.router.other_servers()]

    async def _become_ready(self) -> None:
        assert self._membership is not None and self._process is not None
        await self._membership.registered.wait()
        await self.workers.known.wait()
        readiness = self.core.readiness
        if self.workers.has_agent(readiness.agent):
            readiness.observe(True)  # ready with the server, not a list later
        if self.state == spb.LIFECYCLE_STATE_INITIALIZING:
            self.state = spb.LIFECYCLE_STATE_READY
            await self._process.set_serving(True)
            await self._publish_agent_readiness()
            write_ready_file(
                self.config.ready_file,
                address=self._process.address,
                member_id=self.member_id,
                port=self._process.bound_port,
                metrics_address=self.metrics_address,
                **({"ws_address": self.ws_address} if self.ws_address else {}),
            )
            log.info("ready")

    async def _workers_listed(self) -> None:
        readiness = self.core.readiness
        if readiness.observe(self.workers.has_agent(readiness.agent)):
            log.info(
                "agent %r %s", readiness.agent, "ready" if readiness.ready else "has no worker"
            )
            await self._publish_agent_readiness()

    async def _publish_agent_readiness(self) -> None:
        """AGENT_HEALTH_SERVICE: SERVING while this server takes turns and a
        turn of the default agent can run."""
        if self._process is None:
            return
        up = self.state == spb.LIFECYCLE_STATE_READY and self.core.readiness.ready
        serving = health_pb2.HealthCheckResponse.SERVING
        status = serving if up else health_pb2.HealthCheckResponse.NOT_SERVING
        await self._process.health.set(AGENT_HEALTH_SERVICE, status)

    async def _expire_loop(self) -> None:
        interval = min(30.0, max(0.05, self.config.session_ttl_seconds / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                for session_id in await self.core.expire_idle():
                    log.info("session %s expired after being idle", session_id)
            except Exception:
                log.warning("could not expire idle sessions; trying again", exc_info=True)

    async def _turn_sweep(self) -> None:
        """Once ready, then every --turn-sweep-seconds: turns lost with the
        server that ran them are recorded failed (and notified)."""
        assert self._membership is not None
        await self._membership.registered.wait()
        while True:
            try:
                settled = await self.core.recorded.settle_open()
                if settled:
                    log.info("settled %d turns lost with the server running them", settled)
            except Exception:
                log.warning("could not settle lost turns; trying again", exc_info=True)
            await asyncio.sleep(self.config.turn_sweep_seconds)

    async def _event_log_sweep(self) -> None:
        """Finished turns' events go when they expire, even in sessions no
        call touches again (the logs sweep themselves only when used)."""
        logs = self.core.logs
        interval = min(10.0, max(0.05, self.config.event_log_ttl_seconds / 10))
        while True:
            await asyncio.sleep(interval)
            logs.sweep()
            EVENT_LOG_BYTES.set(logs.finished_bytes)

    async def stop(self) -> None:
        """Drain: NOT_SERVING and no new sessions, finish running turns, leave.
        Idempotent, and safe before (or without) start()."""
        if self.state in (spb.LIFECYCLE_STATE_SHUTTING_DOWN, spb.LIFECYCLE_STATE_STOPPED):
            return
        serving = self._process is not None
        self.state = spb.LIFECYCLE_STATE_SHUTTING_DOWN
        if serving:
            assert self._process is not None
            log.info("shutting down: draining turns for up to %.0f s", self.config.grace_seconds)
            await self._process.set_serving(False)
            await self._publish_agent_readiness()
            await self.core.drain(self.config.grace_seconds)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # Workers and membership first (leave the mesh), then the server, the
        # channels and the store: the reverse of start().
        await self._opened.aclose()
        self.state = spb.LIFECYCLE_STATE_STOPPED
        log.info("stopped")


async def serve(config: ServerConfig) -> None:
    stop_tracing = setup_tracing("server", config.otlp_endpoint)
    server = SessionServer(config)
    await server.start()
    try:
        await wait_for_signal()
    finally:
        await server.stop()
        stop_tracing()  # flushes the last spans
