"""Ownership and forwarding with fake owners and a fake router: stale
routes, owners gone, owners silent, sessions that move mid-call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

import grpc
import pytest
from google.protobuf import struct_pb2

from turnmesh.runtime import principals
from turnmesh.runtime.errors import AlreadyExists, HeldElsewhere, ResourceExhausted, Unavailable
from turnmesh.runtime.interceptors import MESH_KEY_METADATA
from turnmesh.runtime.principals import PRINCIPAL_METADATA, Principal
from turnmesh.server.config import SessionLimits
from turnmesh.server.mesh.forwarding import (
    FORWARDED_METADATA,
    TOOK_CALL_METADATA,
    UNREACHABLE_METADATA,
    Forwarder,
    OwnerFailed,
)
from turnmesh.server.mesh.ownership import LOCAL, Forward, Owner, SessionOwnership
from turnmesh.server.service import SessionServicer
from turnmesh.server.sessions.core import SessionCore
from turnmesh.server.stores.memory import MemoryStore
from turnmesh.v1 import event_pb2
from turnmesh.v1 import session_service_pb2 as spb

ME = Owner("server-me", "127.0.0.1:1")
B = Owner("server-b", "127.0.0.1:2")
C = Owner("server-c", "127.0.0.1:3")


class FakeWorkers:
    """A pool that serves the demo agent."""

    def has_agent(self, agent: str) -> bool:
        return agent == "demo"

    async def refresh(self) -> None:
        return None


class FakeRouter:
    """Answers Route from a table the test sets; records what it was told."""

    def __init__(self, owners: dict[str, Owner | None] | None = None) -> None:
        self.owners: dict[str, Owner | None] = owners or {}
        self.calls: list[tuple[str, str | None, bool]] = []
        self.down = False
        # Reassignments the router makes when told a member is unreachable.
        self.on_unreachable: dict[str, Owner] = {}
        # (session, owner): the session moves there when the router is next asked.
        self.move_on_ask: tuple[str, Owner] | None = None
        self.removed: list[str] = []

    async def route(
        self, session_id: str, *, unreachable: Owner | None = None, assign: bool = False
    ) -> Owner | None:
        self.calls.append((session_id, unreachable.member_id if unreachable else None, assign))
        if self.down:
            raise Unavailable("the mesh router is unavailable")
        if self.move_on_ask is not None and self.move_on_ask[0] == session_id:
            self.owners[session_id] = self.move_on_ask[1]
            self.move_on_ask = None
        if unreachable is not None and unreachable.member_id in self.on_unreachable:
            self.owners[session_id] = self.on_unreachable[unreachable.member_id]
        owner = self.owners.get(session_id)
        if owner is None and assign:
            owner = self.owners[session_id] = ME
        return owner

    async def remove_session(self, session_id: str) -> None:
        self.removed.append(session_id)


def _unavailable() -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "gone"
    )


class FakeCall:
    """A forwarded call on one owner: answers (headers, then a result or
    events), fails, or stays silent until cancelled."""

    def __init__(
        self,
        *,
        result: Any = None,
        events: list[event_pb2.Event] | None = None,
        error: grpc.aio.AioRpcError | None = None,
        fail_after: int | None = None,
        silent: bool = False,
        took: bool = False,
    ) -> None:
        self.result = result
        self.events = events or []
        self.error = error
        self.fail_after = fail_after
        self.silent = silent
        self.took = took  # the owner marked its headers: its errors are answers
        self.cancelled = False
        self._never = asyncio.Event()
        self._reading: AsyncIterator[event_pb2.Event] | None = None

    async def initial_metadata(self) -> grpc.aio.Metadata:
        if self.silent:
            await self._never.wait()
        if self.took:
            return grpc.aio.Metadata((TOOK_CALL_METADATA, "owner"))
        return grpc.aio.Metadata()

    def cancel(self) -> bool:
        self.cancelled = True
        return True

    def __await__(self) -> Any:
        async def result() -> Any:
            if self.error is not None:
                raise self.error
            return self.result

        return result().__await__()

    async def _iterate(self) -> AsyncIterator[event_pb2.Event]:
        for index, event in enumerate(self.events):
            if self.fail_after is not None and index == self.fail_after:
                assert self.error is not None
                raise self.error
            yield event
        if self.error is not None and self.fail_after is None:
            raise self.error

    def __aiter__(self) -> AsyncIterator[event_pb2.Event]:
        return self._iterate()

    async def read(self) -> Any:
        """The next event, or grpc.aio.EOF (as grpc's calls read)."""
        if self._reading is None:
            self._reading = self._iterate()
        try:
            return await anext(self._reading)
        except StopAsyncIteration:
            return grpc.aio.EOF


class Owners:
    """Stubs of the other servers: each owner's next call, in order."""

    def __init__(self, calls: dict[str, list[FakeCall]]) -> None:
        self.calls = calls
        self.made: list[str] = []
        # The extra metadata each call was forwarded with (the unreachable hint).
        self.hints: list[tuple[tuple[str, str], ...]] = []

    def stub(self, owner: Owner) -> Any:
        self.made.append(owner.member_id)
        return owner.member_id

    # The stub is the owner's member id; each FakeCall stands in for a grpc.aio call.
    def forward(
        self, member_id: Any, hint: tuple[tuple[str, str], ...]
    ) -> grpc.aio.UnaryUnaryCall[Any, Any]:
        self.hints.append(hint)
        return cast("grpc.aio.UnaryUnaryCall[Any, Any]", self.calls[member_id].pop(0))

    def forward_stream(
        self, member_id: Any, hint: tuple[tuple[str, str], ...]
    ) -> grpc.aio.UnaryStreamCall[Any, event_pb2.Event]:
        self.hints.append(hint)
        call = self.calls[member_id].pop(0)
        return cast("grpc.aio.UnaryStreamCall[Any, event_pb2.Event]", call)


def _forwarder(
    router: FakeRouter, owners: Owners, **limits: float
) -> tuple[Forwarder, SessionOwnership]:
    ownership = SessionOwnership(ME.member_id, router)
    return Forwarder(ownership, owners.stub, **limits), ownership


QUICK = {"answer_seconds": 0.01, "silent_limit_seconds": 0.05}


def _event(n: int) -> event_pb2.Event:
    return event_pb2.Event(type=event_pb2.TEXT_MESSAGE_CONTENT, delta=str(n), seq=n)


async def _local() -> str:
    return "local"


# Ownership -------------------------------------------------------------------


async def test_owned_sessions_are_local_and_routes_are_cached() -> None:
    router = FakeRouter({"s1": B})
    ownership = SessionOwnership(ME.member_id, router)
    ownership.claim("mine")
    assert await ownership.place("mine") is LOCAL
    assert await ownership.place("s1") == Forward(B)
    assert await ownership.place("s1") == Forward(B)
    assert router.calls == [("s1", None, False)]  # the second came from the cache
    assert ownership.owned() == ["mine"]


async def test_a_session_assigned_here_is_owned_once_created() -> None:
    router = FakeRouter()
    ownership = SessionOwnership(ME.member_id, router)
    assert await ownership.place("new", assign=True) is LOCAL
    assert not ownership.owns("new")  # only a create that succeeds claims it
    core = SessionCore(MemoryStore(), cast(Any, FakeWorkers()), "demo", SessionLimits(), ownership)
    await core.create_session("new", "", struct_pb2.Struct())
    assert ownership.owns("new")
    # An unknown session is handled here (and is not found), never assigned.
    assert await ownership.place("unknown") is LOCAL
    assert not ownership.owns("unknown")


async def test_without_the_router_only_what_the_store_holds_is_served() -> None:
    router = FakeRouter({"held": B})
    router.down = True

    async def holds(session_id: str) -> bool:
        return session_id == "held"

    ownership = SessionOwnership(ME.member_id, router, holds)
    assert await ownership.place("held") is LOCAL
    with pytest.raises(Unavailable):
        await ownership.place("elsewhere")


async def test_refused_creates_leave_no_route_and_nothing_owned() -> None:
    router = FakeRouter()
    ownership = SessionOwnership(ME.member_id, router)
    store = MemoryStore()
    limits = SessionLimits(max_sessions=1)
    core = SessionCore(store, cast(Any, FakeWorkers()), "demo", limits, ownership)
    await core.create_session("first", "", struct_pb2.Struct())
    for index in range(3):
        assert await ownership.place(f"refused-{index}", assign=True) is LOCAL
        with pytest.raises(ResourceExhausted):
            await core.create_session(f"refused-{index}", "", struct_pb2.Struct())
    assert ownership.owned() == ["first"]
    assert router.removed == ["refused-0", "refused-1", "refused-2"]
    roomy = SessionCore(store, cast(Any, FakeWorkers()), "demo", SessionLimits(), ownership)
    with pytest.raises(AlreadyExists):  # an existing session keeps its route
        await roomy.create_session("first", "", struct_pb2.Struct())
    assert router.removed == ["refused-0", "refused-1", "refused-2"]


async def test_forget_routes_and_release_drop_cached_and_owned() -> None:
    router = FakeRouter({"s1": B})
    ownership = SessionOwnership(ME.member_id, router)
    ownership.claim("mine")
    await ownership.place("s1")
    ownership.forget_routes()
    assert ownership.owned() == ["mine"]  # the store says so: kept
    await ownership.place("s1")
    assert len(router.calls) == 2  # asked again: nothing was cached
    ownership.claim("x")
    ownership.release("x")
    assert not ownership.owns("x")


# Forwarding unary calls ------------------------------------------------------


async def test_a_stale_route_to_a_vanished_owner_is_reported_and_rerouted() -> None:
    router = FakeRouter({"s": B})
    router.on_unreachable = {B.member_id: C}
    owners = Owners(
        {B.member_id: [FakeCall(error=_unavailable())], C.member_id: [FakeCall(result="from c")]}
    )
    forwarder, ownership = _forwarder(router, owners)
    placement = await ownership.place("s")
    result = await forwarder.unary("s", placement, owners.forward, _local)
    assert result == "from c"
    assert ("s", B.member_id, False) in router.calls  # the router was told B is unreachable
    assert owners.made == [B.member_id, C.member_id]
    # C is told B could not be reached (it may wait out B's lease).
    assert owners.hints == [(), ((UNREACHABLE_METADATA, B.member_id),)]
    # Later calls go to C without asking again.
    assert await ownership.place("s") == Forward(C)


async def test_an_owner_that_says_another_holds_the_session_sends_the_call_there() -> None:
    router = FakeRouter({"s": B})  # stale: C holds the session by its lease
    held = HeldElsewhere(
        "held elsewhere",
        metadata={"owner_id": C.member_id, "owner_address": C.address},
    ).to_status()
    refusal = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(*held.trailing_metadata),
        held.details,
    )
    owners = Owners(
        {B.member_id: [FakeCall(error=refusal, took=True)], C.member_id: [FakeCall(result="c")]}
    )
    forwarder, ownership = _forwarder(router, owners)
    assert await forwarder.unary("s", await ownership.place("s"), owners.forward, _local) == "c"
    assert await ownership.place("s") == Forward(C)  # the stale route is corrected
    assert all(unreachable is None for _, unreachable, _ in router.calls)  # B not evicted


