"""SessionTurns: policies, cancellation, disconnects and idempotency keys.

The runner is a fake that mirrors TurnRunner's contract with the turn log:
RUN_STARTED first, then (when the test opens the turn's gate) RUN_FINISHED, or
on cancellation a RUN_ERROR coded with ``turn.cancel_reason`` before
re-raising. SessionTurns itself ends a turn that never started.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from google.protobuf import struct_pb2

from tests.unit._server_fakes import FakeRunner, spin, spin_until
from turnmesh.runtime.errors import NotFound, SessionBusy
from turnmesh.server.sessions.admission import Admission, pending_bytes
from turnmesh.server.sessions.answers import Answers
from turnmesh.server.sessions.eventlog import EventLogs, TurnLog
from turnmesh.server.sessions.turns import (
    MAX_IDEMPOTENCY_KEYS,
    CancelReason,
    KeyUse,
    PendingTurn,
    SessionTurns,
)
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb

ET = event_pb2.EventType
REJECT = spb.TURN_POLICY_REJECT
ENQUEUE = spb.TURN_POLICY_ENQUEUE
COLLECT = spb.TURN_POLICY_COLLECT
INTERRUPT = spb.TURN_POLICY_INTERRUPT
UNSPECIFIED = spb.TURN_POLICY_UNSPECIFIED


@pytest.fixture
def runner() -> FakeRunner:
    return FakeRunner()


@pytest.fixture
def logs() -> EventLogs:
    return EventLogs(max_events=1000, max_turns_per_session=1000, ttl_seconds=600)


@pytest.fixture
async def turns(runner: FakeRunner, logs: EventLogs) -> AsyncIterator[SessionTurns]:
    session = SessionTurns("s1", "demo", runner, logs)
    yield session
    # Leave no task behind: cancel whatever is left and wait for the drain loop.
    session.cancel_all(CancelReason.SHUTDOWN)
    await session.wait_idle()
    assert not session.busy


def submit(
    turns: SessionTurns,
    message: str,
    policy: spb.TurnPolicy.ValueType = ENQUEUE,
    *,
    key: str = "",
    files: list[message_pb2.File] | None = None,
    metadata: dict[str, Any] | None = None,
) -> PendingTurn:
    meta = struct_pb2.Struct()
    if metadata:
        meta.update(metadata)
    return turns.submit(admission(message, files or [], meta, policy, key))


def admission(
    message: str,
    files: list[message_pb2.File],
    metadata: struct_pb2.Struct,
    policy: spb.TurnPolicy.ValueType,
    key: str = "",
) -> Admission:
    return Admission(
        session_id="s1",
        principal="",
        message=message,
        files=files,
        metadata=metadata,
        policy=policy,
        tools=[],
        answers=Answers(),
        webhook_url="",
        idempotency_key=key,
        digest="",
        size=pending_bytes(message, files),
        background=False,
        cancel_on_disconnect=False,
    )


async def started(turn: PendingTurn) -> None:
    await spin_until(lambda: turn.log.last_seq >= 1)


# Read afresh: mypy would carry an earlier assert's narrowing of these
# attributes past the awaits that change them.
def busy(turns: SessionTurns) -> bool:
    return turns.busy


def running(turns: SessionTurns) -> PendingTurn | None:
    return turns.running


async def events_of(log: TurnLog) -> list[event_pb2.Event]:
    """Every event of the turn, waiting for its end."""
    return [e async for e in log.follow()]


async def outcome(turn: PendingTurn) -> tuple[list[int], str]:
    """The turn's event types and its RUN_ERROR code ('' if none), once ended."""
    events = await events_of(turn.log)
    return [e.type for e in events], events[-1].code


FINISHED = ([ET.RUN_STARTED, ET.RUN_FINISHED], "")


def cancelled_before_start(code: str) -> tuple[list[int], str]:
    return [ET.RUN_ERROR], code


def cancelled_while_running(code: str) -> tuple[list[int], str]:
    return [ET.RUN_STARTED, ET.RUN_ERROR], code


