"""SessionService: the public API. Thin: it validates, decides where a call
runs (here if this server owns the session, else forwarded to the owner), and
converts to and from the protos."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.api import httpbody_pb2

from turnmesh.runtime import principals, sse, wire
from turnmesh.runtime.errors import (
    FieldViolation,
    InvalidArgument,
    NoLiveWorker,
    PermissionDenied,
    Unavailable,
)
from turnmesh.runtime.ids import new_id
from turnmesh.runtime.principals import ANONYMOUS, PRINCIPAL_PATTERN
from turnmesh.server.mesh import task_calls
from turnmesh.server.mesh.forwarding import Forwarder
from turnmesh.server.mesh.ownership import SessionOwnership
from turnmesh.server.owner_calls import Context, Item, Metadata, OwnerCalls
from turnmesh.server.sessions import validation
from turnmesh.server.sessions.admission import admit
from turnmesh.server.sessions.core import SessionCore
from turnmesh.server.sessions.eventlog import TurnLog
from turnmesh.server.sessions.history import up_to_turn
from turnmesh.server.stores import listing
from turnmesh.v1 import event_pb2
from turnmesh.v1 import session_service_pb2 as spb

if TYPE_CHECKING:
    from turnmesh.v1.event_stream_pb2_grpc import EventStreamServiceAsyncStub
    from turnmesh.v1.session_service_pb2_grpc import SessionServiceAsyncStub as Stub

log = logging.getLogger(__name__)
# How long a listing waits for each other server (memory and SQLite stores).
LIST_CALL_SECONDS = 5.0


class SessionServicer:
    """The SessionService methods. A call's context is ``Context``: gRPC's, or
    an in-process call of a compatibility surface on this server (which needs
    no loopback through the public client; ``app.py`` registers this class
    for the generated service, whose stub types the context as gRPC's only)."""

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
        other_servers: Callable[[], Awaitable[list[Stub]]] | None = None,
    ) -> None:
        self._core = core
        self._ownership = ownership
        # Where each call runs: here, or on its session's owner.
        self.calls = OwnerCalls(
            ownership, forwarder, mesh_key=mesh_key, forward_credentials=forward_credentials
        )
        self._state = readiness
        self._router_connected = router_connected
        self._other_servers = other_servers
        self._started = time.monotonic()

    # Whose sessions --------------------------------------------------------

    @staticmethod
    def _principal(named: str = "") -> str:
        """The principal whose sessions a call reads: the caller's, or the one
        an admin names."""
        caller = principals.current()
        if not named or named == caller.name:
            return caller.name
        if not caller.admin:
            raise PermissionDenied("only an admin may name another principal")
        if named != ANONYMOUS and not PRINCIPAL_PATTERN.fullmatch(named):
            raise InvalidArgument([FieldViolation("principal", "not a principal name")])
        return named

    @staticmethod
    def _audit(principal: str, what: str, session_id: str = "") -> None:
        """Log an admin's read of another principal's sessions (on the server
        that serves it, once)."""
        caller = principals.current()
        if principal != caller.name:
            log.info(
                "admin %s read %s of principal %s",
                caller.name,
                what,
                principal,
                extra={"principal": caller.name, "session_id": session_id, "audit": what},
            )

    # A2A task records (server/mesh/task_calls.py), on their session's owner --

    def forwarded(self, context: Context) -> bool:
        """Whether another mesh member forwarded the call here."""
        return self.calls.forwarded(context)

    async def _on_owner(
        self, session_id: str, context: Context, method: str, payload: list[Any], local: Any
    ) -> Any:
        validation.validate_session_id(session_id)
        sid = principals.scoped(principals.current().name, session_id)

        async def here() -> bytes:
            return json.dumps(await local(sid)).encode()

        answer: bytes = await self.calls.unary(
            sid,
            context,
            lambda stub, md: task_calls.call(stub, method, payload, md, LIST_CALL_SECONDS),
            here,
        )
        return task_calls.decoded(answer)

    async def get_task_record(self, session_id: str, task_id: str, context: Context) -> str:
        """A task record of the caller's session ("" if none), from its owner."""

        async def local(sid: str) -> str:
            found = await self._core.store.get_task(sid, task_id)
            return found.decode() if found else ""

        found: str = await self._on_owner(
            session_id, context, task_calls.GET, [session_id, task_id], local
        )
        return found

    async def put_task_record(
        self, session_id: str, task_id: str, record: str, created_at: float, context: Context
    ) -> bool:
        """Write a task record of the caller's session on its owner; False
        if the session is gone."""

        async def local(sid: str) -> bool:
            return await self._core.store.put_task(sid, task_id, record.encode(), created_at)

        written: bool = await self._on_owner(
            session_id, context, task_calls.PUT, [session_id, task_id, record, created_at], local
        )
        return written

    async def list_task_records(
        self, before: list[Any] | None, limit: int, context: Context
    ) -> dict[str, Any]:
        """A keyset page of the caller's task records, newest first, from
        every server that holds sessions (one, with a shared store):
        ``{"items": [[nanos, task, session, record]], "frontier": [nanos, task] | None}``."""
        principal = principals.current().name
        at = (int(before[0]), str(before[1])) if before else None
        local = await self._core.store.list_tasks(principal, at, limit)
        pages = [
            listing.Page(
                [
                    (pos, (principals.public_id(sid), record.decode()))
                    for pos, (sid, record) in local.items
                ],
                local.frontier,
            )
        ]
        if not (self._core.store.shared or self.calls.forwarded(context)):
            metadata = self.calls.forward_metadata(context)
            servers = await self._other_servers() if self._other_servers else []
            for stub in servers:
                try:
                    answer = await task_calls.call(
                        stub, task_calls.LIST, [before, limit], metadata, LIST_CALL_SECONDS
                    )
                except grpc.aio.AioRpcError as exc:
                    log.warning("a server did not list its A2A tasks: %s", exc.code().name)
                    raise Unavailable(
                        "a server holding sessions did not answer the listing; retry"
                    ) from exc
                page = task_calls.decoded(answer)
                frontier = page["frontier"]
                pages.append(
                    listing.Page(
                        [((n, t), (s, r)) for n, t, s, r in page["items"]],
                        (frontier[0], frontier[1]) if frontier else None,
                    )
                )
        merged = listing.merge(pages, limit)
        return {
            "items": [[n, t, s, r] for (n, t), (s, r) in merged.items],
            "frontier": list(merged.frontier) if merged.frontier else None,
        }

    # RPCs -------------------------------------------------------------------

    async def CreateSession(
        self, request: spb.CreateSessionRequest, context: Context
    ) -> spb.CreateSessionResponse:
        await validation.validate_create_session_async(request)
        if not request.session_id:
            request.session_id = new_id()
        sid = principals.scoped(principals.current().name, request.session_id)
        # Before an owner is assigned, so a refused create costs the router nothing.
        if request.webhook_url:
            self._core.check_webhook(principals.principal_of(sid), request.webhook_url)
        await self._core.require_agent(request.agent_name)
        await self._core.check_capacity(principals.principal_of(sid))

        async def local() -> spb.CreateSessionResponse:
            session = await self._core.create_session(
                sid,
                request.agent_name,
                request.metadata,
                list(request.messages),
                request.webhook_url,
            )
            return spb.CreateSessionResponse(session=session)

        return await self.calls.unary(
            sid,
            context,
            lambda stub, md: stub.CreateSession(request, metadata=md),
            local,
            assign=True,
        )

    async def ListSessions(
        self, request: spb.ListSessionsRequest, context: Context
    ) -> spb.ListSessionsResponse:
        size = listing.page_size(request.page_size)
        wanted = listing.filters(request.agent_name, list(request.metadata))
        before = listing.decode_token(request.page_token)
        principal = self._principal(request.principal)
        if self._core.store.shared or self.calls.forwarded(context):
            page = await self._core.list_sessions(principal, before, size, wanted)
            self._audit(principal, "the session list")
        else:
            # Each server holds its own sessions: ask every one, merge.
            page = await self._list_everywhere(request, context, principal, before, size, wanted)
        return spb.ListSessionsResponse(
            sessions=[session for _, session in page.items],
            next_page_token=listing.encode_token(page.frontier),
        )

    async def _list_everywhere(
        self,
        request: spb.ListSessionsRequest,
        context: Context,
        principal: str,
        before: listing.Position | None,
        size: int,
        wanted: listing.Filters,
    ) -> listing.Page[spb.Session]:
        asked = spb.ListSessionsRequest()
        asked.CopyFrom(request)
        asked.page_size = size
        metadata = self.calls.forward_metadata(context)

        async def remote(stub: Stub) -> listing.Page[spb.Session]:
            try:
                answer = await stub.ListSessions(
                    asked, metadata=metadata, timeout=LIST_CALL_SECONDS
                )
            except grpc.aio.AioRpcError as exc:
                # A page without its sessions would move the token past them.
                log.warning("a server did not list its sessions: %s", exc.code().name)
                raise Unavailable(
                    "a server holding sessions did not answer the listing; retry"
                ) from exc
            return listing.Page(
                [(listing.session_position(s), s) for s in answer.sessions],
                listing.decode_token(answer.next_page_token),
            )

        servers = await self._other_servers() if self._other_servers else []
        pages = await asyncio.gather(
            self._core.list_sessions(principal, before, size, wanted),
            *(remote(stub) for stub in servers),
        )
        self._audit(principal, "the session list")
        return listing.merge(pages, size)

    async def GetSession(
        self, request: spb.GetSessionRequest, context: Context
    ) -> spb.GetSessionResponse:
        validation.validate_session_id(request.session_id)
        principal = self._principal(request.principal)
        sid = principals.scoped(principal, request.session_id)

        async def local() -> spb.GetSessionResponse:
            self._audit(principal, "a session", sid)
            return spb.GetSessionResponse(session=await self._core.get_session(sid))

        return await self.calls.unary(
            sid, context, lambda stub, md: stub.GetSession(request, metadata=md), local
        )

    async def DeleteSession(
        self, request: spb.DeleteSessionRequest, context: Context
    ) -> spb.DeleteSessionResponse:
        validation.validate_session_id(request.session_id)
        sid = principals.scoped(principals.current().name, request.session_id)

        async def local() -> spb.DeleteSessionResponse:
            return spb.DeleteSessionResponse(deleted=await self._core.delete_session(sid))

        return await self.calls.unary(
            sid, context, lambda stub, md: stub.DeleteSession(request, metadata=md), local
        )

    async def ForkSession(
        self, request: spb.ForkSessionRequest, context: Context
    ) -> spb.ForkSessionResponse:
        validation.validate_fork_session(request)
        # Read where the source lives, create where the router places the
        # fork: each call forwards on its own, so the two may be two servers.
        source = (
            await self.GetSession(spb.GetSessionRequest(session_id=request.session_id), context)
        ).session
        history = await self.GetHistory(
            spb.GetHistoryRequest(session_id=request.session_id), context
        )
        create = spb.CreateSessionRequest(
            session_id=request.new_session_id,
            agent_name=source.agent_name,
            messages=up_to_turn(list(history.messages), request.at_turn_id),
            # A URL the caller's allow-list does not admit (now) is not carried over.
            webhook_url=source.webhook_url
            if self._core.webhook_allowed(principals.current().name, source.webhook_url)
            else "",
        )
        create.metadata.CopyFrom(
            request.metadata if request.HasField("metadata") else source.metadata
        )
        try:
            created = await self.CreateSession(create, context)
        except InvalidArgument as exc:
            # Past what a new session may be seeded with (10,000 messages, 64 MiB).
            raise InvalidArgument(
                [FieldViolation("at_turn_id", f"the history up to this turn: {exc.detail}")]
            ) from None
        return spb.ForkSessionResponse(session=created.session)

    async def GetHistory(
        self, request: spb.GetHistoryRequest, context: Context
    ) -> spb.GetHistoryResponse:
        validation.validate_session_id(request.session_id)
        principal = self._principal(request.principal)
        sid = principals.scoped(principal, request.session_id)

        async def local() -> spb.GetHistoryResponse:
            self._audit(principal, "a history", sid)
            return spb.GetHistoryResponse(messages=await self._core.history(sid))

        return await self.calls.unary(
            sid, context, lambda stub, md: stub.GetHistory(request, metadata=md), local
        )

    async def Turn(
        self, request: spb.TurnRequest, context: Context
    ) -> AsyncGenerator[event_pb2.Event, None]:
        events = await self._turn(
            request,
            context,
            lambda tlog, cancel: self._core.follow(tlog, 0, cancel),
            lambda stub, md: stub.Turn(request, metadata=md),
        )
        async with contextlib.aclosing(events):
            async for event in events:
                yield event

    async def turn_sse(
        self, request: spb.TurnRequest, context: Context
    ) -> AsyncGenerator[httpbody_pb2.HttpBody, None]:
        """Turn's events as SSE, several to a message when they queue up
        (``EventStreamService.StreamTurn``; from the owner likewise)."""
        return await self._turn(
            request,
            context,
            lambda tlog, cancel: sse.bodies(self._core.follow_batches(tlog, 0, cancel)),
            lambda stub, md: _events(stub).StreamTurn(request, metadata=md),
        )

    async def turn_batches(
        self, request: spb.TurnRequest, context: Context
    ) -> AsyncGenerator[list[event_pb2.Event], None]:
        """Turn's events in batches, every event ready at once (the surfaces
        in this process); an owner's, relayed, one a batch."""
        return await self._turn(
            request,
            context,
            lambda tlog, cancel: self._core.follow_batches(tlog, 0, cancel),
            lambda stub, md: stub.Turn(request, metadata=md),
            _singles,
        )

    async def _turn(
        self,
        request: spb.TurnRequest,
        context: Context,
        read: Callable[[TurnLog, bool], AsyncGenerator[Item, None]],
        forward: Callable[[Stub, Metadata], grpc.aio.UnaryStreamCall[Any, Any]],
        adapt: Callable[[AsyncGenerator[Any, None]], AsyncGenerator[Item, None]] | None = None,
    ) -> AsyncGenerator[Item, None]:
        """A turn, started here or on its owner: ``read`` follows its log
        (given whether the caller's leaving cancels it); ``forward`` calls the
        owner, whose stream ``adapt`` makes ours."""
        sid = await self._checked_turn(request)

        async def local() -> AsyncGenerator[Item, None]:
            admission = await admit(request, sid)
            tlog = await self._core.start_turn(admission)
            return read(tlog, admission.cancel_on_disconnect)

        return await self.calls.relay(sid, context, forward, local, adapt)

    async def _checked_turn(self, request: spb.TurnRequest) -> str:
        """The turn's scoped session id, once the request is valid and within
        its budgets."""
        size = wire.received_bytes()
        if size is not None and not validation.session_id_violations(request.session_id):
            # A flood past the budgets is refused before its files are read.
            scoped = principals.scoped(principals.current().name, request.session_id)
            self._core.refuse_over_budget(scoped, size)
        await validation.validate_turn_async(request)
        return principals.scoped(principals.current().name, request.session_id)

    async def StartTurn(
        self, request: spb.StartTurnRequest, context: Context
    ) -> spb.StartTurnResponse:
        size = wire.received_bytes()
        if size is not None and not validation.session_id_violations(request.session_id):
            # As Turn: a flood past the budgets is refused before its files are read.
            scoped = principals.scoped(principals.current().name, request.session_id)
            self._core.refuse_over_budget(scoped, size)
        await _validate_start_turn(request)
        sid = principals.scoped(principals.current().name, request.session_id)

        async def local() -> spb.StartTurnResponse:
            admission = await admit(request.turn, sid, background=True)
            try:
                turn = await self._core.start_background_turn(admission)
            except InvalidArgument as exc:  # the answers to a pause, checked as placed
                raise _in_turn(exc) from None
            return spb.StartTurnResponse(turn=turn)

        return await self.calls.unary(
            sid, context, lambda stub, md: stub.StartTurn(request, metadata=md), local
        )

    async def GetTurn(self, request: spb.GetTurnRequest, context: Context) -> spb.GetTurnResponse:
        validation.validate_turn_ref(request.session_id, request.turn_id)
        sid = principals.scoped(principals.current().name, request.session_id)

        async def local() -> spb.GetTurnResponse:
            return spb.GetTurnResponse(turn=await self._core.get_turn(sid, request.turn_id))

        return await self.calls.unary(
            sid, context, lambda stub, md: stub.GetTurn(request, metadata=md), local
        )

    async def CancelTurn(
        self, request: spb.CancelTurnRequest, context: Context
    ) -> spb.CancelTurnResponse:
        validation.validate_turn_ref(request.session_id, request.turn_id)
        sid = principals.scoped(principals.current().name, request.session_id)

        async def local() -> spb.CancelTurnResponse:
            return spb.CancelTurnResponse(state=await self._core.cancel_turn(sid, request.turn_id))

        return await self.calls.unary(
            sid, context, lambda stub, md: stub.CancelTurn(request, metadata=md), local
        )

    async def SubscribeTurn(
        self, request: spb.SubscribeTurnRequest, context: Context
    ) -> AsyncGenerator[event_pb2.Event, None]:
        validation.validate_subscribe(request)
        sid = principals.scoped(principals.current().name, request.session_id)

        async def local() -> AsyncGenerator[event_pb2.Event, None]:
            return await self._core.subscribe(sid, request.turn_id, request.after_seq)

        events = await self.calls.relay(
            sid, context, lambda stub, md: stub.SubscribeTurn(request, metadata=md), local
        )
        async with contextlib.aclosing(events):
            async for event in events:
                yield event

    async def subscribe_sse(
        self, request: spb.SubscribeTurnRequest, context: Context
    ) -> AsyncGenerator[httpbody_pb2.HttpBody, None]:
        """SubscribeTurn's events as SSE (``EventStreamService.StreamSubscribeTurn``)."""
        validation.validate_subscribe(request)
        sid = principals.scoped(principals.current().name, request.session_id)

        async def local() -> AsyncGenerator[httpbody_pb2.HttpBody, None]:
            batches = await self._core.subscribe_batches(sid, request.turn_id, request.after_seq)
            return sse.bodies(batches)

        return await self.calls.relay(
            sid,
            context,
            lambda stub, md: _events(stub).StreamSubscribeTurn(request, metadata=md),
            local,
        )

    async def GetHealth(
        self, request: spb.GetHealthRequest, context: Context
    ) -> spb.GetHealthResponse:
        health = await self._core.health()
        answer = spb.GetHealthResponse(
            status=self._state(),
            agent_name=health.default_agent,
            agent_ready=health.agent_ready,
            uptime_seconds=round(time.monotonic() - self._started, 3),
            server_id=self._ownership.member_id,
            router_connected=self._router_connected(),
        )
        # Open to anyone: the mesh's counts (every tenant's activity) only
        # for a caller with a key, or on a mesh without keys.
        if principals.caller_known():
            answer.active_sessions = health.sessions
            answer.running_turns = health.running_turns
            answer.sessions_available = health.sessions_available
        return answer

    async def GetReadiness(
        self, request: spb.GetReadinessRequest, context: Context
    ) -> spb.GetReadinessResponse:
        state = self._state()
        if state not in (spb.LIFECYCLE_STATE_READY, spb.LIFECYCLE_STATE_RUNNING):
            raise Unavailable(f"not ready: {spb.LifecycleState.Name(state)}")
        readiness = self._core.readiness
        if not readiness.ready:
            raise NoLiveWorker(f"not ready: no live worker serves agent {readiness.agent!r}")
        return spb.GetReadinessResponse(ready=True, status=state)


