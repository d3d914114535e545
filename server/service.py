"""SessionService: the public API. Thin: it validates, decides where a call
runs (here if this server owns the session, else forwarded to the owner), and
converts to and from the protos."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Literal, TypeVar

import grpc

from turnmesh.runtime import tracing
from turnmesh.runtime.errors import Unavailable
from turnmesh.runtime.ids import new_id
from turnmesh.runtime.interceptors import MESH_KEY_METADATA, has_mesh_key
from turnmesh.server import validation
from turnmesh.server.core import SessionCore
from turnmesh.server.routing import FORWARDED_METADATA, Owner, RouteTable
from turnmesh.v1 import event_pb2
from turnmesh.v1 import session_service_pb2 as spb
from turnmesh.v1.session_service_pb2_grpc import SessionServiceServicer, SessionServiceStub

log = logging.getLogger(__name__)

Response = TypeVar("Response")
Metadata = tuple[tuple[str, str], ...]
# What a forwarded call's error keeps of the owner's trailers.
PASSED_TRAILERS = frozenset({"grpc-status-details-bin", "retry-after"})


# How long a forwarding server waits for the owner's first answer before it
# asks the router whether the session moved, and for how long in all.
OWNER_ANSWER_SECONDS = 2.0
OWNER_SILENT_LIMIT_SECONDS = 60.0


def _forwarded(context: grpc.aio.ServicerContext) -> bool:
    return any(key == FORWARDED_METADATA for key, _ in context.invocation_metadata() or ())


class SessionServicer(SessionServiceServicer):
    def __init__(
        self,
        core: SessionCore,
        routes: RouteTable,
        member_id: str,
        readiness: Callable[[], spb.LifecycleState.ValueType],
        *,
        mesh_key: str | None = None,
    ) -> None:
        self._core = core
        self._routes = routes
        self._member_id = member_id
        self._state = readiness
        self._mesh_key = mesh_key
        self._started = time.monotonic()

    # Where a call runs ------------------------------------------------------

    async def _owner(
        self, session_id: str, context: grpc.aio.ServicerContext, *, assign: bool = False
    ) -> Owner | None:
        """None when this server handles the call; the owner otherwise."""
        metadata = context.invocation_metadata() or ()
        if _forwarded(context):
            # Only a mesh member may say "handle this here" (Envoy also strips
            # the header from clients).
            if self._mesh_key is None or has_mesh_key(metadata, self._mesh_key.encode()):
                return None
        if session_id in self._core.owned:
            return None
        try:
            owner = await self._routes.owner(session_id, assign=assign)
        except Unavailable:
            # Without the router, serve what we hold rather than fail.
            if await self._core.store.get(session_id) is not None:
                return None
            raise
        if owner is not None and owner.member_id == self._member_id:
            self._core.owned.add(session_id)
            return None
        return owner

    def _forward_metadata(self, context: grpc.aio.ServicerContext) -> Metadata:
        passed = tuple(
            (k, v)
            for k, v in context.invocation_metadata() or ()
            if k == "authorization" and isinstance(v, str)
        )
        mesh = ((MESH_KEY_METADATA, self._mesh_key),) if self._mesh_key else ()
        return ((FORWARDED_METADATA, self._member_id), *mesh, *passed, *tracing.inject())

    async def _unary(
        self,
        session_id: str,
        context: grpc.aio.ServicerContext,
        forward: Callable[[SessionServiceStub, Metadata], grpc.aio.UnaryUnaryCall],
        local: Callable[[], Awaitable[Response]],
        *,
        assign: bool = False,
    ) -> Response:
        """Run a unary call on the session's owner: here, or forwarded there.
        An unreachable owner is reported to the router and the call retried
        once on the new owner (which may be this server); a silent one is
        waited on until the router moves the session."""
        owner = await self._owner(session_id, context, assign=assign)
        if owner is None and _forwarded(context):
            # The forwarding server waits for these to know we took the call.
            await context.send_initial_metadata(())
        attempt = 0
        while owner is not None:
            call = forward(self._routes.stub(owner), self._forward_metadata(context))
            moved = await self._await_answer(session_id, owner, call)
            if moved is not False:
                owner = moved
                continue
            try:
                return await call  # type: ignore[no-any-return]
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or attempt == 1:
                    await _pass_through(context, exc)
                attempt += 1
                owner = await self._reroute(session_id, owner)
        return await local()

    async def _forward_stream(
        self,
        session_id: str,
        owner: Owner,
        context: grpc.aio.ServicerContext,
        forward: Callable[[SessionServiceStub, Metadata], grpc.aio.UnaryStreamCall],
    ) -> AsyncIterator[event_pb2.Event]:
        """Relay a stream from the owner. Only a stream that failed before its
        first event is retried (after one, the caller resumes itself); raises
        _LocalNow if the session turned out to be this server's."""
        current: Owner | None = owner
        attempt = 0
        while True:
            if current is None:
                raise _LocalNow
            call = forward(self._routes.stub(current), self._forward_metadata(context))
            moved = await self._await_answer(session_id, current, call)
            if moved is not False:
                current = moved  # the session moved while its owner was silent
                continue
            received = False
            try:
                async for event in call:
                    received = True
                    yield event
                return
            except grpc.aio.AioRpcError as exc:
                unreachable = exc.code() == grpc.StatusCode.UNAVAILABLE and not received
                if not unreachable or attempt == 1:
                    await _pass_through(context, exc)
                attempt += 1
                current = await self._reroute(session_id, current)

    async def _await_answer(
        self, session_id: str, owner: Owner, call: grpc.aio.Call
    ) -> Owner | Literal[False] | None:
        """Wait for the owner's response headers (an owner sends them as soon
        as it takes a forwarded stream). False: it answered (or failed, which
        the caller sees). An owner that takes the call but stays silent is
        frozen or cut off, which TCP and gRPC keepalives notice only after a
        minute: ask the router, without an "unreachable" hint (a slow owner
        must not be evicted), until the session moves (its heartbeats stop),
        and return the new owner (None: this server), cancelling the call."""
        give_up = time.monotonic() + OWNER_SILENT_LIMIT_SECONDS
        while True:
            try:
                await asyncio.wait_for(
                    asyncio.shield(call.initial_metadata()), OWNER_ANSWER_SECONDS
                )
                return False
            except TimeoutError:
                pass
            self._routes.forget(session_id)
            try:
                latest = await self._routes.owner(session_id)
            except Unavailable:
                latest = owner
            if latest is None or latest.member_id != owner.member_id:
                call.cancel()
                if latest is not None and latest.member_id == self._member_id:
                    self._core.owned.add(session_id)
                    return None
                return latest
            if time.monotonic() > give_up:
                call.cancel()
                raise Unavailable("the server that owns this session does not answer")

    async def _relay(
        self,
        session_id: str,
        context: grpc.aio.ServicerContext,
        forward: Callable[[SessionServiceStub, Metadata], grpc.aio.UnaryStreamCall],
        local: Callable[[], Awaitable[AsyncIterator[event_pb2.Event]]],
    ) -> AsyncIterator[event_pb2.Event]:
        """The events of a streaming call: relayed from the owner, or this
        server's own (then iterated directly: no extra layer per event)."""
        owner = await self._owner(session_id, context)
        if owner is not None:
            try:
                async for event in self._forward_stream(session_id, owner, context, forward):
                    yield event
                return
            except _LocalNow:
                pass
        elif _forwarded(context):
            # The forwarding server waits for these to know we took the call.
            await context.send_initial_metadata(())
        async for event in await local():
            yield event

    async def _reroute(self, session_id: str, unreachable: Owner) -> Owner | None:
        owner = await self._routes.owner(session_id, unreachable=unreachable)
        if owner is not None and owner.member_id == self._member_id:
            self._core.owned.add(session_id)
            return None
        return owner

    # RPCs -------------------------------------------------------------------

    async def CreateSession(
        self, request: spb.CreateSessionRequest, context: grpc.aio.ServicerContext
    ) -> spb.CreateSessionResponse:
        validation.validate_create_session(request)
        if not request.session_id:
            request.session_id = new_id()
        # Before an owner is assigned, so a refused create leaves no route behind.
        await self._core.require_agent(request.agent_name)

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
        self, request: spb.GetSessionRequest, context: grpc.aio.ServicerContext
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
        self, request: spb.DeleteSessionRequest, context: grpc.aio.ServicerContext
    ) -> spb.DeleteSessionResponse:
        validation.validate_session_id(request.session_id)

        async def local() -> spb.DeleteSessionResponse:
            deleted = await self._core.delete_session(request.session_id)
            await self._routes.remove_session(request.session_id)
            return spb.DeleteSessionResponse(deleted=deleted)

        return await self._unary(
            request.session_id,
            context,
            lambda stub, md: stub.DeleteSession(request, metadata=md),
            local,
        )

    async def GetHistory(
        self, request: spb.GetHistoryRequest, context: grpc.aio.ServicerContext
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
        self, request: spb.TurnRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[event_pb2.Event]:
        validation.validate_turn(request)

        async def local() -> AsyncIterator[event_pb2.Event]:
            tlog = await self._core.start_turn(request)
            cancel = request.on_disconnect == spb.DISCONNECT_POLICY_CANCEL
            return self._core.follow(tlog, 0, cancel)

        async for event in self._relay(
            request.session_id, context, lambda stub, md: stub.Turn(request, metadata=md), local
        ):
            yield event

    async def CancelTurn(
        self, request: spb.CancelTurnRequest, context: grpc.aio.ServicerContext
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
        self, request: spb.SubscribeTurnRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[event_pb2.Event]:
        validation.validate_subscribe(request)

        async def local() -> AsyncIterator[event_pb2.Event]:
            tlog = await self._core.logs.find(request.session_id, request.turn_id)
            return self._core.follow(tlog, request.after_seq, False)

        async for event in self._relay(
            request.session_id,
            context,
            lambda stub, md: stub.SubscribeTurn(request, metadata=md),
            local,
        ):
            yield event

    async def GetHealth(
        self, request: spb.GetHealthRequest, context: grpc.aio.ServicerContext
    ) -> spb.GetHealthResponse:
        return spb.GetHealthResponse(
            status=self._state(),
            agent_name=self._core.default_agent,
            agent_ready=self._core.workers.has_agent(self._core.default_agent),
            active_sessions=await self._core.store.count(),
            uptime_seconds=round(time.monotonic() - self._started, 3),
            server_id=self._member_id,
            running_turns=self._core.running_turns,
        )

    async def GetReadiness(
        self, request: spb.GetReadinessRequest, context: grpc.aio.ServicerContext
    ) -> spb.GetReadinessResponse:
        state = self._state()
        if state not in (spb.LIFECYCLE_STATE_READY, spb.LIFECYCLE_STATE_RUNNING):
            raise Unavailable(f"not ready: {spb.LifecycleState.Name(state)}")
        return spb.GetReadinessResponse(ready=True, status=state)


async def _pass_through(context: grpc.aio.ServicerContext, exc: grpc.aio.AioRpcError) -> None:
    """Give the caller the owner's status exactly, details included."""
    trailing = tuple((k, v) for k, v in (exc.trailing_metadata() or ()) if k in PASSED_TRAILERS)
    await context.abort(exc.code(), exc.details() or "", trailing)


class _LocalNow(Exception):
    """The owner was unreachable and the router gave the session to this server."""