# --- basics ----------------------------------------------------------------------


async def test_a_turn_on_an_idle_session_runs_at_once(
    turns: SessionTurns, runner: FakeRunner
) -> None:
    assert not turns.busy
    turn = submit(turns, "hi", REJECT)
    assert turn.waiters == 1
    assert turn.messages == ["hi"]
    assert turn.log.state == spb.TURN_STATE_QUEUED
    await started(turn)
    assert turns.running is turn
    assert busy(turns)
    runner.finish(turn)
    assert await outcome(turn) == FINISHED
    await turns.wait_idle()
    assert running(turns) is None
    assert not turns.busy


async def test_submit_copies_files_and_metadata(turns: SessionTurns, runner: FakeRunner) -> None:
    files = [message_pb2.File(content=b"x", mime_type="text/plain")]
    meta = struct_pb2.Struct()
    meta.update({"k": "v"})
    turn = turns.submit(admission("hi", files, meta, ENQUEUE))
    files.clear()
    meta["k"] = "changed"
    assert len(turn.files) == 1
    assert turn.metadata["k"] == "v"
    runner.finish(turn)
    await turns.wait_idle()


# --- REJECT --------------------------------------------------------------------


async def test_reject_while_a_turn_runs_raises_session_busy_and_changes_nothing(
    turns: SessionTurns, runner: FakeRunner, logs: EventLogs
) -> None:
    first = submit(turns, "one", ENQUEUE)
    await started(first)
    with pytest.raises(SessionBusy) as info:
        submit(turns, "two", REJECT, key="k-rejected")
    assert info.value.reason == "SESSION_BUSY"
    assert list(logs._by_session["s1"]) == [first.turn_id]
    assert turns.turn_for_key("k-rejected") is None
    assert list(turns._queue) == []
    assert turns.running is first
    runner.finish(first)
    await turns.wait_idle()
    assert runner.started == [first.turn_id]


async def test_reject_while_a_turn_only_waits_in_the_queue_is_refused_too(
    turns: SessionTurns, runner: FakeRunner
) -> None:
    first = submit(turns, "one", ENQUEUE)
    second = submit(turns, "two", ENQUEUE)
    await started(first)
    with pytest.raises(SessionBusy):
        submit(turns, "three", REJECT)
    runner.finish(first)
    await started(second)
    with pytest.raises(SessionBusy):
        submit(turns, "four", REJECT)
    runner.finish(second)
    await turns.wait_idle()
    after = submit(turns, "five", REJECT)  # idle again: accepted
    runner.finish(after)
    assert await outcome(after) == FINISHED


async def test_reject_right_after_a_submit_in_the_same_tick_is_refused(
    turns: SessionTurns, runner: FakeRunner
) -> None:
    first = submit(turns, "one", REJECT)
    with pytest.raises(SessionBusy):
        submit(turns, "two", REJECT)
    runner.finish(first)
    await turns.wait_idle()


# --- ENQUEUE ---------------------------------------------------------------------


async def test_enqueue_runs_turns_one_at_a_time_in_arrival_order(
    turns: SessionTurns, runner: FakeRunner
) -> None:
    queued = [submit(turns, f"m{i}", ENQUEUE) for i in range(4)]
    assert len({t.turn_id for t in queued}) == 4
    # Open the later gates first: order still comes from the queue.
    for turn in reversed(queued[1:]):
        runner.finish(turn)
    await started(queued[0])
    await spin()
    assert runner.started == [queued[0].turn_id]
    assert all(t.log.state == spb.TURN_STATE_QUEUED for t in queued[1:])
    runner.finish(queued[0])
    await turns.wait_idle()
    assert runner.started == [t.turn_id for t in queued]
    assert runner.max_running == 1
    for turn in queued:
        assert await outcome(turn) == FINISHED
        assert turn.messages == [runner.messages[turn.turn_id][0]]


