"""SessionCore: the owner's side of sessions and turns, on MemoryStore with a
fake worker pool and the fake runner (no worker is ever called)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from google.protobuf import struct_pb2

from tests.unit._server_fakes import FakeClock, FakeRunner, fake_time_module, spin, spin_until
from turnmesh.runtime.errors import (
    AlreadyExists,
    IdempotencyKeyReused,
    NoLiveWorker,
    NotFound,
    NotWaiting,
    ResourceExhausted,
    Unavailable,
)
from turnmesh.server.config import SessionLimits
from turnmesh.server.sessions import eventlog
from turnmesh.server.sessions.admission import admit
from turnmesh.server.sessions.core import SessionCore
from turnmesh.server.sessions.eventlog import EventLogs, TurnLog
from turnmesh.server.sessions.turns import CancelReason, PendingTurn, SessionTurns
from turnmesh.server.stores.base import SessionRecord, now
from turnmesh.server.stores.memory import MemoryStore
from turnmesh.server.stores.sqlite import SqliteStore
from turnmesh.server.webhooks.outbox import MemoryOutbox
from turnmesh.server.webhooks.sender import WebhookSender
from turnmesh.server.webhooks.settings import WebhookSettings
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb

ET = event_pb2.EventType


class FakePool:
    def __init__(self, *agents: str) -> None:
        self.agents = set(agents)
        # Agents whose workers were listed once, live or not.
        self.seen = set(agents)
        self.on_refresh: set[str] = set()
        self.refreshes = 0
        self.forgotten: list[str] = []

    def has_agent(self, agent_name: str) -> bool:
        return agent_name in self.agents

    def knows_agent(self, agent_name: str) -> bool:
        return agent_name in self.seen

    async def refresh(self) -> None:
        self.refreshes += 1
        self.agents |= self.on_refresh
        self.seen |= self.on_refresh

    def forget_session(self, session_id: str) -> None:
        self.forgotten.append(session_id)


@pytest.fixture
def pool() -> FakePool:
    return FakePool("demo")


@pytest.fixture
def runner() -> FakeRunner:
    return FakeRunner()


@pytest.fixture
async def core(pool: FakePool, runner: FakeRunner) -> AsyncIterator[SessionCore]:
    c = SessionCore(MemoryStore(), pool, "demo", SessionLimits(session_ttl_seconds=100))  # type: ignore[arg-type]
    c.runner = runner  # type: ignore[assignment]
    yield c
    for turns in c._turns.values():
        turns.cancel_all(CancelReason.SHUTDOWN)
        await turns.wait_idle()


async def start(
    core: SessionCore, request: spb.TurnRequest, session_id: str = "", *, background: bool = False
) -> TurnLog:
    """The turn placed as the service places it: its admission first."""
    admission = await admit(request, session_id or request.session_id, background=background)
    return await core.start_turn(admission)


def request(
    message: str = "hi",
    *,
    session_id: str = "s1",
    policy: spb.TurnPolicy.ValueType = spb.TURN_POLICY_ENQUEUE,
    key: str = "",
) -> spb.TurnRequest:
    return spb.TurnRequest(
        session_id=session_id, message=message, policy=policy, idempotency_key=key
    )


def turn_of(core: SessionCore, tlog: TurnLog) -> PendingTurn:
    return core._turns[tlog.session_id]._turns[tlog.turn_id]


async def outcome(tlog: TurnLog) -> tuple[list[int], str]:
    events = [e async for e in tlog.follow()]
    return [e.type for e in events], events[-1].code


class Follower:
    """A caller's stream: follows the log through core.follow in its own task."""

    def __init__(self, core: SessionCore, tlog: TurnLog, *, cancel_on_disconnect: bool) -> None:
        self.events: list[event_pb2.Event] = []
        self.task = asyncio.create_task(self._run(core, tlog, cancel_on_disconnect))

    async def _run(self, core: SessionCore, tlog: TurnLog, cancel: bool) -> None:
        async for event in core.follow(tlog, 0, cancel):
            self.events.append(event)

    async def disconnect(self) -> None:
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


# --- sessions --------------------------------------------------------------------