async def test_a_create_caches_no_route() -> None:
    router = FakeRouter({"new": B})
    ownership = SessionOwnership(ME.member_id, router)
    assert await ownership.place("new", assign=True) == Forward(B)
    assert await ownership.place("new", assign=True) == Forward(B)
    assert len(router.calls) == 2  # asked each time: B may refuse it (full)


async def test_an_owner_gone_for_good_makes_the_session_this_servers() -> None:
    router = FakeRouter({"s": B})
    router.on_unreachable = {B.member_id: ME}
    owners = Owners({B.member_id: [FakeCall(error=_unavailable())]})
    forwarder, ownership = _forwarder(router, owners)
    result = await forwarder.unary("s", Forward(B), owners.forward, _local)
    assert result == "local"
    assert ownership.owns("s")


async def test_an_owner_that_stays_unreachable_fails_after_one_retry() -> None:
    router = FakeRouter({"s": B})
    owners = Owners({B.member_id: [FakeCall(error=_unavailable()) for _ in range(2)]})
    forwarder, _ = _forwarder(router, owners)
    with pytest.raises(OwnerFailed) as failed:
        await forwarder.unary("s", Forward(B), owners.forward, _local)
    assert failed.value.error.code() == grpc.StatusCode.UNAVAILABLE
    assert owners.made == [B.member_id, B.member_id]