async def test_enqueue_never_coalesces(turns: SessionTurns, runner: FakeRunner) -> None:
    first = submit(turns, "one", ENQUEUE)
    await started(first)
    a = submit(turns, "a", ENQUEUE)
    b = submit(turns, "b", ENQUEUE)
    assert a is not b
    for turn in (first, a, b):
        runner.finish(turn)
    await turns.wait_idle()
    assert runner.messages[a.turn_id] == ["a"]
    assert runner.messages[b.turn_id] == ["b"]


# --- COLLECT ---------------------------------------------------------------------


@pytest.mark.parametrize("policy", [COLLECT, UNSPECIFIED])
async def test_collect_coalesces_messages_sent_during_a_turn_into_one_follow_up(
    turns: SessionTurns, runner: FakeRunner, policy: spb.TurnPolicy.ValueType
) -> None:
    first = submit(turns, "first", policy)
    await started(first)
    batch = [
        submit(
            turns,
            f"m{i}",
            policy,
            files=[message_pb2.File(content=b"x", filename=f"f{i}")],
            metadata={f"k{i}": i, "shared": i},
        )
        for i in range(3)
    ]
    follow_up = batch[0]
    assert all(t is follow_up for t in batch)
    assert follow_up is not first
    assert follow_up.messages == ["m0", "m1", "m2"]
    assert follow_up.waiters == 3
    assert [f.filename for f in follow_up.files] == ["f0", "f1", "f2"]
    assert dict(follow_up.metadata) == {"k0": 0, "k1": 1, "k2": 2, "shared": 2}

    runner.finish(first)
    await started(follow_up)
    assert runner.messages[follow_up.turn_id] == ["m0", "m1", "m2"]
    started_event = (await anext(follow_up.log.follow())).type
    assert started_event == ET.RUN_STARTED
    assert follow_up.log._events[0].collected_messages == 3

    # Once the batch runs, a new message starts the next batch.
    later = submit(turns, "later", policy)
    assert later is not follow_up
    assert submit(turns, "later2", policy) is later
    assert later.messages == ["later", "later2"]
    runner.finish(follow_up)
    runner.finish(later)
    await turns.wait_idle()
    assert runner.started == [first.turn_id, follow_up.turn_id, later.turn_id]
    assert runner.max_running == 1


async def test_a_batch_never_outgrows_one_turns_files_and_bytes_are_counted(
    runner: FakeRunner, logs: EventLogs
) -> None:
    """Four requests of ten files each while a turn runs: a batch takes ten
    at most (one turn's limit), the rest start the next batch; every byte
    held counts for the session and its principal until its turn ends."""
    held: Counter[str] = Counter()
    turns = SessionTurns("acme/s1", "demo", runner, logs, Counter(), held)
    first = submit(turns, "first", COLLECT)
    await started(first)
    ten = [message_pb2.File(content=b"x" * 100, filename=f"f{i}") for i in range(10)]
    batches = [submit(turns, f"m{i}", COLLECT, files=ten) for i in range(4)]
    assert len({t.turn_id for t in batches}) == 4
    assert all(len(t.files) == 10 for t in batches)
    assert turns.queued == 4  # messages waiting, each counted
    assert turns.pending_bytes == len("first") + 4 * (2 + 1000)
    assert held == Counter({"acme": turns.pending_bytes})
    small = submit(turns, "small", COLLECT)  # no files: joins the last batch
    assert small is batches[-1] and turns.queued == 5
    for turn in (first, *batches):
        runner.finish(turn)
    await turns.wait_idle()
    assert turns.pending_bytes == 0 and held == Counter()


async def test_collect_on_an_idle_session_runs_alone(
    turns: SessionTurns, runner: FakeRunner
) -> None:
    only = submit(turns, "only", COLLECT)
    await started(only)
    assert runner.messages[only.turn_id] == ["only"]
    assert only.log._events[0].collected_messages == 0
    runner.finish(only)
    await turns.wait_idle()