async def test_create_session_binds_the_default_agent(core: SessionCore) -> None:
    session = await core.create_session("", "", struct_pb2.Struct())
    assert session.agent_name == "demo"
    assert len(session.session_id) == 26  # a ULID
    assert not session.turn_running


async def test_create_session_for_an_unknown_agent_refreshes_then_raises(
    core: SessionCore, pool: FakePool
) -> None:
    with pytest.raises(NotFound):
        await core.create_session("s1", "nope", struct_pb2.Struct())
    assert pool.refreshes == 1
    pool.on_refresh = {"late"}
    assert (await core.create_session("s1", "late", struct_pb2.Struct())).agent_name == "late"


async def test_a_known_agent_without_a_live_worker_is_unavailable_not_unknown(
    core: SessionCore, pool: FakePool
) -> None:
    await core.create_session("s1", "demo", struct_pb2.Struct())
    pool.agents.clear()  # demo's workers are gone; it is the default agent
    with pytest.raises(NoLiveWorker) as new_session:
        await core.create_session("s2", "", struct_pb2.Struct())
    assert new_session.value.retry_after == 5
    with pytest.raises(NoLiveWorker):
        await start(core, request())  # a turn of s1
    pool.seen.add("other")  # listed once, gone now
    with pytest.raises(NoLiveWorker):
        await core.create_session("s3", "other", struct_pb2.Struct())
    with pytest.raises(NotFound):
        await core.create_session("s4", "never", struct_pb2.Struct())


async def test_session_proto_shows_the_running_turn(core: SessionCore, runner: FakeRunner) -> None:
    await core.create_session("s1", "demo", struct_pb2.Struct())
    tlog = await start(core, request())
    await spin_until(lambda: tlog.last_seq >= 1)
    session = await core.get_session("s1")
    assert session.turn_running
    assert session.running_turn_id == tlog.turn_id
    runner.finish(turn_of(core, tlog))
    await core._turns["s1"].wait_idle()
    assert not (await core.get_session("s1")).turn_running


async def test_delete_session_cancels_its_turns_and_forgets_everything(
    core: SessionCore, pool: FakePool
) -> None:
    await core.create_session("s1", "demo", struct_pb2.Struct())
    running = await start(core, request("one"))
    queued = await start(core, request("two"))
    await spin_until(lambda: running.last_seq >= 1)
    assert await core.delete_session("s1") is True
    assert (await outcome(running))[1] == "session_deleted"
    assert (await outcome(queued))[1] == "session_deleted"
    assert pool.forgotten == ["s1"]
    with pytest.raises(NotFound):
        core.logs.get("s1", running.turn_id)
    assert await core.delete_session("s1") is False


async def test_expire_idle_skips_sessions_with_turns(core: SessionCore, runner: FakeRunner) -> None:
    old = now() - 1000
    for sid in ("idle", "busy", "fresh"):
        await core.store.create(SessionRecord(sid, "demo", old, old))
    await core.store.touch("fresh", now())
    tlog = await start(core, request(session_id="busy"))
    await core.store.touch("busy", old)
    assert await core.expire_idle() == ["idle"]
    assert await core.store.get("idle") is None
    assert await core.store.get("busy") is not None
    runner.finish(turn_of(core, tlog))
    await core._turns["busy"].wait_idle()
    assert await core.expire_idle() == ["busy"]


async def test_a_session_is_idle_only_a_ttl_after_its_pause_ends(core: SessionCore) -> None:
    """Waiting is not idleness: a session stays while its pause waits, and
    the TTL (100 s here) runs from the pause's end, so a late answer is told
    the pause expired instead of finding no session."""
    old = now() - 1000

    def paused(ended_ago: float, cancelled: bool = False) -> bytes:
        pause = message_pb2.Pause(turn_id="t1", cancelled=cancelled)
        pause.expire_time.FromNanoseconds(int((now() - ended_ago) * 1e9))
        return pause.SerializeToString()

    records = {
        "waiting": paused(-3600),  # expires in an hour
        "just-expired": paused(10),
        "long-expired": paused(200),
        "cancelled": paused(-3600, cancelled=True),  # the cancel was its last activity
    }
    for sid, pause in records.items():
        await core.store.create(SessionRecord(sid, "demo", old, old, pause=pause))
    assert sorted(await core.expire_idle()) == ["cancelled", "long-expired"]
    session = await core.get_session("just-expired")
    assert session.expire_time.ToSeconds() == pytest.approx(now() - 10 + 100, abs=2)


