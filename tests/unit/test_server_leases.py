"""Leases decide who owns a session in a shared store: takeovers only after
the holder's lease lapsed, a stalled owner keeps exactly what nobody took,
and without the router nothing is taken over. A fake store with a fake clock
stands in for Redis (tests/integration/test_ownership.py runs the real one)."""

from __future__ import annotations

import pytest

from turnmesh.runtime.errors import HeldElsewhere, Unavailable
from turnmesh.server.mesh.leases import HeldBy, Leases, Mine, Missing, Owner
from turnmesh.server.mesh.ownership import LOCAL, Forward, SessionOwnership

TTL = 6.0
A = Owner("server-a", "127.0.0.1:1")
B = Owner("server-b", "127.0.0.1:2")


class FakeLeaseStore:
    """Owner tokens and member leases as Redis keeps them, on a fake clock."""

    def __init__(self) -> None:
        self.now = 100.0
        self.owners: dict[str, str] = {}
        self.members: dict[str, tuple[str, float]] = {}
        # Members that keep renewing while others wait (alive, maybe cut off).
        self.renewing: set[str] = set()

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        for member_id in self.renewing:
            address, _ = self.members[member_id]
            self.members[member_id] = (address, self.now + TTL)

    async def owner_of(self, session_id: str) -> str | None:
        return self.owners.get(session_id)

    async def owners_of(self, session_ids: list[str]) -> list[str | None]:
        return [self.owners.get(s) for s in session_ids]

    async def swap_owner(self, session_id: str, expected: str, new: str) -> bool | None:
        if session_id not in self.owners:
            return None
        if self.owners[session_id] != expected:
            return False
        self.owners[session_id] = new
        return True

    async def hold_member(self, member_id: str, address: str, ttl_ms: int) -> None:
        self.members[member_id] = (address, self.now + ttl_ms / 1000)

    async def member_lease(self, member_id: str) -> tuple[str, float] | None:
        address, until = self.members.get(member_id, ("", 0.0))
        return (address, until - self.now) if self.now < until else None

    async def drop_member(self, member_id: str) -> None:
        self.members.pop(member_id, None)

    async def take_address(self, member_id: str, address: str, ttl_ms: int) -> str | None:
        held = [m for m, (a, until) in self.members.items() if a == address and until > self.now]
        return held[0] if held else None


class Router:
    def __init__(self, owners: dict[str, Owner] | None = None) -> None:
        self.owners = owners or {}
        self.down = False
        self.on_unreachable: dict[str, Owner] = {}

    async def route(
        self, session_id: str, *, unreachable: Owner | None = None, assign: bool = False
    ) -> Owner | None:
        if self.down:
            raise Unavailable("the mesh router is unavailable")
        if unreachable is not None and unreachable.member_id in self.on_unreachable:
            self.owners[session_id] = self.on_unreachable[unreachable.member_id]
        return self.owners.get(session_id)

    async def remove_session(self, session_id: str) -> None:
        self.owners.pop(session_id, None)


async def member(store: FakeLeaseStore, owner: Owner, router: Router) -> SessionOwnership:
    leases = Leases(
        store,
        owner.member_id,
        TTL,
        on_lapse=lambda: ownership.after_lapse(),  # as the server wires them
        clock=store.clock,
        sleep=store.sleep,
    )
    with pytest.raises(Unavailable, match="starting"):
        await leases.renew()  # no lease without an address: it would read as lapsed
    leases._address = owner.address  # as start() sets it, without the renewal task
    await leases.renew()
    ownership = SessionOwnership(owner.member_id, router, leases=leases)
    return ownership


async def _owns_nothing() -> None:
    """The lapse of a lease with no SessionOwnership: nothing to recheck."""


async def created(store: FakeLeaseStore, ownership: SessionOwnership, session_id: str) -> str:
    """A session created by this server, as SessionCore creates one."""
    token = ownership.new_token()
    store.owners[session_id] = token
    ownership.claim(session_id, token)
    return token


async def test_a_live_lease_cannot_be_taken_and_a_lapsed_one_can() -> None:
    store = FakeLeaseStore()
    router = Router()
    a = await member(store, A, router)
    b = await member(store, B, router)
    token = await created(store, a, "s")
    assert a._leases is not None and b._leases is not None
    assert await b._leases.claim("s") == HeldBy(A)
    assert await a._leases.claim("s") == Mine(token)
    assert await b._leases.claim("ghost") == Missing()

    store.now += TTL + 0.1  # A stalls; B keeps its lease
    await b._leases.renew()
    taken = await b._leases.claim("s")
    assert isinstance(taken, Mine) and taken.token.startswith("server-b/")
    assert store.owners["s"] == taken.token
    # A's turn started under its old token: its fence now refuses it.
    with pytest.raises(Unavailable, match="moved"):
        a.fence("s", store.owners["s"])
    assert not a.owns("s")


async def test_a_stalled_owner_keeps_exactly_what_nobody_took() -> None:
    store = FakeLeaseStore()
    router = Router()
    a = await member(store, A, router)
    b = await member(store, B, router)
    for session_id in ("taken", "kept"):
        await created(store, a, session_id)
    store.now += TTL + 1  # A is stopped (SIGSTOP) past its lease
    assert b._leases is not None
    await b._leases.renew()
    router.owners["taken"] = B
    assert await b.place("taken") is LOCAL  # routed to B, and A's lease lapsed
    # A comes back: before serving, it checks what it still holds.
    assert await a.verified() == ["kept"]
    assert await a.place("kept") is LOCAL
    assert await a.place("taken") == Forward(B)
    assert a.fence("kept", store.owners["kept"]).startswith("server-a/")