async def test_collect_does_not_join_a_queued_enqueue_turn(
    turns: SessionTurns, runner: FakeRunner
) -> None:
    first = submit(turns, "first", ENQUEUE)
    await started(first)
    queued = submit(turns, "queued", ENQUEUE)
    collected = submit(turns, "c1", COLLECT)
    assert collected is not queued
    assert submit(turns, "c2", COLLECT) is collected
    assert queued.messages == ["queued"]
    assert collected.messages == ["c1", "c2"]
    # An ENQUEUE after the batch makes the batch no longer the last in line.
    after = submit(turns, "after", ENQUEUE)
    assert submit(turns, "c3", COLLECT) not in (collected, after)
    for turn in (first, queued, collected, after):
        runner.finish(turn)
    await spin_until(lambda: len(runner.started) == 5)
    runner.finish(turns.running)  # type: ignore[arg-type]
    await turns.wait_idle()


async def test_collect_coalesces_messages_that_arrive_before_the_first_turn_starts(
    turns: SessionTurns, runner: FakeRunner
) -> None:
    first = submit(turns, "first", COLLECT)
    second = submit(turns, "second", COLLECT)  # same tick: the drain task has not run yet
    third = submit(turns, "third", COLLECT)
    for turn in (first, second, third):
        runner.finish(turn)
    await turns.wait_idle()
    # Whether "second" joins the first turn or starts the follow-up batch,
    # "second" and "third" are both queued behind a busy session: one turn.
    assert third is second


# --- INTERRUPT -------------------------------------------------------------------


async def test_interrupt_cancels_the_running_turn_and_goes_first(
    turns: SessionTurns, runner: FakeRunner
) -> None:
    running = submit(turns, "running", ENQUEUE)
    await started(running)
    queued = submit(turns, "queued", ENQUEUE)
    urgent = submit(turns, "urgent", INTERRUPT)
    assert urgent.waiters == 1
    assert await outcome(running) == cancelled_while_running("interrupted")
    assert running.log.state == spb.TURN_STATE_CANCELLED
    assert running.cancel_reason is CancelReason.INTERRUPTED
    await started(urgent)
    assert queued.log.state == spb.TURN_STATE_QUEUED
    runner.finish(urgent)
    runner.finish(queued)
    await turns.wait_idle()
    assert runner.started == [running.turn_id, urgent.turn_id, queued.turn_id]
    assert runner.max_running == 1
    assert await outcome(queued) == FINISHED


async def test_interrupt_on_an_idle_session_just_runs(
    turns: SessionTurns, runner: FakeRunner
) -> None:
    turn = submit(turns, "x", INTERRUPT)
    runner.finish(turn)
    assert await outcome(turn) == FINISHED


async def test_interrupt_event_carries_the_interrupted_problem(
    turns: SessionTurns, runner: FakeRunner
) -> None:
    running = submit(turns, "running", ENQUEUE)
    await started(running)
    urgent = submit(turns, "urgent", INTERRUPT)
    error = (await events_of(running.log))[-1]
    assert error.code == "interrupted"
    assert error.problem.status == 499
    assert error.problem.title == "Turn interrupted by a newer turn"
    runner.finish(urgent)
    await turns.wait_idle()


# --- cancel ----------------------------------------------------------------------


async def test_cancel_of_the_running_turn(turns: SessionTurns, runner: FakeRunner) -> None:
    running = submit(turns, "running", ENQUEUE)
    await started(running)
    assert turns.cancel(running.turn_id, CancelReason.CANCELLED) == spb.TURN_STATE_CANCELLED
    assert await outcome(running) == cancelled_while_running("cancelled")
    await turns.wait_idle()
    assert not turns.busy


async def test_cancel_of_a_queued_turn_removes_it_without_running_it(
    turns: SessionTurns, runner: FakeRunner
) -> None:
    running = submit(turns, "running", ENQUEUE)
    queued = submit(turns, "queued", ENQUEUE)
    last = submit(turns, "last", ENQUEUE)
    await started(running)
    assert turns.cancel(queued.turn_id, CancelReason.CANCELLED) == spb.TURN_STATE_CANCELLED
    assert await outcome(queued) == cancelled_before_start("cancelled")
    assert queued.log.state == spb.TURN_STATE_CANCELLED
    assert list(turns._queue) == [last]
    runner.finish(running)
    runner.finish(last)
    await turns.wait_idle()
    assert runner.started == [running.turn_id, last.turn_id]
    assert queued.turn_id not in runner.started