# --- start_turn ------------------------------------------------------------------


async def test_start_turn_on_an_unknown_session_raises_not_found(core: SessionCore) -> None:
    with pytest.raises(NotFound):
        await start(core, request(session_id="nope"))


async def test_start_turn_while_draining_is_unavailable(core: SessionCore) -> None:
    await core.create_session("s1", "demo", struct_pb2.Struct())
    core.draining = True
    with pytest.raises(Unavailable):
        await start(core, request())


async def test_start_turn_without_a_worker_for_the_agent_is_unavailable(
    core: SessionCore, pool: FakePool
) -> None:
    await core.create_session("s1", "demo", struct_pb2.Struct())
    pool.agents.clear()
    with pytest.raises(Unavailable):
        await start(core, request())
    assert pool.refreshes == 1
    assert not core._turns["s1"].busy


async def test_start_turn_touches_the_session(core: SessionCore, runner: FakeRunner) -> None:
    await core.create_session("s1", "demo", struct_pb2.Struct())
    await core.store.touch("s1", 5.0)
    tlog = await start(core, request())
    record = await core.store.get("s1")
    assert record is not None and record.last_activity > 5.0
    runner.finish(turn_of(core, tlog))


async def test_a_retried_idempotency_key_returns_the_same_log(
    core: SessionCore, runner: FakeRunner
) -> None:
    await core.create_session("s1", "demo", struct_pb2.Struct())
    first = await start(core, request("one", key="k"))
    again = await start(core, request("one", key="k"))
    assert again is first
    other = await start(core, request("two", key="k2"))
    assert other is not first
    runner.finish(turn_of(core, first))
    runner.finish(turn_of(core, other))
    await core._turns["s1"].wait_idle()
    # Still the same turn after it ended, while its log is kept.
    assert await start(core, request("one", key="k")) is first


class KeyedStore(MemoryStore):
    """Keeps idempotency keys, as the durable stores do."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: dict[tuple[str, str], str] = {}

    async def get_key(self, session_id: str, key: str) -> str | None:
        return self.keys.get((session_id, key))

    async def set_key(self, session_id: str, key: str, turn_id: str) -> None:
        self.keys[(session_id, key)] = turn_id


async def test_a_key_reused_with_another_request_is_refused(
    pool: FakePool, runner: FakeRunner
) -> None:
    core = SessionCore(KeyedStore(), pool, "demo", SessionLimits())  # type: ignore[arg-type]
    core.runner = runner  # type: ignore[assignment]
    await core.create_session("s1", "demo", struct_pb2.Struct())
    first = await start(core, request("one", key="k"))
    with pytest.raises(IdempotencyKeyReused, match="different request") as refused:
        await start(core, request("one, changed", key="k"))
    assert refused.value.retry_after is None  # never retryable as it is
    runner.finish(turn_of(core, first))
    await core._turns["s1"].wait_idle()
    # Also once the turn ended, and from the store alone (another server).
    with pytest.raises(IdempotencyKeyReused):
        await start(core, request("one, changed", key="k"))
    core._turns.pop("s1")
    stored = await core.store.get_key("s1", "k")
    assert stored is not None and stored.startswith(first.turn_id + " ")
    with pytest.raises(IdempotencyKeyReused):
        await start(core, request("one, changed", key="k"))
    # A key stored by an older server (no digest) is taken as the same request.
    await core.store.set_key("s1", "old", first.turn_id)
    assert (await start(core, request("anything", key="old"))).turn_id == first.turn_id
    for turns in core._turns.values():
        turns.cancel_all(CancelReason.SHUTDOWN)
        await turns.wait_idle()


async def test_a_retried_key_whose_log_expired_runs_a_new_turn(
    core: SessionCore, runner: FakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(eventlog, "time", fake_time_module(clock))
    await core.create_session("s1", "demo", struct_pb2.Struct())
    first = await start(core, request(key="k"))
    runner.finish(turn_of(core, first))
    await core._turns["s1"].wait_idle()
    clock.advance(core.limits.event_log_ttl_seconds + 1)
    again = await start(core, request(key="k"))
    assert again is not first
    runner.finish(turn_of(core, again))


async def test_a_retried_key_whose_events_the_budget_dropped_is_not_run_again(
    pool: FakePool, runner: FakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within its window a finished turn never runs twice, even when the
    server's event-log budget dropped its events early; a failed one may."""
    clock = FakeClock()
    monkeypatch.setattr(eventlog, "time", fake_time_module(clock))
    limits = SessionLimits(event_log_max_bytes=1)  # every finished log goes at once
    core = SessionCore(MemoryStore(), pool, "demo", limits)  # type: ignore[arg-type]
    core.runner = runner  # type: ignore[assignment]
    await core.create_session("s1", "demo", struct_pb2.Struct())
    first = await start(core, request(key="k"))
    runner.finish(turn_of(core, first))
    await core._turns["s1"].wait_idle()
    with pytest.raises(AlreadyExists, match="finished") as refused:
        await start(core, request(key="k"))
    assert refused.value.reason == "TURN_ALREADY_FINISHED"
    clock.advance(limits.event_log_ttl_seconds + 1)  # past the window: as before
    core.logs.sweep()
    again = await start(core, request(key="k"))
    assert again.turn_id != first.turn_id
    runner.finish(turn_of(core, again))
    await core._turns["s1"].wait_idle()
    failed = await start(core, request(key="f"))
    await spin_until(lambda: failed.last_seq >= 1)
    await core.cancel_turn("s1", failed.turn_id)
    await core._turns["s1"].wait_idle()
    retried = await start(core, request(key="f"))  # it changed nothing: runs again
    assert retried.turn_id != failed.turn_id
    runner.finish(turn_of(core, retried))
    await core._turns["s1"].wait_idle()