async def _singles(
    items: AsyncGenerator[event_pb2.Event | list[event_pb2.Event], None],
) -> AsyncGenerator[list[event_pb2.Event], None]:
    """An owner's events as batches of one (the owner's Turn sends one a
    message); a batch (the session turned out to be here) as it is."""
    async with contextlib.aclosing(items):
        async for item in items:
            yield item if isinstance(item, list) else [item]


def _events(stub: Stub) -> EventStreamServiceAsyncStub:
    """The owner's EventStreamService, on the channel of its stub."""
    if not isinstance(stub, task_calls.OwnerStub):
        raise TypeError("another server's event streams are reached by its OwnerStub")
    return stub.events


async def _validate_start_turn(request: spb.StartTurnRequest) -> None:
    """The session id, then the turn exactly as Turn validates it (its
    violations named from the request: ``turn.message``). The turn's own
    session id may be left empty; it becomes the request's."""
    violations = validation.session_id_violations(request.session_id)
    turn = request.turn
    if turn.session_id and turn.session_id != request.session_id:
        violations.append(
            FieldViolation("turn.session_id", "must be empty or the session_id of the request")
        )
    turn.session_id = request.session_id
    try:
        await validation.validate_turn_async(turn)
    except InvalidArgument as exc:
        # Its session id is the request's, reported above.
        violations += [v for v in _in_turn(exc).violations if v.field != "turn.session_id"]
    if violations:
        raise InvalidArgument(violations)


def _in_turn(error: InvalidArgument) -> InvalidArgument:
    """A TurnRequest's violations as fields of StartTurnRequest's ``turn``."""
    return InvalidArgument(
        [FieldViolation(f"turn.{v.field}", v.description) for v in error.violations]
    )
