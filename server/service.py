"""SessionService: the public API. Thin: it validates, decides where a call
runs (here if this server owns the session, else forwarded to the owner), and
converts to and from the protos."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import grpc

from turnmesh.runtime import tracing
from turnmesh.runtime.errors import Unavailable
from turnmesh.runtime.handlers import ServicerContext as Context
from turnmesh.runtime.ids import new_id
from turnmesh.runtime.interceptors import MESH_KEY_METADATA, has_mesh_key
from turnmesh.server import validation
from turnmesh.server.core import SessionCore
from turnmesh.server.forwarding import (
    FORWARDED_METADATA,
    TOOK_CALL_METADATA,
    UNREACHABLE_METADATA,
    Forwarder,
    OwnerFailed,
)
from turnmesh.server.ownership import Local, Placement, SessionOwnership
from turnmesh.v1 import event_pb2
from turnmesh.v1 import session_service_pb2 as spb
from turnmesh.v1.session_service_pb2_grpc import SessionServiceServicer

if TYPE_CHECKING:
    from turnmesh.v1.session_service_pb2_grpc import SessionServiceAsyncStub as Stub

Response = TypeVar("Response")
Metadata = tuple[tuple[str, str], ...]
# What a forwarded call's error keeps of the owner's trailers.
PASSED_TRAILERS = frozenset({"grpc-status-details-bin", "retry-after"})


class SessionServicer(SessionServiceServicer):
    def __init__(
        self,
        core: SessionCore,
        ownership: SessionOwnership,
        forwarder: Forwarder,
        readiness: Callable[[], spb.LifecycleState.ValueType],
        *,
        router_connected: Callable[[], bool] = lambda: False,
        mesh_key: str | None = None,
        forward_credentials: bool = False,
    ) -> None:
        self._core = core
        self._ownership = ownership
        self._forwarder = forwarder
        self._state = readiness
        self._router_connected = router_connected
        self._mesh_key = mesh_key
        self._forward_credentials = forward_credentials
        self._started = time.monotonic()

    # Where a call runs ------------------------------------------------------

    def _forwarded(self, context: Context) -> bool:
        """A call another server forwarded here: handled here, whatever this
        server's routes say, so a stale route can never bounce it. Only a mesh
        member may say so (Envoy also strips the header from clients)."""
        metadata = context.invocation_metadata() or ()
        if not any(key == FORWARDED_METADATA for key, _ in metadata):
            return False
        return self._mesh_key is None or has_mesh_key(metadata, self._mesh_key.encode())

    async def _place(self, session_id: str, context: Context, *, assign: bool) -> Placement:
        if self._forwarded(context):
            # The forwarding server waits for these to know we took the call
            # (and that an error from here on is our answer).
            await context.send_initial_metadata(((TOOK_CALL_METADATA, self._ownership.member_id),))
            unreachable = next(
                (v for k, v in context.invocation_metadata() or () if k == UNREACHABLE_METADATA),
                None,
            )
            await self._ownership.accept_forwarded(
                session_id, unreachable if isinstance(unreachable, str) else None
            )
            return Local()
        return await self._ownership.place(session_id, assign=assign)

    def _forward_metadata(self, context: Context) -> Metadata:
        # The caller's key goes only to a peer proven in the mesh by mTLS, and
        # only when no mesh key (which opens the owner by itself) is set.
        passed = tuple(
            (k, v)
            for k, v in context.invocation_metadata() or ()
            if k == "authorization" and isinstance(v, str) and self._forward_credentials
        )
        mesh = ((MESH_KEY_METADATA, self._mesh_key),) if self._mesh_key else ()
        member = self._ownership.member_id
        return ((FORWARDED_METADATA, member), *mesh, *passed, *tracing.inject())

    async def _unary(
        self,
        session_id: str,
        context: Context,
        forward: Callable[[Stub, Metadata], grpc.aio.UnaryUnaryCall[Any, Response]],
        local: Callable[[], Awaitable[Response]],
        *,
        assign: bool = False,
    ) -> Response:
        """Run a unary call on the session's owner: here, or forwarded there."""
        placement = await self._place(session_id, context, assign=assign)
        if isinstance(placement, Local):
            return await local()
        metadata = self._forward_metadata(context)
        try:
            response: Response = await self._forwarder.unary(
                session_id, placement, lambda stub, hint: forward(stub, metadata + hint), local
            )
        except OwnerFailed as failed:
            await _pass_through(context, failed.error)
        return response

    async def _relay(
        self,
        session_id: str,
        context: Context,
        forward: Callable[[Stub, Metadata], grpc.aio.UnaryStreamCall[Any, event_pb2.Event]],
        local: Callable[[], Awaitable[AsyncIterator[event_pb2.Event]]],
    ) -> AsyncIterator[event_pb2.Event]:
        """The events of a streaming call: this server's own (iterated
        directly: no extra layer per event on the hottest path), or relayed
        from the owner."""
        placement = await self._place(session_id, context, assign=False)
        if isinstance(placement, Local):
            return await local()
        metadata = self._forward_metadata(context)
        return self._relayed(
            context,
            self._forwarder.stream(
                session_id, placement, lambda stub, hint: forward(stub, metadata + hint), local
            ),
        )

    async def _relayed(
        self, context: Context, events: AsyncIterator[event_pb2.Event]
    ) -> AsyncIterator[event_pb2.Event]:
        try:
            async for event in events:
                yield event
        except OwnerFailed as failed:
            await _pass_through(context, failed.error)

    # RPCs -------------------------------------------------------------------

    async def CreateSession(
        self, request: spb.CreateSessionRequest, context: Context
    ) -> spb.CreateSessionResponse:
        validation.validate_create_session(request)
        if not request.session_id:
            request.session_id = new_id()
        # Before an owner is assigned, so a refused create costs the router nothing.
        await self._core.require_agent(request.agent_name)
        await self._core.check_capacity()

        async def local() -> spb.CreateSessionResponse:
            session = await self._core.create_session(
                request.session_id, request.agent_name, request.metadata, list(request.messages)
            )
            return spb.CreateSessionResponse(session=session)

        return await self._unary(
            request.session_id,
            context,
            lambda stub, md: stub.CreateSession(request, metadata=md),
            local,
            assign=True,
        )

    async def GetSession(
        self, request: spb.GetSessionRequest, context: Context
    ) -> spb.GetSessionResponse:
        validation.validate_session_id(request.session_id)

        async def local() -> spb.GetSessionResponse:
            return spb.GetSessionResponse(session=await self._core.get_session(request.session_id))

        return await self._unary(
            request.session_id,
            context,
            lambda stub, md: stub.GetSession(request, metadata=md),
            local,
        )

    async def DeleteSession(
        self, request: spb.DeleteSessionRequest, context: Context
    ) -> spb.DeleteSessionResponse:
        validation.validate_session_id(request.session_id)

        async def local() -> spb.DeleteSessionResponse:
            return spb.DeleteSessionResponse(
                deleted=await self._core.delete_session(request.session_id)
            )

        return await self._unary(
            request.session_id,
            context,
            lambda stub, md: stub.DeleteSession(request, metadata=md),
            local,
        )

    async def GetHistory(
        self, request: spb.GetHistoryRequest, context: Context
    ) -> spb.GetHistoryResponse:
        validation.validate_session_id(request.session_id)

        async def local() -> spb.GetHistoryResponse:
            return spb.GetHistoryResponse(messages=await self._core.history(request.session_id))

        return await self._unary(
            request.session_id,
            context,
            lambda stub, md: stub.GetHistory(request, metadata=md),
            local,
        )

    async def Turn(
        self, request: spb.TurnRequest, context: Context
    ) -> AsyncIterator[event_pb2.Event]:
        validation.validate_turn(request)

        async def local() -> AsyncIterator[event_pb2.Event]:
            tlog = await self._core.start_turn(request)
            cancel = request.on_disconnect == spb.DISCONNECT_POLICY_CANCEL
            return self._core.follow(tlog, 0, cancel)

        events = await self._relay(
            request.session_id, context, lambda stub, md: stub.Turn(request, metadata=md), local
        )
        async for event in events:
            yield event

    async def CancelTurn(
        self, request: spb.CancelTurnRequest, context: Context
    ) -> spb.CancelTurnResponse:
        validation.validate_turn_ref(request.session_id, request.turn_id)

        async def local() -> spb.CancelTurnResponse:
            state = await self._core.cancel_turn(request.session_id, request.turn_id)
            return spb.CancelTurnResponse(state=state)

        return await self._unary(
            request.session_id,
            context,
            lambda stub, md: stub.CancelTurn(request, metadata=md),
            local,
        )

    async def SubscribeTurn(
        self, request: spb.SubscribeTurnRequest, context: Context
    ) -> AsyncIterator[event_pb2.Event]:
        validation.validate_subscribe(request)

        async def local() -> AsyncIterator[event_pb2.Event]:
            return await self._core.subscribe(
                request.session_id, request.turn_id, request.after_seq
            )

        events = await self._relay(
            request.session_id,
            context,
            lambda stub, md: stub.SubscribeTurn(request, metadata=md),
            local,
        )
        async for event in events:
            yield event

    async def GetHealth(
        self, request: spb.GetHealthRequest, context: Context
    ) -> spb.GetHealthResponse:
        health = await self._core.health()
        return spb.GetHealthResponse(
            status=self._state(),
            agent_name=health.default_agent,
            agent_ready=health.agent_ready,
            active_sessions=health.sessions,
            uptime_seconds=round(time.monotonic() - self._started, 3),
            server_id=self._ownership.member_id,
            running_turns=health.running_turns,
            sessions_available=health.sessions_available,
            router_connected=self._router_connected(),
        )

    async def GetReadiness(
        self, request: spb.GetReadinessRequest, context: Context
    ) -> spb.GetReadinessResponse:
        state = self._state()
        if state not in (spb.LIFECYCLE_STATE_READY, spb.LIFECYCLE_STATE_RUNNING):
            raise Unavailable(f"not ready: {spb.LifecycleState.Name(state)}")
        return spb.GetReadinessResponse(ready=True, status=state)


async def _pass_through(context: Context, error: grpc.aio.AioRpcError) -> NoReturn:
    """Give the caller the owner's status exactly, details included."""
    trailing = tuple((k, v) for k, v in (error.trailing_metadata() or ()) if k in PASSED_TRAILERS)
    await context.abort(error.code(), error.details() or "", trailing)