async def test_an_owners_error_is_passed_on_without_retry() -> None:
    router = FakeRouter({"s": B})
    not_found = grpc.aio.AioRpcError(
        grpc.StatusCode.NOT_FOUND, grpc.aio.Metadata(), grpc.aio.Metadata(), "no such session"
    )
    owners = Owners({B.member_id: [FakeCall(error=not_found)]})
    forwarder, _ = _forwarder(router, owners)
    with pytest.raises(OwnerFailed) as failed:
        await forwarder.unary("s", Forward(B), owners.forward, _local)
    assert failed.value.error.code() == grpc.StatusCode.NOT_FOUND
    assert router.calls == []


async def test_a_silent_owner_is_left_once_the_session_moves() -> None:
    router = FakeRouter({"s": B})
    silent = FakeCall(silent=True)
    owners = Owners({B.member_id: [silent], C.member_id: [FakeCall(result="from c")]})
    forwarder, _ = _forwarder(router, owners, answer_seconds=0.01)

    # The router moves the session when it is first asked while B is silent.
    router.move_on_ask = ("s", C)
    result = await forwarder.unary("s", Forward(B), owners.forward, _local)
    assert result == "from c"
    assert silent.cancelled
    # Asked without an "unreachable" hint: a slow owner is never evicted.
    assert all(unreachable is None for _, unreachable, _ in router.calls)


