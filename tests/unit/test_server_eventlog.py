"""TurnLog and EventLogs: seq stamping, replay + live follow, bounds, eviction."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tests.unit._server_fakes import FakeClock, fake_time_module, spin, spin_until
from turnmesh.runtime.errors import NotFound, OutOfRange
from turnmesh.server.sessions import eventlog
from turnmesh.server.sessions.eventlog import EventLogs, TurnLog
from turnmesh.v1 import event_pb2
from turnmesh.v1 import session_service_pb2 as spb

ET = event_pb2.EventType


def text(delta: str = "x") -> event_pb2.Event:
    return event_pb2.Event(type=ET.TEXT_MESSAGE_CONTENT, delta=delta)


def finished() -> event_pb2.Event:
    return event_pb2.Event(type=ET.RUN_FINISHED)


def failed() -> event_pb2.Event:
    return event_pb2.Event(type=ET.RUN_ERROR, code="boom")


def done(log: TurnLog) -> bool:
    """``log.done``, read afresh: mypy would carry an earlier assert's
    narrowing of the property past the append that changes it."""
    return log.done


async def collect(log: TurnLog, after_seq: int = 0) -> list[int]:
    return [e.seq async for e in log.follow(after_seq)]


class Reader:
    """Follows a log in its own task, recording every event it gets."""

    def __init__(self, log: TurnLog, after_seq: int = 0) -> None:
        self.events: list[event_pb2.Event] = []
        self.task = asyncio.create_task(self._run(log, after_seq))

    async def _run(self, log: TurnLog, after_seq: int) -> None:
        async for event in log.follow(after_seq):
            self.events.append(event)

    @property
    def seqs(self) -> list[int]:
        return [e.seq for e in self.events]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr(eventlog, "time", fake_time_module(c))
    return c


# --- TurnLog: stamping ----------------------------------------------------------


def test_new_log_is_queued_empty_and_not_done() -> None:
    log = TurnLog("s1", "t1", 10)
    assert log.state == spb.TURN_STATE_QUEUED
    assert log.last_seq == 0
    assert not log.done
    assert log.ended_at is None


def test_append_stamps_consecutive_seq_and_the_turn_ids() -> None:
    log = TurnLog("s1", "t1", 10)
    first = log.append(text("a"))
    second = log.append(event_pb2.Event(type=ET.CUSTOM, seq=42, thread_id="x", run_id="y"))
    assert (first.seq, second.seq) == (1, 2)
    # Whatever ids and seq the event carried, the log's own win.
    for event in (first, second):
        assert event.thread_id == "s1"
        assert event.run_id == "t1"
        assert event.timestamp > 0
    assert log.last_seq == 2


def test_append_keeps_a_timestamp_already_set() -> None:
    log = TurnLog("s1", "t1", 10)
    assert log.append(event_pb2.Event(type=ET.CUSTOM, timestamp=123.0)).timestamp == 123.0


def test_append_returns_the_same_event_object_it_stores() -> None:
    log = TurnLog("s1", "t1", 10)
    event = text()
    assert log.append(event) is event


@pytest.mark.parametrize("terminal", [finished, failed])
def test_terminal_event_ends_the_log(
    clock: FakeClock, terminal: Callable[[], event_pb2.Event]
) -> None:
    log = TurnLog("s1", "t1", 10)
    log.append(text())
    assert not log.done
    log.append(terminal())
    assert done(log)
    assert log.ended_at == clock.now


def test_append_after_the_end_is_refused() -> None:
    log = TurnLog("s1", "t1", 10)
    log.append(finished())
    with pytest.raises(RuntimeError):
        log.append(text())
    assert log.last_seq == 1


def test_set_state_is_independent_of_events() -> None:
    log = TurnLog("s1", "t1", 10)
    log.set_state(spb.TURN_STATE_RUNNING)
    assert log.state == spb.TURN_STATE_RUNNING
    assert not log.done


# --- TurnLog: follow -----------------------------------------------------------


async def test_follow_replays_then_follows_live_events() -> None:
    log = TurnLog("s1", "t1", 100)
    log.append(event_pb2.Event(type=ET.RUN_STARTED))
    log.append(text("a"))
    reader = Reader(log)
    await spin_until(lambda: reader.seqs == [1, 2])
    await spin()  # the reader is now waiting for more
    assert not reader.task.done()

    async def writer() -> None:
        log.append(text("b"))
        log.append(text("c"))

    await asyncio.create_task(writer())
    await spin_until(lambda: reader.seqs == [1, 2, 3, 4])
    assert not reader.task.done()
    log.append(finished())
    await reader.task
    assert reader.seqs == [1, 2, 3, 4, 5]
    assert [e.delta for e in reader.events[1:4]] == ["a", "b", "c"]


async def test_each_live_event_reaches_a_waiting_reader_on_its_own() -> None:
    log = TurnLog("s1", "t1", 100)
    reader = Reader(log)
    for expected in range(1, 4):
        await spin()
        log.append(text(str(expected)))

        def caught_up(n: int = expected) -> bool:
            return reader.seqs == list(range(1, n + 1))

        await spin_until(caught_up)
    log.append(finished())
    await reader.task


@pytest.mark.parametrize(
    ("after_seq", "expected"),
    [(0, [1, 2, 3, 4, 5]), (1, [2, 3, 4, 5]), (3, [4, 5]), (4, [5]), (5, [])],
)
async def test_follow_after_seq_skips_exactly_that_many(
    after_seq: int, expected: list[int]
) -> None:
    log = TurnLog("s1", "t1", 100)
    for _ in range(4):
        log.append(text())
    log.append(finished())
    assert await collect(log, after_seq) == expected


async def test_follow_after_seq_beyond_the_end_of_a_running_log_waits_for_new_events() -> None:
    log = TurnLog("s1", "t1", 100)
    log.append(text())
    log.append(text())
    reader = Reader(log, after_seq=2)
    await spin()
    assert reader.seqs == []
    log.append(finished())
    await reader.task
    assert reader.seqs == [3]


async def test_reader_started_before_the_terminal_event_stops_after_it() -> None:
    log = TurnLog("s1", "t1", 100)
    reader = Reader(log)
    await spin()
    log.append(event_pb2.Event(type=ET.RUN_STARTED))
    log.append(text())
    log.append(failed())
    await reader.task
    assert reader.seqs == [1, 2, 3]
    assert reader.events[-1].type == ET.RUN_ERROR


async def test_every_reader_gets_the_same_events() -> None:
    log = TurnLog("s1", "t1", 100)
    log.append(text("early"))
    readers = [Reader(log) for _ in range(3)]
    await spin()
    log.append(text("late"))
    log.append(finished())
    late = Reader(log)
    await asyncio.gather(*(r.task for r in [*readers, late]))
    for reader in [*readers, late]:
        assert reader.seqs == [1, 2, 3]
        assert reader.events[0] is readers[0].events[0]


async def test_follow_of_an_ended_log_returns_at_once() -> None:
    log = TurnLog("s1", "t1", 100)
    log.append(finished())
    assert await collect(log) == [1]
    assert await collect(log, 1) == []


# --- TurnLog: keepalives -------------------------------------------------------
# keepalive_seconds=0 makes every wait time out at once: deterministic, no clock.


async def test_no_keepalives_unless_asked() -> None:
    log = TurnLog("s1", "t1", 100)
    log.append(event_pb2.Event(type=ET.RUN_STARTED))
    reader = Reader(log)
    await spin()
    assert reader.seqs == [1]
    log.append(finished())
    await reader.task


async def test_a_silent_started_turn_yields_keepalives_outside_the_log() -> None:
    log = TurnLog("s1", "t1", 100)
    log.append(event_pb2.Event(type=ET.RUN_STARTED))
    stream = log.follow(0, keepalive_seconds=0)
    assert (await anext(stream)).seq == 1
    for _ in range(3):
        keepalive = await anext(stream)
        assert keepalive.type == ET.CUSTOM
        assert keepalive.name == "keepalive"
        assert keepalive.seq == 0
        assert (keepalive.thread_id, keepalive.run_id) == ("s1", "t1")
        assert keepalive.timestamp > 0
        assert keepalive.value.HasField("struct_value")
    assert log.last_seq == 1  # keepalives are not logged
    log.append(text("live"))
    log.append(finished())
    rest = [e async for e in stream]
    assert [e.seq for e in rest if e.seq] == [2, 3]
    assert rest[-1].type == ET.RUN_FINISHED


async def test_no_keepalive_before_the_turn_started() -> None:
    # Nothing may come before RUN_STARTED: a queued turn's stream stays silent.
    log = TurnLog("s1", "t1", 100)
    seen: list[event_pb2.Event] = []

    async def read() -> None:
        async for event in log.follow(0, keepalive_seconds=0):
            seen.append(event)
            if event.type == ET.CUSTOM:
                return

    task = asyncio.create_task(read())
    await spin()
    assert seen == []
    log.append(event_pb2.Event(type=ET.RUN_STARTED))
    await task
    assert [e.type for e in seen] == [ET.RUN_STARTED, ET.CUSTOM]


async def test_keepalives_never_follow_the_end() -> None:
    log = TurnLog("s1", "t1", 100)
    log.append(event_pb2.Event(type=ET.RUN_STARTED))
    log.append(finished())
    assert [e.type async for e in log.follow(0, keepalive_seconds=0)] == [
        ET.RUN_STARTED,
        ET.RUN_FINISHED,
    ]


# --- TurnLog: the max_events bound ---------------------------------------------


async def test_max_events_drops_the_oldest() -> None:
    log = TurnLog("s1", "t1", max_events=3)
    for _ in range(4):
        log.append(text())
    log.append(finished())
    assert log.last_seq == 5
    # Events 3..5 are kept: resuming after 2 (or later) still works.
    assert await collect(log, 2) == [3, 4, 5]
    assert await collect(log, 4) == [5]


@pytest.mark.parametrize("after_seq", [0, 1])
async def test_follow_from_before_the_kept_events_raises_out_of_range(after_seq: int) -> None:
    log = TurnLog("s1", "t1", max_events=3)
    for _ in range(4):
        log.append(text())
    log.append(finished())
    with pytest.raises(OutOfRange):
        await collect(log, after_seq)


async def test_exactly_max_events_drops_nothing() -> None:
    log = TurnLog("s1", "t1", max_events=3)
    log.append(text())
    log.append(text())
    log.append(finished())
    assert await collect(log) == [1, 2, 3]


async def test_a_reader_that_falls_behind_the_bound_gets_out_of_range() -> None:
    log = TurnLog("s1", "t1", max_events=2)
    log.append(text())
    log.append(text())
    follower = log.follow()
    assert (await anext(follower)).seq == 1
    # While the reader holds event 1, three more arrive: 2 and 3 are dropped.
    # Event 2 came with 1 (one read takes every event there): it is the
    # reader's; 3 is gone.
    for _ in range(3):
        log.append(text())
    assert (await anext(follower)).seq == 2
    with pytest.raises(OutOfRange):
        await anext(follower)


async def test_batches_hold_every_event_ready_and_a_lone_event_goes_at_once() -> None:
    log = TurnLog("s1", "t1", 1000)
    for delta in "abc":
        log.append(text(delta))
    batches = log.follow_batches(max_batch=2)
    # Three ready, at most two a batch: [1, 2], then [3].
    assert [e.seq for e in await anext(batches)] == [1, 2]
    assert [e.seq for e in await anext(batches)] == [3]
    # The reader waits; one event wakes it with a batch of one.
    waiting = asyncio.ensure_future(anext(batches))
    await spin()
    assert not waiting.done()
    log.append(text("d"))
    assert [e.seq for e in await waiting] == [4]
    # Events that arrive while the reader is away come together.
    log.append(text())
    log.append(finished())
    assert [e.seq for e in await anext(batches)] == [5, 6]
    with pytest.raises(StopAsyncIteration):
        await anext(batches)


async def test_a_packed_log_is_replayed_in_batches() -> None:
    log = TurnLog("s1", "t1", 1000)
    for delta in "abc":
        log.append(text(delta))
    log.append(finished())
    log.pack()
    batches = [[e.delta for e in batch] async for batch in log.follow_batches(1, max_batch=2)]
    assert batches == [["b", "c"], [""]]


# --- EventLogs ------------------------------------------------------------------


def end(log: TurnLog) -> None:
    log.append(finished())


def test_get_returns_the_created_log() -> None:
    logs = EventLogs(max_events=10, max_turns_per_session=4, ttl_seconds=60)
    created = logs.create("s1", "t1")
    assert created.session_id == "s1"
    assert created.turn_id == "t1"
    assert logs.get("s1", "t1") is created


@pytest.mark.parametrize(("session_id", "turn_id"), [("nope", "t1"), ("s1", "nope")])
def test_get_of_an_unknown_turn_raises_not_found(session_id: str, turn_id: str) -> None:
    logs = EventLogs(max_events=10, max_turns_per_session=4, ttl_seconds=60)
    logs.create("s1", "t1")
    with pytest.raises(NotFound):
        logs.get(session_id, turn_id)


async def test_created_logs_use_the_max_events_bound() -> None:
    logs = EventLogs(max_events=2, max_turns_per_session=4, ttl_seconds=60)
    log = logs.create("s1", "t1")
    for _ in range(2):
        log.append(text())
    log.append(finished())
    with pytest.raises(OutOfRange):
        await collect(log)
    assert await collect(log, 1) == [2, 3]


def test_keeps_at_most_max_turns_evicting_the_oldest_finished() -> None:
    logs = EventLogs(max_events=10, max_turns_per_session=2, ttl_seconds=60)
    for turn_id in ("t1", "t2"):
        end(logs.create("s1", turn_id))
    logs.create("s1", "t3")
    with pytest.raises(NotFound):
        logs.get("s1", "t1")
    assert logs.get("s1", "t2").turn_id == "t2"
    assert logs.get("s1", "t3").turn_id == "t3"


def test_turns_per_session_are_counted_per_session() -> None:
    logs = EventLogs(max_events=10, max_turns_per_session=1, ttl_seconds=60)
    end(logs.create("s1", "t1"))
    end(logs.create("s2", "t1"))
    assert logs.get("s1", "t1").session_id == "s1"
    assert logs.get("s2", "t1").session_id == "s2"


def test_never_evicts_a_running_turn_even_over_the_bound() -> None:
    logs = EventLogs(max_events=10, max_turns_per_session=1, ttl_seconds=60)
    t1 = logs.create("s1", "t1")
    logs.create("s1", "t2")
    logs.create("s1", "t3")
    for turn_id in ("t1", "t2", "t3"):
        assert logs.get("s1", turn_id).turn_id == turn_id
    # Once t1 ends it is the oldest finished turn over the bound: it goes.
    end(t1)
    logs.create("s1", "t4")
    with pytest.raises(NotFound):
        logs.get("s1", "t1")
    for turn_id in ("t2", "t3", "t4"):
        assert logs.get("s1", turn_id).turn_id == turn_id


def test_the_bound_counts_running_turns_too() -> None:
    # Documented as "turns kept per session": a finished turn is evicted when
    # running ones alone reach the bound.
    logs = EventLogs(max_events=10, max_turns_per_session=2, ttl_seconds=60)
    end(logs.create("s1", "done"))
    logs.create("s1", "r1")
    logs.create("s1", "r2")
    with pytest.raises(NotFound):
        logs.get("s1", "done")


def test_finished_turns_expire_after_the_ttl(clock: FakeClock) -> None:
    logs = EventLogs(max_events=10, max_turns_per_session=10, ttl_seconds=60)
    end(logs.create("s1", "t1"))
    clock.advance(60)
    assert logs.get("s1", "t1").turn_id == "t1"  # exactly the TTL: still kept
    clock.advance(0.001)
    with pytest.raises(NotFound):
        logs.get("s1", "t1")


def test_the_ttl_runs_from_the_end_of_the_turn_not_its_creation(clock: FakeClock) -> None:
    logs = EventLogs(max_events=10, max_turns_per_session=10, ttl_seconds=60)
    log = logs.create("s1", "t1")
    clock.advance(1000)
    end(log)
    clock.advance(59)
    assert logs.get("s1", "t1") is log


def test_a_running_turn_never_expires(clock: FakeClock) -> None:
    logs = EventLogs(max_events=10, max_turns_per_session=10, ttl_seconds=60)
    log = logs.create("s1", "t1")
    log.append(text())
    clock.advance(10_000)
    assert logs.get("s1", "t1") is log


def test_expiry_also_happens_on_create(clock: FakeClock) -> None:
    logs = EventLogs(max_events=10, max_turns_per_session=10, ttl_seconds=60)
    end(logs.create("s1", "old"))
    clock.advance(61)
    logs.create("s1", "new")
    assert list(logs._by_session["s1"]) == ["new"]


def test_drop_session_forgets_every_turn_of_that_session_only() -> None:
    logs = EventLogs(max_events=10, max_turns_per_session=10, ttl_seconds=60)
    logs.create("s1", "t1")
    logs.create("s2", "t1")
    logs.drop_session("s1")
    logs.drop_session("never-existed")
    with pytest.raises(NotFound):
        logs.get("s1", "t1")
    assert logs.get("s2", "t1").session_id == "s2"


def test_an_event_stored_with_the_commit_is_stamped_once() -> None:
    log = TurnLog("s1", "t1", 100)
    log.append(event_pb2.Event(type=event_pb2.RUN_STARTED))
    final = log.stamp(event_pb2.Event(type=event_pb2.RUN_FINISHED))
    assert final.seq == 2
    # Appending it does not number it again; an out-of-turn one is refused.
    late = log.stamp(event_pb2.Event(type=event_pb2.RUN_FINISHED))
    late.seq = 7
    with pytest.raises(RuntimeError):
        log.append(late, persisted=True)
    assert log.append(final, persisted=True).seq == 2
    assert log.last_seq == 2
    assert log.done


# --- EventLogs: packed, within a byte budget -------------------------------------


def _turn(logs: EventLogs, session_id: str, turn_id: str, words: int = 3) -> TurnLog:
    log = logs.create(session_id, turn_id)
    for i in range(words):
        log.append(text(f"w{i} "))
    log.append(finished())
    return log


async def test_a_finished_log_is_packed_and_replays_the_same_events() -> None:
    logs = EventLogs(max_events=100, max_turns_per_session=10, ttl_seconds=60)
    log = logs.create("s1", "t1")
    reader = Reader(log)  # following across the end, as a live caller does
    await spin()
    for i in range(5):
        log.append(text(f"w{i} "))
    await spin()
    log.append(finished())
    await asyncio.wait_for(reader.task, 10)
    assert log.packed_bytes > 0 and log._events == []
    assert logs.finished_bytes == log.packed_bytes
    replayed = [e async for e in log.follow()]
    assert [e.SerializeToString() for e in replayed] == [
        e.SerializeToString() for e in reader.events
    ]
    assert [e.seq for e in replayed] == [1, 2, 3, 4, 5, 6]
    assert [e.seq async for e in log.follow(4)] == [5, 6]


def test_past_the_byte_budget_the_oldest_finished_logs_go_first() -> None:
    probe = EventLogs(max_events=100, max_turns_per_session=100, ttl_seconds=600)
    one = _turn(probe, "s9", "t9").packed_bytes  # ids of the same length, the same size
    logs = EventLogs(max_events=100, max_turns_per_session=100, ttl_seconds=600, max_bytes=3 * one)
    running = logs.create("s0", "running")
    for _ in range(1000):
        running.append(text())  # a running turn counts for nothing and never goes
    for n in range(5):
        _turn(logs, f"s{n % 2}", f"t{n}")
    assert logs.finished_bytes == 3 * one
    with pytest.raises(NotFound, match="history"):
        logs.get("s0", "t0")
    with pytest.raises(NotFound):
        logs.get("s1", "t1")
    assert [logs.get(f"s{n % 2}", f"t{n}").turn_id for n in (2, 3, 4)] == ["t2", "t3", "t4"]
    assert logs.get("s0", "running") is running


def test_a_sweep_drops_expired_logs_of_sessions_nobody_touches(clock: FakeClock) -> None:
    logs = EventLogs(max_events=100, max_turns_per_session=100, ttl_seconds=60)
    for n in range(50):
        _turn(logs, f"s{n}", "t")
    assert len(logs) == 50 and logs.finished_bytes > 0
    clock.advance(61)
    logs.sweep()
    assert len(logs) == 0 and logs.finished_bytes == 0
    assert logs._by_session == {} and not logs._finished


def test_forgotten_logs_give_their_bytes_back() -> None:
    logs = EventLogs(max_events=100, max_turns_per_session=2, ttl_seconds=600)
    for n in range(4):
        _turn(logs, "s1", f"t{n}")  # two are evicted by the count per session
    _turn(logs, "s2", "t")
    kept = logs.get("s1", "t2").packed_bytes + logs.get("s1", "t3").packed_bytes
    assert logs.finished_bytes == kept + logs.get("s2", "t").packed_bytes
    logs.drop_session("s1")
    logs.drop_session("s2")
    assert logs.finished_bytes == 0 and not logs._finished


async def test_a_long_turn_is_packed_off_the_loop_and_read_whole_meanwhile() -> None:
    logs = EventLogs(max_events=10_000, max_turns_per_session=10, ttl_seconds=600)
    log = logs.create("s1", "long")
    count = eventlog.PACK_ON_LOOP_EVENTS + 500
    for i in range(count):
        log.append(text(f"w{i} "))
    log.append(finished())
    assert log.packed_bytes == 0  # not on the loop: a thread packs it
    during = [e.delta async for e in log.follow()]
    for _ in range(6000):  # until the thread is done (bounded, not timed)
        if logs.finished_bytes:
            break
        await asyncio.sleep(0.01)
    assert logs.finished_bytes == log.packed_bytes > 0 and log._events == []
    after = [e.delta async for e in log.follow()]
    assert during == after == [*(f"w{i} " for i in range(count)), ""]