async def test_cancel_keeps_the_first_reason(turns: SessionTurns, runner: FakeRunner) -> None:
    running = submit(turns, "running", ENQUEUE)
    await started(running)
    turns.cancel(running.turn_id, CancelReason.DISCONNECTED)
    turns.cancel(running.turn_id, CancelReason.SHUTDOWN)
    assert await outcome(running) == cancelled_while_running("disconnected")


async def test_cancel_of_an_unknown_turn_raises_not_found(turns: SessionTurns) -> None:
    with pytest.raises(NotFound):
        turns.cancel("no-such-turn", CancelReason.CANCELLED)


async def test_cancel_of_an_ended_turn_still_known_returns_its_state(
    turns: SessionTurns, runner: FakeRunner
) -> None:
    running = submit(turns, "running", ENQUEUE)
    await started(running)
    runner.finish(running)
    await spin_until(lambda: running.log.done)
    # The turn has ended but the drain loop has not yet moved on: still known.
    assert running.turn_id in turns._turns
    assert turns.cancel(running.turn_id, CancelReason.CANCELLED) == spb.TURN_STATE_FINISHED
    await turns.wait_idle()
    with pytest.raises(NotFound):  # forgotten once the drain loop moved on
        turns.cancel(running.turn_id, CancelReason.CANCELLED)
    assert await outcome(running) == FINISHED


async def test_a_turn_cancelled_before_its_task_ran_still_ends(
    turns: SessionTurns, runner: FakeRunner
) -> None:
    seen: list[tuple[bool, bool, bool]] = []

    def cancel_it() -> None:
        # Runs after SessionTurns made the turn's task, before that task's first step.
        task = turn.task
        seen.append((turns.running is turn, task is not None, task is not None and task.done()))
        turns.cancel(turn.turn_id, CancelReason.CANCELLED)

    turn = submit(turns, "x", ENQUEUE)
    runner.on_schedule[turn.turn_id] = cancel_it
    assert await outcome(turn) == cancelled_before_start("cancelled")
    assert seen == [(True, True, False)]
    await turns.wait_idle()
    assert runner.started == []
    assert turn.task is not None and turn.task.cancelled()
    assert not turns.busy


async def test_cancel_all_ends_the_running_and_every_queued_turn(
    turns: SessionTurns, runner: FakeRunner
) -> None:
    running = submit(turns, "running", ENQUEUE)
    queued = submit(turns, "queued", ENQUEUE)
    await started(running)
    batch = submit(turns, "c", COLLECT)
    turns.cancel_all(CancelReason.SESSION_DELETED)
    assert await outcome(running) == cancelled_while_running("session_deleted")
    assert await outcome(queued) == cancelled_before_start("session_deleted")
    assert await outcome(batch) == cancelled_before_start("session_deleted")
    await turns.wait_idle()
    assert runner.started == [running.turn_id]


# --- caller_left -----------------------------------------------------------------


async def test_the_only_caller_leaving_cancels_a_running_turn(
    turns: SessionTurns, runner: FakeRunner
) -> None:
    running = submit(turns, "x", ENQUEUE)
    await started(running)
    turns.caller_left(running.turn_id)
    assert await outcome(running) == cancelled_while_running("disconnected")


async def test_the_only_caller_leaving_cancels_a_queued_turn(
    turns: SessionTurns, runner: FakeRunner
) -> None:
    running = submit(turns, "running", ENQUEUE)
    queued = submit(turns, "queued", ENQUEUE)
    await started(running)
    turns.caller_left(queued.turn_id)
    assert await outcome(queued) == cancelled_before_start("disconnected")
    runner.finish(running)
    await turns.wait_idle()
    assert runner.started == [running.turn_id]