async def test_a_silent_owner_that_keeps_the_session_is_given_up_on() -> None:
    router = FakeRouter({"s": B})
    silent = FakeCall(silent=True)
    owners = Owners({B.member_id: [silent]})
    forwarder, _ = _forwarder(router, owners, **QUICK)
    with pytest.raises(Unavailable):
        await forwarder.unary("s", Forward(B), owners.forward, _local)
    assert silent.cancelled


async def test_a_silent_owner_while_the_router_is_down_is_waited_on() -> None:
    router = FakeRouter({"s": B})
    router.down = True
    silent = FakeCall(silent=True)
    owners = Owners({B.member_id: [silent]})
    forwarder, _ = _forwarder(router, owners, **QUICK)
    with pytest.raises(Unavailable):
        await forwarder.unary("s", Forward(B), owners.forward, _local)
    assert len(router.calls) >= 2  # kept asking


# Forwarding streams ----------------------------------------------------------


async def _collect(stream: AsyncIterator[event_pb2.Event]) -> list[int]:
    return [event.seq async for event in stream]


async def _local_events() -> AsyncGenerator[event_pb2.Event, None]:
    async def events() -> AsyncGenerator[event_pb2.Event, None]:
        yield _event(100)

    return events()


async def test_a_stream_relays_the_owners_events() -> None:
    router = FakeRouter({"s": B})
    owners = Owners({B.member_id: [FakeCall(events=[_event(1), _event(2)])]})
    forwarder, _ = _forwarder(router, owners)
    stream = forwarder.stream("s", Forward(B), owners.forward_stream, _local_events)
    assert await _collect(stream) == [1, 2]


async def test_a_stream_whose_owner_moved_before_any_event_is_placed_again() -> None:
    router = FakeRouter({"s": B})
    router.on_unreachable = {B.member_id: ME}
    owners = Owners({B.member_id: [FakeCall(error=_unavailable())]})
    forwarder, ownership = _forwarder(router, owners)
    stream = forwarder.stream("s", Forward(B), owners.forward_stream, _local_events)
    assert await _collect(stream) == [100]  # this server's own events
    assert ownership.owns("s")


async def test_a_stream_broken_mid_way_is_not_retried() -> None:
    router = FakeRouter({"s": B})
    broken = FakeCall(events=[_event(1), _event(2)], error=_unavailable(), fail_after=1)
    owners = Owners({B.member_id: [broken]})
    forwarder, _ = _forwarder(router, owners)
    seen: list[int] = []

    async def relay() -> None:
        async for event in forwarder.stream("s", Forward(B), owners.forward_stream, _local_events):
            seen.append(event.seq)

    with pytest.raises(OwnerFailed):
        await relay()
    # The caller saw event 1 and resumes the turn itself; nothing ran twice.
    assert seen == [1]
    assert router.calls == []


async def test_a_stream_on_a_silent_owner_follows_the_session() -> None:
    router = FakeRouter({"s": B})
    silent = FakeCall(silent=True)
    owners = Owners({B.member_id: [silent], C.member_id: [FakeCall(events=[_event(7)])]})
    forwarder, _ = _forwarder(router, owners, answer_seconds=0.01)
    router.owners["s"] = C  # the router already moved it; the cache still says B
    stream = forwarder.stream("s", Forward(B), owners.forward_stream, _local_events)
    assert await _collect(stream) == [7]
    assert silent.cancelled


# The servicer's side: where a call lands -------------------------------------