# --- cancel_turn ---------------------------------------------------------------------


async def test_cancel_turn(core: SessionCore) -> None:
    await core.create_session("s1", "demo", struct_pb2.Struct())
    tlog = await start(core, request())
    await spin_until(lambda: tlog.last_seq >= 1)
    assert await core.cancel_turn("s1", tlog.turn_id) == spb.TURN_STATE_CANCELLED
    assert await outcome(tlog) == ([ET.RUN_STARTED, ET.RUN_ERROR], "cancelled")


async def test_cancel_turn_of_an_ended_turn_returns_its_state(
    core: SessionCore, runner: FakeRunner
) -> None:
    await core.create_session("s1", "demo", struct_pb2.Struct())
    tlog = await start(core, request())
    runner.finish(turn_of(core, tlog))
    await core._turns["s1"].wait_idle()
    assert await core.cancel_turn("s1", tlog.turn_id) == spb.TURN_STATE_FINISHED


async def test_cancel_turn_of_an_unknown_turn_raises_not_found(core: SessionCore) -> None:
    with pytest.raises(NotFound):
        await core.cancel_turn("s1", "nope")


# --- follow and disconnects ------------------------------------------------------------


async def test_a_follower_that_asked_to_cancel_cancels_on_disconnect(core: SessionCore) -> None:
    await core.create_session("s1", "demo", struct_pb2.Struct())
    tlog = await start(core, request())
    follower = Follower(core, tlog, cancel_on_disconnect=True)
    await spin_until(lambda: len(follower.events) == 1)
    await spin()
    await follower.disconnect()
    assert await outcome(tlog) == ([ET.RUN_STARTED, ET.RUN_ERROR], "disconnected")


async def test_a_follower_that_did_not_ask_to_cancel_leaves_the_turn_running(
    core: SessionCore, runner: FakeRunner
) -> None:
    await core.create_session("s1", "demo", struct_pb2.Struct())
    tlog = await start(core, request())
    follower = Follower(core, tlog, cancel_on_disconnect=False)
    await spin_until(lambda: len(follower.events) == 1)
    await spin()
    await follower.disconnect()
    await spin()
    assert not tlog.done
    runner.finish(turn_of(core, tlog))
    assert (await outcome(tlog))[0][-1] == ET.RUN_FINISHED


