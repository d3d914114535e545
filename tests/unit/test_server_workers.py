"""WorkerPool: which worker a turn goes to, quarantine, and channel bookkeeping.

The router is a fake (WorkerPool only calls ``membership.router.ListMembers``
and reads ``membership.metadata``), and channels and stubs are fakes too, so
nothing here opens a socket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from tests.unit._server_fakes import FakeClock, fake_time_module
from turnmesh.runtime.membership import MemberInfo
from turnmesh.server.workers import pool as workers_module
from turnmesh.server.workers.pool import (
    FAILED_WORKER_QUARANTINE,
    STICKY_SLACK,
    WorkerPool,
    WorkerRef,
)
from turnmesh.v1 import router_service_pb2 as rpb

MESH_MD = (("x-turnmesh-mesh-key", "secret"),)


class FakeRouter:
    def __init__(self) -> None:
        self.members: list[rpb.Member] = []
        self.requests: list[tuple[rpb.ListMembersRequest, Any]] = []
        self.error: Exception | None = None
        self.learning = False

    async def ListMembers(
        self, request: rpb.ListMembersRequest, *, metadata: Any = None, timeout: Any = None
    ) -> rpb.ListMembersResponse:
        self.requests.append((request, metadata))
        if self.error is not None:
            raise self.error
        return rpb.ListMembersResponse(members=self.members, learning=self.learning)


class FakeMembership:
    def __init__(self) -> None:
        self.router = FakeRouter()
        self.metadata = MESH_MD
        self.transport = None
        self.member = MemberInfo("server-me", rpb.MEMBER_ROLE_SERVER, "127.0.0.1:1")


@dataclass
class FakeChannel:
    address: str
    closed: bool = False

    async def close(self) -> None:
        self.closed = True

    def unary_stream(self, method: str, *serializers: object) -> tuple[str, str]:
        return (method, self.address)  # a Run for requests serialized already


@dataclass
class Channels:
    opened: list[FakeChannel] = field(default_factory=list)

    def __call__(self, address: str, transport: object = None) -> FakeChannel:
        channel = FakeChannel(address)
        self.opened.append(channel)
        return channel

    def closed(self) -> list[str]:
        return [c.address for c in self.opened if c.closed]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr(workers_module, "time", fake_time_module(c))
    return c


@pytest.fixture
def channels(monkeypatch: pytest.MonkeyPatch) -> Channels:
    opened = Channels()
    monkeypatch.setattr(workers_module, "mesh_channel", opened)
    monkeypatch.setattr(workers_module, "WorkerServiceStub", lambda channel: ("stub", channel))
    return opened


@pytest.fixture
def membership() -> FakeMembership:
    return FakeMembership()


@pytest.fixture
def pool(membership: FakeMembership, channels: Channels, clock: FakeClock) -> WorkerPool:
    return WorkerPool(membership)  # type: ignore[arg-type]


def member(member_id: str, agent: str = "demo", *, accepting: bool = True) -> rpb.Member:
    return rpb.Member(
        member_id=member_id,
        role=rpb.MEMBER_ROLE_WORKER,
        address=f"{member_id}.local:50052",
        agent_name=agent,
        accepting=accepting,
    )


async def listed(pool: WorkerPool, membership: FakeMembership, *members: rpb.Member) -> None:
    membership.router.members = list(members)
    await pool.refresh()


def pick(pool: WorkerPool, session_id: str = "s1", exclude: set[str] | None = None) -> str | None:
    worker = pool.pick("demo", session_id, exclude or set())
    return worker.member_id if worker else None


def busy(pool: WorkerPool, member_id: str, turns: int, session_id: str = "other") -> WorkerRef:
    """Put ``turns`` turns in flight on a worker (for sessions other than s1)."""
    worker = pool._workers[member_id]
    for _ in range(turns):
        pool.acquire(worker, session_id)
    return worker


# --- refresh ---------------------------------------------------------------------


async def test_a_restarted_router_still_learning_loses_no_known_worker(
    pool: WorkerPool, membership: FakeMembership
) -> None:
    await listed(pool, membership, member("w1"), member("w2"))
    membership.router.learning = True  # restarted: only w2 registered again so far
    await listed(pool, membership, member("w2"), member("w3"))
    assert sorted(pool._workers) == ["w1", "w2", "w3"]
    membership.router.learning = False  # complete: w1 is really gone
    await listed(pool, membership, member("w2"), member("w3"))
    assert sorted(pool._workers) == ["w2", "w3"]


async def test_refresh_asks_the_router_for_workers_with_the_membership_metadata(
    pool: WorkerPool, membership: FakeMembership
) -> None:
    await listed(pool, membership, member("w1"))
    request, metadata = membership.router.requests[-1]
    assert request.role == rpb.MEMBER_ROLE_WORKER
    assert request.caller_member_id == "server-me"
    assert metadata == MESH_MD
    assert pool.call_metadata == MESH_MD


async def test_known_is_set_once_a_worker_is_listed(
    pool: WorkerPool, membership: FakeMembership
) -> None:
    await listed(pool, membership)
    assert not pool.known.is_set()
    await listed(pool, membership, member("w1"))
    assert pool.known.is_set()


async def test_agents_and_has_agent(pool: WorkerPool, membership: FakeMembership) -> None:
    await listed(pool, membership, member("w1", "demo"), member("w2", "echo"))
    assert pool.agents() == {"demo", "echo"}
    assert pool.has_agent("echo")
    assert not pool.has_agent("nope")


async def test_non_accepting_members_are_ignored(
    pool: WorkerPool, membership: FakeMembership
) -> None:
    await listed(pool, membership, member("w1", accepting=False), member("w2"))
    assert pick(pool) == "w2"
    assert pick(pool, exclude={"w2"}) is None
    await listed(pool, membership, member("w1", accepting=False))
    assert not pool.has_agent("demo")


async def test_a_worker_that_left_the_router_is_no_longer_picked(
    pool: WorkerPool, membership: FakeMembership
) -> None:
    await listed(pool, membership, member("w1"), member("w2"))
    await listed(pool, membership, member("w2"))
    assert pick(pool) == "w2"
    assert pick(pool, exclude={"w2"}) is None


async def test_a_failed_refresh_keeps_the_known_workers(
    pool: WorkerPool, membership: FakeMembership
) -> None:
    await listed(pool, membership, member("w1"))
    membership.router.error = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "router down"
    )
    await pool.refresh()
    assert pick(pool) == "w1"


# --- pick ------------------------------------------------------------------------


async def test_no_candidate_is_none(pool: WorkerPool, membership: FakeMembership) -> None:
    assert pick(pool) is None
    await listed(pool, membership, member("w1", "echo"))
    assert pick(pool) is None


async def test_only_workers_of_the_agent_are_picked(
    pool: WorkerPool, membership: FakeMembership
) -> None:
    await listed(pool, membership, member("a-echo", "echo"), member("z-demo", "demo"))
    assert pick(pool) == "z-demo"
    echo = pool.pick("echo", "s1", set())
    assert echo is not None and echo.member_id == "a-echo"
    assert echo.agent_name == "echo"
    assert echo.address == "a-echo.local:50052"


async def test_fewest_in_flight_wins(pool: WorkerPool, membership: FakeMembership) -> None:
    await listed(pool, membership, member("w1"), member("w2"), member("w3"))
    busy(pool, "w1", 2)
    busy(pool, "w2", 1)
    busy(pool, "w3", 3)
    assert pick(pool) == "w2"


async def test_a_tie_goes_to_the_lowest_member_id(
    pool: WorkerPool, membership: FakeMembership
) -> None:
    await listed(pool, membership, member("w3"), member("w1"), member("w2"))
    assert pick(pool) == "w1"
    busy(pool, "w1", 1)
    assert pick(pool) == "w2"


async def test_exclude_skips_workers(pool: WorkerPool, membership: FakeMembership) -> None:
    await listed(pool, membership, member("w1"), member("w2"), member("w3"))
    assert pick(pool, exclude={"w1"}) == "w2"
    assert pick(pool, exclude={"w1", "w2"}) == "w3"
    assert pick(pool, exclude={"w1", "w2", "w3"}) is None


async def test_the_session_sticks_to_its_last_worker_within_the_slack(
    pool: WorkerPool, membership: FakeMembership
) -> None:
    assert STICKY_SLACK == 2
    await listed(pool, membership, member("w1"), member("w2"))
    w2 = busy(pool, "w2", 1, session_id="s1")  # s1 last ran on w2
    # w2 has 1 more in flight than w1: under the slack, s1 stays on w2 ...
    assert pick(pool, "s1") == "w2"
    # ... while a session with no history goes to the least busy worker.
    assert pick(pool, "s2") == "w1"
    # At exactly STICKY_SLACK more in flight, the session moves.
    pool.acquire(w2, "other")
    assert pick(pool, "s1") == "w1"
    pool.release(w2)
    assert pick(pool, "s1") == "w2"


async def test_stickiness_follows_the_most_recent_worker(
    pool: WorkerPool, membership: FakeMembership
) -> None:
    await listed(pool, membership, member("w1"), member("w2"))
    w1, w2 = pool._workers["w1"], pool._workers["w2"]
    pool.acquire(w2, "s1")
    pool.release(w2)
    pool.acquire(w1, "s1")
    pool.release(w1)
    busy(pool, "w1", 1)
    assert pick(pool, "s1") == "w1"


async def test_an_excluded_sticky_worker_is_not_picked(
    pool: WorkerPool, membership: FakeMembership
) -> None:
    await listed(pool, membership, member("w1"), member("w2"))
    busy(pool, "w1", 1, session_id="s1")
    assert pick(pool, "s1") == "w1"
    assert pick(pool, "s1", exclude={"w1"}) == "w2"


async def test_forget_session_drops_its_stickiness(
    pool: WorkerPool, membership: FakeMembership
) -> None:
    await listed(pool, membership, member("w1"), member("w2"))
    busy(pool, "w2", 1, session_id="s1")
    pool.forget_session("s1")
    pool.forget_session("never-seen")
    assert pick(pool, "s1") == "w1"


async def test_history_positions_go_with_their_session_and_within_a_bound(
    pool: WorkerPool, membership: FakeMembership, monkeypatch: pytest.MonkeyPatch
) -> None:
    await listed(pool, membership, member("w1"), member("w2"))
    w1, w2 = pool._workers["w1"], pool._workers["w2"]
    pool.remember_history(w1, "s1", 4)
    pool.remember_history(w2, "s1", 6)
    pool.remember_history(w1, "s2", 2)
    assert (pool.history_base(w1, "s1"), pool.history_base(w2, "s1")) == (4, 6)
    pool.forget_history(w2, "s1")
    assert (pool.history_base(w1, "s1"), pool.history_base(w2, "s1")) == (4, 0)
    pool.forget_session("s1")  # every worker's position of it, in one step
    assert pool.history_base(w1, "s1") == 0
    assert pool.history_base(w1, "s2") == 2
    # Bounded by sessions: the least recently used go first.
    monkeypatch.setattr(workers_module, "MAX_HISTORY_ENTRIES", 2)
    pool.remember_history(w1, "s3", 1)
    pool.remember_history(w2, "s2", 3)  # s2 used again: s3 is now the oldest
    pool.remember_history(w1, "s4", 1)
    assert pool.history_base(w1, "s3") == 0
    assert (pool.history_base(w1, "s2"), pool.history_base(w2, "s2")) == (2, 3)
    assert pool.history_base(w1, "s4") == 1


async def test_a_sticky_worker_that_left_is_not_picked(
    pool: WorkerPool, membership: FakeMembership
) -> None:
    await listed(pool, membership, member("w1"), member("w2"))
    busy(pool, "w2", 1, session_id="s1")
    await listed(pool, membership, member("w1"))
    assert pick(pool, "s1") == "w1"


async def test_release_decrements_in_flight(pool: WorkerPool, membership: FakeMembership) -> None:
    await listed(pool, membership, member("w1"), member("w2"))
    w1 = busy(pool, "w1", 2)
    busy(pool, "w2", 1)
    assert pick(pool) == "w2"
    pool.release(w1)
    assert pick(pool) == "w1"  # 1 vs 1: the tie goes to w1
    pool.release(w1)
    pool.release(w1)  # never below zero
    busy(pool, "w1", 1)
    assert pick(pool) == "w1"  # 1 vs 1 again, not 0 vs 1


# --- mark_failed / quarantine ------------------------------------------------------


async def test_mark_failed_quarantines_even_while_the_router_lists_the_worker(
    pool: WorkerPool, membership: FakeMembership, clock: FakeClock
) -> None:
    await listed(pool, membership, member("w1"), member("w2"))
    busy(pool, "w2", 3)
    assert pick(pool) == "w1"
    pool.mark_failed(pool._workers["w1"])
    assert pick(pool) == "w2"
    await listed(pool, membership, member("w1"), member("w2"))
    assert pick(pool) == "w2"
    clock.advance(FAILED_WORKER_QUARANTINE)
    await pool.refresh()
    assert pick(pool) == "w2"  # exactly the quarantine: still out
    clock.advance(0.001)
    await pool.refresh()
    assert pick(pool) == "w1"


async def test_a_quarantined_sticky_worker_loses_its_session(
    pool: WorkerPool, membership: FakeMembership
) -> None:
    await listed(pool, membership, member("w1"), member("w2"))
    w1 = busy(pool, "w1", 1, session_id="s1")
    pool.release(w1)
    pool.mark_failed(w1)
    assert pick(pool, "s1") == "w2"


async def test_the_only_worker_quarantined_leaves_no_candidate(
    pool: WorkerPool, membership: FakeMembership
) -> None:
    await listed(pool, membership, member("w1"))
    pool.mark_failed(pool._workers["w1"])
    await pool.refresh()
    assert pick(pool) is None
    assert not pool.has_agent("demo")


# --- channels --------------------------------------------------------------------


async def test_one_channel_per_address_reused_across_refreshes(
    pool: WorkerPool, membership: FakeMembership, channels: Channels
) -> None:
    await listed(pool, membership, member("w1"), member("w2"))
    await listed(pool, membership, member("w1"), member("w2"))
    assert sorted(c.address for c in channels.opened) == [
        "w1.local:50052",
        "w2.local:50052",
    ]


async def test_the_channel_of_a_worker_that_left_is_closed_once_idle(
    pool: WorkerPool, membership: FakeMembership, channels: Channels
) -> None:
    await listed(pool, membership, member("w1"), member("w2"))
    w1 = busy(pool, "w1", 1)
    await listed(pool, membership, member("w2"))
    assert channels.closed() == []  # a turn of ours still runs on w1
    pool.release(w1)
    await pool.refresh()
    assert channels.closed() == ["w1.local:50052"]
    # A worker that comes back at that address gets a new channel.
    await listed(pool, membership, member("w1"), member("w2"))
    assert [c.address for c in channels.opened].count("w1.local:50052") == 2


async def test_a_quarantined_but_listed_worker_keeps_its_channel(
    pool: WorkerPool, membership: FakeMembership, channels: Channels
) -> None:
    await listed(pool, membership, member("w1"))
    pool.mark_failed(pool._workers["w1"])
    await pool.refresh()
    assert channels.closed() == []


async def test_stop_closes_every_channel(
    pool: WorkerPool, membership: FakeMembership, channels: Channels
) -> None:
    await listed(pool, membership, member("w1"), member("w2"))
    await pool.stop()
    assert sorted(channels.closed()) == ["w1.local:50052", "w2.local:50052"]


async def test_a_stopped_pool_opens_no_relay(pool: WorkerPool, membership: FakeMembership) -> None:
    await listed(pool, membership, member("w1"))
    worker = pool._workers["w1"]
    await pool.stop()
    # A turn still running (or retried) while the server stops streams on its own call.
    assert pool.relay(worker) is None
    assert not pool._relays