class FakeContext:
    """What SessionServicer reads of a call: its metadata; records headers sent."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata
        self.headers_sent: list[tuple[tuple[str, str], ...]] = []

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    async def send_initial_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.headers_sent.append(metadata)


def _servicer(router: FakeRouter, mesh_key: str | None) -> SessionServicer:
    ownership = SessionOwnership(ME.member_id, router)
    forwarder = Forwarder(ownership, Owners({}).stub)
    core = SessionCore(MemoryStore(), cast(Any, None), "demo", SessionLimits(), ownership)
    return SessionServicer(
        core, ownership, forwarder, lambda: spb.LIFECYCLE_STATE_READY, mesh_key=mesh_key
    )


async def test_a_forwarded_call_is_handled_here_and_answered_at_once() -> None:
    router = FakeRouter({"s": B})  # the router says B owns it; the call came from B
    servicer = _servicer(router, mesh_key="k")
    context = FakeContext(((FORWARDED_METADATA, B.member_id), (MESH_KEY_METADATA, "k")))
    placement = await servicer.calls.place("s", cast(Any, context), assign=False)
    assert placement == LOCAL
    # The forwarding server knows we took it (and that errors are our answers).
    assert context.headers_sent == [((TOOK_CALL_METADATA, ME.member_id),)]
    assert router.calls == []  # a stale route never bounces a forwarded call


async def test_the_forwarded_marker_counts_only_with_the_mesh_key() -> None:
    router = FakeRouter({"s": B})
    servicer = _servicer(router, mesh_key="k")
    for metadata in (
        ((FORWARDED_METADATA, B.member_id),),
        ((FORWARDED_METADATA, B.member_id), (MESH_KEY_METADATA, "wrong")),
    ):
        context = FakeContext(metadata)
        placement = await servicer.calls.place("s", cast(Any, context), assign=False)
        assert placement == Forward(B)  # routed as any outside call
        assert context.headers_sent == []


async def test_a_forwarding_server_marks_and_keys_its_call() -> None:
    servicer = _servicer(FakeRouter(), mesh_key="k")
    context = FakeContext((("authorization", "Bearer user-key"), ("x-other", "dropped")))
    principals.set_current(Principal("acme", admin=True))
    metadata = dict(servicer.calls.forward_metadata(cast(Any, context)))
    assert metadata[PRINCIPAL_METADATA] == "acme admin"  # who the call acts for
    assert metadata[FORWARDED_METADATA] == ME.member_id
    assert metadata[MESH_KEY_METADATA] == "k"
    assert "authorization" not in metadata  # the mesh key opens the owner: no caller's key
    assert "x-other" not in metadata
    tls_only = SessionServicer(
        cast(Any, None),
        SessionOwnership(ME.member_id),
        cast(Any, None),
        lambda: spb.LIFECYCLE_STATE_READY,
        forward_credentials=True,
    )
    metadata = dict(tls_only.calls.forward_metadata(cast(Any, context)))
    assert metadata["authorization"] == "Bearer user-key"  # mTLS-proven peers only


class _SilentServer:
    """Another server's stub whose ListSessions fails."""

    async def ListSessions(self, request: Any, **_: Any) -> Any:
        raise _unavailable()


async def test_a_listing_that_misses_a_server_fails_rather_than_skip_its_sessions() -> None:
    ownership = SessionOwnership(ME.member_id, FakeRouter())
    core = SessionCore(MemoryStore(), cast(Any, None), "demo", SessionLimits(), ownership)

    async def others() -> list[Any]:
        return [_SilentServer()]

    servicer = SessionServicer(
        core,
        ownership,
        Forwarder(ownership, Owners({}).stub),
        lambda: spb.LIFECYCLE_STATE_READY,
        other_servers=others,
    )
    principals.set_current(Principal("acme"))
    with pytest.raises(Unavailable):
        await servicer.ListSessions(spb.ListSessionsRequest(), cast(Any, FakeContext(())))
    servicer._other_servers = None  # alone in the mesh: its own page
    listed = await servicer.ListSessions(spb.ListSessionsRequest(), cast(Any, FakeContext(())))
    assert list(listed.sessions) == [] and listed.next_page_token == ""


async def test_a_caller_that_leaves_a_relayed_stream_cancels_the_owners_call() -> None:
    """The owner hears of it at once (a caller that asked for its turn to be
    cancelled on leaving gets that), not when the call is collected."""
    router = FakeRouter({"s": B})
    call = FakeCall(events=[_event(1), _event(2), _event(3)])
    owners = Owners({B.member_id: [call]})
    forwarder, _ = _forwarder(router, owners)
    stream = forwarder.stream("s", Forward(B), owners.forward_stream, _local_events)
    assert isinstance(stream, AsyncGenerator)
    assert (await anext(stream)).seq == 1
    assert not call.cancelled
    await stream.aclose()
    assert call.cancelled