async def test_a_follower_that_read_to_the_end_cancels_nothing(
    core: SessionCore, runner: FakeRunner
) -> None:
    await core.create_session("s1", "demo", struct_pb2.Struct())
    tlog = await start(core, request())
    runner.finish(turn_of(core, tlog))
    seen = [e.type async for e in core.follow(tlog, 0, True)]
    assert seen == [ET.RUN_STARTED, ET.RUN_FINISHED]


async def test_a_follower_closed_between_events_cancels_on_disconnect(
    core: SessionCore, runner: FakeRunner
) -> None:
    await core.create_session("s1", "demo", struct_pb2.Struct())
    tlog = await start(core, request())
    await spin_until(lambda: tlog.last_seq >= 1)
    stream = core.follow(tlog, 0, True)
    assert (await anext(stream)).type == ET.RUN_STARTED
    await stream.aclose()  # what finalizing the servicer's generator does
    await spin()
    assert tlog.done  # (the fixture's teardown cancels the turn otherwise)
    assert (await outcome(tlog))[1] == "disconnected"


async def test_a_retry_with_the_same_key_keeps_the_turn_alive_when_the_first_stream_drops(
    core: SessionCore, runner: FakeRunner
) -> None:
    await core.create_session("s1", "demo", struct_pb2.Struct())
    first_log = await start(core, request(key="k"))
    first = Follower(core, first_log, cancel_on_disconnect=True)
    await spin_until(lambda: len(first.events) == 1)
    # The client lost its stream and retried before the server noticed.
    retry_log = await start(core, request(key="k"))
    assert retry_log is first_log
    retry = Follower(core, retry_log, cancel_on_disconnect=True)
    await spin_until(lambda: len(retry.events) == 1)
    await first.disconnect()  # now the server notices the first stream is gone
    await spin()
    assert not first_log.done
    runner.finish(turn_of(core, first_log))
    await retry.task
    assert retry.events[-1].type == ET.RUN_FINISHED


# --- drain -----------------------------------------------------------------------


async def test_drain_waits_for_turns_to_finish(core: SessionCore, runner: FakeRunner) -> None:
    await core.create_session("s1", "demo", struct_pb2.Struct())
    tlog = await start(core, request())
    await spin_until(lambda: tlog.last_seq >= 1)

    async def finish_soon() -> None:
        await spin()
        runner.finish(turn_of(core, tlog))

    helper = asyncio.create_task(finish_soon())
    await core.drain(timeout=60)
    await helper
    assert core.draining
    assert (await outcome(tlog))[0][-1] == ET.RUN_FINISHED


async def test_drain_cancels_what_is_left_after_the_timeout(core: SessionCore) -> None:
    await core.create_session("s1", "demo", struct_pb2.Struct())
    running = await start(core, request("one"))
    queued = await start(core, request("two"))
    await spin_until(lambda: running.last_seq >= 1)
    await core.drain(timeout=0)
    assert (await outcome(running))[1] == "shutdown"
    assert (await outcome(queued))[1] == "shutdown"
    assert not core._turns["s1"].busy


async def test_a_server_stops_before_it_starts_and_starts_once() -> None:
    from turnmesh.server import ServerConfig, SessionServer

    never = SessionServer(ServerConfig(router_address="127.0.0.1:1"))
    await never.stop()
    await never.stop()  # idempotent
    assert never.state == spb.LIFECYCLE_STATE_STOPPED
    with pytest.raises(RuntimeError, match="starts once"):
        await never.start()


# The sweep of turns lost with their server --------------------------------------