async def test_a_coalesced_turn_runs_while_one_of_its_callers_still_waits(
    turns: SessionTurns, runner: FakeRunner
) -> None:
    running = submit(turns, "running", COLLECT)
    await started(running)
    batch = submit(turns, "a", COLLECT)
    assert submit(turns, "b", COLLECT) is batch
    turns.caller_left(batch.turn_id)
    assert batch.waiters == 1
    runner.finish(running)
    await started(batch)
    runner.finish(batch)
    assert await outcome(batch) == FINISHED


async def test_a_coalesced_turn_is_cancelled_when_every_caller_left(
    turns: SessionTurns, runner: FakeRunner
) -> None:
    running = submit(turns, "running", COLLECT)
    await started(running)
    batch = submit(turns, "a", COLLECT)
    submit(turns, "b", COLLECT)
    turns.caller_left(batch.turn_id)
    turns.caller_left(batch.turn_id)
    assert await outcome(batch) == cancelled_before_start("disconnected")
    runner.finish(running)
    await turns.wait_idle()
    assert runner.started == [running.turn_id]


async def test_caller_left_of_an_unknown_or_ended_turn_does_nothing(
    turns: SessionTurns, runner: FakeRunner
) -> None:
    turns.caller_left("no-such-turn")
    turn = submit(turns, "x", ENQUEUE)
    runner.finish(turn)
    await spin_until(lambda: turn.log.done)
    turns.caller_left(turn.turn_id)
    assert await outcome(turn) == FINISHED


# --- idempotency keys --------------------------------------------------------------


async def test_idempotency_key_maps_to_the_turn(turns: SessionTurns, runner: FakeRunner) -> None:
    first = submit(turns, "one", ENQUEUE, key="k1")
    await started(first)
    batch = submit(turns, "a", COLLECT, key="k2")
    submit(turns, "b", COLLECT, key="k3")
    assert _turn_id(turns.turn_for_key("k1")) == first.turn_id
    assert _turn_id(turns.turn_for_key("k2")) == batch.turn_id
    assert _turn_id(turns.turn_for_key("k3")) == batch.turn_id
    assert turns.turn_for_key("unknown") is None
    assert turns.turn_for_key("") is None
    runner.finish(first)
    runner.finish(batch)
    await turns.wait_idle()
    # Keys outlive the turn (the log stays for a retried request to follow).
    assert _turn_id(turns.turn_for_key("k1")) == first.turn_id


async def test_an_empty_key_is_never_remembered(turns: SessionTurns, runner: FakeRunner) -> None:
    turn = submit(turns, "x", ENQUEUE, key="")
    assert turns._by_key == {}
    runner.finish(turn)
    await turns.wait_idle()


async def test_idempotency_keys_are_bounded_keeping_the_most_recent(
    turns: SessionTurns, runner: FakeRunner
) -> None:
    first = submit(turns, "first", ENQUEUE, key="k-first")
    await started(first)
    batch = first
    for i in range(MAX_IDEMPOTENCY_KEYS):
        batch = submit(turns, f"m{i}", COLLECT, key=f"k{i}")
    assert len(turns._by_key) == MAX_IDEMPOTENCY_KEYS
    assert turns.turn_for_key("k-first") is None  # the oldest key went
    assert _turn_id(turns.turn_for_key("k0")) == batch.turn_id
    assert _turn_id(turns.turn_for_key(f"k{MAX_IDEMPOTENCY_KEYS - 1}")) == batch.turn_id
    submit(turns, "one more", COLLECT, key="k-last")
    assert len(turns._by_key) == MAX_IDEMPOTENCY_KEYS
    assert turns.turn_for_key("k0") is None
    assert _turn_id(turns.turn_for_key("k-last")) == batch.turn_id
    runner.finish(first)
    runner.finish(batch)
    await turns.wait_idle()


def _turn_id(use: KeyUse | None) -> str | None:
    return use.turn_id if use is not None else None