async def test_without_the_router_only_the_lease_decides() -> None:
    store = FakeLeaseStore()
    router = Router()
    a = await member(store, A, router)
    b = await member(store, B, router)
    await created(store, a, "a-s")
    await created(store, b, "b-s")
    orphan = await created(store, b, "orphan")
    router.down = True
    b.forget_routes()
    b.release("b-s")  # as after a restart of its process' view: the store still says b
    assert await b.place("b-s") is LOCAL
    assert await b.place("a-s") == Forward(A)  # A holds it: forwarded, never served here
    assert store.owners["a-s"].startswith("server-a/")
    del store.members[B.member_id]  # B is gone: its lease with it
    c = await member(store, Owner("server-c", "127.0.0.1:3"), router)
    assert await c.place("orphan") is LOCAL  # nobody's lease holds it: C takes it
    assert store.owners["orphan"] != orphan and store.owners["orphan"].startswith("server-c/")
    with pytest.raises(Unavailable):
        await c.place("new", assign=True)  # creates wait for the router
    assert await c.place("ghost") is LOCAL  # no such session: not found here


async def test_a_forwarded_call_for_a_session_held_elsewhere_is_refused() -> None:
    store = FakeLeaseStore()
    router = Router()
    a = await member(store, A, router)
    b = await member(store, B, router)
    await created(store, a, "s")
    store.renewing.add(A.member_id)  # A is alive: its lease holds however long B waits
    started = store.now
    with pytest.raises(Unavailable, match="held by server") as held:
        await b.accept_forwarded("s")  # no hint: refused at once, with A's address
    assert store.now == started
    assert isinstance(held.value, HeldElsewhere)
    assert held.value.metadata == {"owner_id": A.member_id, "owner_address": A.address}
    with pytest.raises(Unavailable, match="held by server"):
        await b.accept_forwarded("s", unreachable=A.member_id)  # told A is gone: waits
    assert not b.owns("s")
    assert started + TTL <= store.now <= started + TTL + 1.1  # one lease, no more
    store.renewing.clear()  # A dies: B's wait ends when its lease does
    await b.accept_forwarded("s", unreachable=A.member_id)
    assert b.owns("s")
    assert store.now <= started + 2 * TTL + 1.1


async def test_an_unreachable_owner_whose_lease_holds_is_not_bypassed() -> None:
    store = FakeLeaseStore()
    router = Router({"s": A})
    a = await member(store, A, router)
    b = await member(store, B, router)
    await created(store, a, "s")
    store.renewing.add(A.member_id)  # cut off from B, but alive and renewing
    router.on_unreachable[A.member_id] = B  # the router gives it to B...
    with pytest.raises(Unavailable, match="lease"):
        await b.after_unreachable("s", A)  # ...but A's lease still holds it
    assert store.owners["s"].startswith("server-a/")
    store.renewing.clear()  # A really is gone: B waits out its lease and takes over
    assert await b.after_unreachable("s", A) is LOCAL
    assert b.fence("s", store.owners["s"]).startswith("server-b/")


async def test_a_leaving_server_gives_its_lease_up() -> None:
    store = FakeLeaseStore()
    router = Router()
    a = await member(store, A, router)
    b = await member(store, B, router)
    await created(store, a, "s")
    assert a._leases is not None and b._leases is not None
    await a._leases.stop()
    taken = await b._leases.claim("s")  # at once, not after the TTL
    assert isinstance(taken, Mine)
    with pytest.raises(Unavailable, match="leaving"):
        await a._leases.ensure()  # a stopped server never renews again


async def test_a_silent_owner_with_the_router_down_is_judged_by_its_lease() -> None:
    store = FakeLeaseStore()
    router = Router({"s": A})
    a = await member(store, A, router)
    b = await member(store, B, router)
    await created(store, a, "s")
    router.down = True
    assert await b.after_silence("s", A) is None  # A's lease holds: keep waiting on it
    store.now += TTL + 1  # A stays frozen past its lease
    assert b._leases is not None
    await b._leases.renew()
    assert await b.after_silence("s", A) is LOCAL  # taken over, not waited on for a minute
    assert store.owners["s"].startswith("server-b/")


async def test_only_the_owner_expires_a_shared_session() -> None:
    store = FakeLeaseStore()
    router = Router()
    a = await member(store, A, router)
    b = await member(store, B, router)
    await created(store, a, "s")
    assert await a.may_expire("s")
    assert not await b.may_expire("s")  # A forgets it whole when it expires it
    store.now += TTL + 1  # A is gone: whoever expires it takes it over first
    assert b._leases is not None
    await b._leases.renew()
    assert await b.may_expire("s")
    assert b.owns("s")


async def test_a_server_restarted_on_an_address_ends_the_dead_ones_lease() -> None:
    store = FakeLeaseStore()
    router = Router()
    a = await member(store, A, router)
    await created(store, a, "s")
    # A is SIGKILLed; a new process binds its port at once, its lease still running.
    again = Leases(
        store, "server-a2", TTL, on_lapse=_owns_nothing, clock=store.clock, sleep=store.sleep
    )
    await again.start(A.address)
    try:
        taken = await again.claim("s")  # not after A's lease: A is gone for sure
        assert isinstance(taken, Mine) and taken.token.startswith("server-a2/")
    finally:
        await again.stop()