async def test_the_sweep_reaches_every_lost_turn_past_unreadable_and_running_ones(
    core: SessionCore, runner: FakeRunner
) -> None:
    """Records that stay open (a turn running here, a record that does not
    parse) fill the first pages; the sweep goes on past them, a page at a
    time, and settles every lost turn behind them."""
    await core.create_session("s1", "demo", struct_pb2.Struct())
    running = await start(core, request(), "s1", background=True)
    await spin_until(lambda: running.turn_id in runner.started)
    store = core.store
    assert await store.put_turn("s1", "garbled", b"\xff\xff\xff", ended=False, ttl_seconds=600)
    lost = [f"lost{n}" for n in range(5)]
    for turn_id in lost:
        record = spb.Turn(turn_id=turn_id, session_id="s1", state=spb.TURN_STATE_RUNNING)
        await store.put_turn(
            "s1", turn_id, record.SerializeToString(), ended=False, ttl_seconds=600
        )
    # Pages of two, one page a sweep: the first page holds the running turn
    # and the record that does not parse, and settles nothing; each next one
    # settles what it holds, and none is skipped as the settled ones leave.
    assert await core.recorded.settle_open(limit=2, pages=1) == 0
    assert [await core.recorded.settle_open(limit=2, pages=1) for _ in range(3)] == [2, 2, 1]
    for turn_id in lost:
        turn = await core.get_turn("s1", turn_id)
        assert (turn.state, turn.error_code) == (spb.TURN_STATE_FAILED, "owner_lost")
    # The running turn is left to its owner; the unreadable record is no turn.
    assert (await core.get_turn("s1", running.turn_id)).state == spb.TURN_STATE_RUNNING
    with pytest.raises(NotFound):
        await core.get_turn("s1", "garbled")
    runner.finish(turn_of(core, running))
    await core._turns["s1"].wait_idle()


async def test_one_sweep_goes_on_past_pages_it_settled_whole(core: SessionCore) -> None:
    await core.create_session("s1", "demo", struct_pb2.Struct())
    lost = [f"lost{n}" for n in range(7)]
    for turn_id in lost:
        record = spb.Turn(turn_id=turn_id, session_id="s1", state=spb.TURN_STATE_RUNNING)
        await core.store.put_turn(
            "s1", turn_id, record.SerializeToString(), ended=False, ttl_seconds=600
        )
    # The first page is settled whole (its records leave the open ones):
    # that is not the end.
    assert await core.recorded.settle_open(limit=2, pages=10) == len(lost)
    assert await core.recorded.settle_open(limit=2, pages=10) == 0


async def test_a_lost_turn_a_subscriber_found_is_still_settled_by_the_sweep(
    tmp_path: Path,
) -> None:
    """SubscribeTurn ends a lost turn's restored log with owner_lost; the
    record and its notice are the sweep's to write, with nobody asking."""
    store = SqliteStore(str(tmp_path / "s.db"), 600)
    await store.create(SessionRecord("s1", "demo", 1.0, 1.0))
    record = spb.Turn(
        turn_id="t1",
        session_id="s1",
        background=True,
        state=spb.TURN_STATE_RUNNING,
        webhook_url="http://127.0.0.1:9/hook",
    )
    await store.put_turn("s1", "t1", record.SerializeToString(), ended=False, ttl_seconds=600)
    started = event_pb2.Event(type=ET.RUN_STARTED, seq=1, run_id="t1")
    await store.append_events("s1", "t1", [started])
    secret = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
    hooks = WebhookSender(
        WebhookSettings(allow=("http://127.0.0.1:9",), secret=secret), store.outbox()
    )
    core = SessionCore(store, FakePool("demo"), "demo", SessionLimits(), webhooks=hooks)  # type: ignore[arg-type]
    try:
        events = [e async for e in await core.subscribe("s1", "t1", 0)]
        assert events[-1].code == "owner_lost"
        assert await core.recorded.settle_open() == 1
        stored = spb.Turn.FromString(await store.get_turn("s1", "t1") or b"")
        assert (stored.state, stored.error_code) == (spb.TURN_STATE_FAILED, "owner_lost")
        assert await store.outbox().next_due() is not None  # its notice waits
    finally:
        await hooks.stop()
        await store.close()


async def test_a_message_with_another_webhook_does_not_join_the_batch(
    pool: FakePool, runner: FakeRunner
) -> None:
    """COLLECT joins a queued batch only when the batch's notice goes where
    the message wants it: one that names another URL is a turn of its own,
    so every caller is told."""
    secret = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
    hooks = WebhookSender(
        WebhookSettings(allow=("http://127.0.0.1:9/",), secret=secret), MemoryOutbox()
    )
    core = SessionCore(MemoryStore(), pool, "demo", SessionLimits(), webhooks=hooks)  # type: ignore[arg-type]
    core.runner = runner  # type: ignore[assignment]
    await core.create_session("s1", "demo", struct_pb2.Struct())

    def collect(message: str, url: str = "") -> spb.TurnRequest:
        sent = request(message, policy=spb.TURN_POLICY_COLLECT)
        sent.webhook_url = url
        return sent

    running = await start(core, request("first"))
    await spin_until(lambda: running.turn_id in runner.started)
    alice = await start(core, collect("a", "http://127.0.0.1:9/alice"))
    bob = await start(core, collect("b", "http://127.0.0.1:9/bob"))
    assert bob.turn_id != alice.turn_id
    assert (alice.webhook, bob.webhook) == ("http://127.0.0.1:9/alice", "http://127.0.0.1:9/bob")
    # The same URL, or none, joins the newest batch.
    assert (await start(core, collect("b2", "http://127.0.0.1:9/bob"))).turn_id == bob.turn_id
    assert (await start(core, collect("plain"))).turn_id == bob.turn_id
    for turns in core._turns.values():
        turns.cancel_all(CancelReason.SHUTDOWN)
        await turns.wait_idle()
    await hooks.stop()


class SlowReads(MemoryStore):
    """A store whose next ``get`` waits until the test lets it answer."""

    def __init__(self) -> None:
        super().__init__()
        self.hold: asyncio.Event | None = None
        self.reading = asyncio.Event()

    async def get(self, session_id: str) -> SessionRecord | None:
        record = await super().get(session_id)  # read now, answered later
        if (hold := self.hold) is not None:
            self.hold = None
            self.reading.set()
            await hold.wait()
        return record


async def _waiting_on_c1(pool: FakePool, runner: FakeRunner) -> tuple[SlowReads, SessionCore]:
    """A session s1 whose stored pause waits for call c1's result."""
    store = SlowReads()
    core = SessionCore(store, pool, "demo", SessionLimits())  # type: ignore[arg-type]
    core.runner = runner  # type: ignore[assignment]
    pause = message_pb2.Pause(turn_id="t0")
    pause.tool_calls.add(id="c1", function=message_pb2.FunctionCall(name="get_weather"))
    pause.expire_time.FromNanoseconds(int((now() + 3600) * 1e9))
    await store.create(SessionRecord("s1", "demo", now(), now(), pause=pause.SerializeToString()))
    return store, core


def answer() -> spb.TurnRequest:
    """c1's result."""
    sent = request("")
    sent.tool_results.add(tool_call_id="c1", content="sunny")
    return sent


async def test_answers_read_against_a_pause_answered_meanwhile_are_refused(
    pool: FakePool, runner: FakeRunner
) -> None:
    """A pause answered here while a second answer's record was being read:
    the record is older than what this server knows, so the second answer
    is refused (not taken twice)."""
    store, core = await _waiting_on_c1(pool, runner)

    first = await start(core, answer())
    gate = store.hold = asyncio.Event()
    second = asyncio.create_task(start(core, answer()))
    await store.reading.wait()  # its record, with the pause, is read
    runner.finish(turn_of(core, first))
    await core._turns["s1"].wait_idle()  # the first answer committed here
    gate.set()
    with pytest.raises(NotWaiting):
        await second


async def test_a_record_read_before_this_server_knew_the_session_is_not_newer(
    pool: FakePool, runner: FakeRunner
) -> None:
    """The same race on a session no turn here had touched yet (a restart,
    a takeover): the slow read's pause is still older than the commit."""
    store, core = await _waiting_on_c1(pool, runner)

    gate = store.hold = asyncio.Event()
    slow = asyncio.create_task(start(core, answer()))
    await store.reading.wait()
    first = await start(core, answer())  # read after, run and committed first
    runner.finish(turn_of(core, first))
    await core._turns["s1"].wait_idle()
    gate.set()
    with pytest.raises(NotWaiting):
        await slow


def test_a_pause_read_back_keeps_the_checkpoint_this_server_committed() -> None:
    """The store keeps the agent's checkpoint apart from the pause: reading
    the pause back does not lose the one cached here (no store read when
    the answer runs)."""
    logs = EventLogs(max_events=10, max_turns_per_session=4, ttl_seconds=60)
    turns = SessionTurns("s1", "demo", FakeRunner(), logs)
    committed = message_pb2.Pause(turn_id="t1", agent_checkpoint=b"graph")
    turns.pause = committed
    stored = message_pb2.Pause(turn_id="t1").SerializeToString()
    turns.sync_pause(stored)
    assert turns.pause.agent_checkpoint == b"graph"
    turns.sync_pause(message_pb2.Pause(turn_id="t2").SerializeToString())  # another pause
    assert turns.pause.agent_checkpoint == b""


async def test_the_sweep_goes_past_lost_turns_whose_notice_cannot_be_queued(
    pool: FakePool,
) -> None:
    """A lost turn whose webhook's outbox fails stays open (its notice must
    not be lost); it does not count as settled, so the sweep's next page is
    not pulled back onto it and the turns behind it are settled."""
    from turnmesh.server.stores.redis_client import connect
    from turnmesh.server.stores.redis_outbox import RedisOutbox

    secret = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
    failing = RedisOutbox(connect("redis://127.0.0.1:9/0"))  # nothing listens there
    hooks = WebhookSender(WebhookSettings(allow=("http://127.0.0.1:9/",), secret=secret), failing)
    core = SessionCore(MemoryStore(), pool, "demo", SessionLimits(), webhooks=hooks)  # type: ignore[arg-type]
    await core.create_session("s1", "demo", struct_pb2.Struct())
    for n in range(3):
        hooked = spb.Turn(
            turn_id=f"hooked{n}",
            session_id="s1",
            state=spb.TURN_STATE_RUNNING,
            webhook_url="http://127.0.0.1:9/hook",
        )
        await core.store.put_turn(
            "s1", hooked.turn_id, hooked.SerializeToString(), ended=False, ttl_seconds=600
        )
    plain = spb.Turn(turn_id="plain", session_id="s1", state=spb.TURN_STATE_RUNNING)
    await core.store.put_turn(
        "s1", "plain", plain.SerializeToString(), ended=False, ttl_seconds=600
    )
    try:
        assert await core.recorded.settle_open(limit=1, pages=10) == 1
        assert (await core.get_turn("s1", "plain")).state == spb.TURN_STATE_FAILED
        still = await core.store.get_turn("s1", "hooked0")
        assert still is not None and spb.Turn.FromString(still).state == spb.TURN_STATE_RUNNING
    finally:
        await hooks.stop()


class SlowKeys(MemoryStore):
    """A store whose idempotency-key reads wait for the test."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.reading = 0

    async def get_key(self, session_id: str, key: str) -> str | None:
        self.reading += 1
        await self.gate.wait()
        return await super().get_key(session_id, key)


@pytest.mark.parametrize(
    "limits",
    [
        SessionLimits(max_turns_per_principal=1),
        SessionLimits(max_pending_bytes_per_session=3),
        SessionLimits(max_pending_bytes_per_principal=3),
    ],
)
async def test_a_retry_that_arrives_with_its_first_try_counts_against_the_limits(
    pool: FakePool, runner: FakeRunner, limits: SessionLimits
) -> None:
    """Two tries with one key read the store together; the first places the
    turn. The second, at a limit, is refused (429) rather than joined."""
    store = SlowKeys()
    core = SessionCore(store, pool, "demo", limits)  # type: ignore[arg-type]
    core.runner = runner  # type: ignore[assignment]
    await core.create_session("s1", "demo", struct_pb2.Struct())
    tries = [asyncio.create_task(start(core, request(key="k"))) for _ in range(2)]
    await spin_until(lambda: store.reading == 2)
    store.gate.set()
    first, second = await asyncio.gather(*tries, return_exceptions=True)
    assert isinstance(first, TurnLog)
    assert isinstance(second, ResourceExhausted)
    for turns in core._turns.values():
        turns.cancel_all(CancelReason.SHUTDOWN)
        await turns.wait_idle()
