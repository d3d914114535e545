"""What a turn's record and its webhook notice say, from what is known."""

from __future__ import annotations

import json

import pytest

from tests.support.webhooks import SECRET, receiving
from turnmesh.server.sessions import turn_records
from turnmesh.server.stores.base import SessionRecord
from turnmesh.server.stores.memory import MemoryStore
from turnmesh.server.stores.redis_client import connect
from turnmesh.server.stores.redis_outbox import RedisOutbox
from turnmesh.server.webhooks.outbox import MAX_NOTICE_BYTES, OutboxUnavailable
from turnmesh.server.webhooks.sender import WebhookSender
from turnmesh.server.webhooks.settings import WebhookSettings
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb


def _record(turn_id: str = "t1") -> spb.Turn:
    return spb.Turn(turn_id=turn_id, state=spb.TURN_STATE_RUNNING, webhook_url="http://h/")


def test_a_committed_turn_that_left_the_session_waiting_says_for_what() -> None:
    pause = message_pb2.Pause(turn_id="t1")
    pause.tool_calls.add(id="call_1")
    pause.interrupts.add(id="int_1", reason="tool_approval", tool_call_id="call_2")
    turn = turn_records.committed(_record(), [], pause)
    assert turn.state == spb.TURN_STATE_FINISHED
    assert list(turn.outcome.pending_tool_call_ids) == ["call_1"]
    assert [i.id for i in turn.outcome.interrupts] == ["int_1"]
    assert turn_records.notice_type(turn) == "turn.waiting"
    # Another turn's pause is not this one's.
    other = turn_records.committed(_record("t0"), [], pause)
    assert turn_records.notice_type(other) == "turn.finished"


def test_each_end_has_its_notice() -> None:
    finished = spb.Turn(state=spb.TURN_STATE_FINISHED)
    waiting = spb.Turn(
        state=spb.TURN_STATE_FINISHED,
        outcome=event_pb2.RunOutcome(type="success", pending_tool_call_ids=["c"]),
    )
    lost = turn_records.lost(_record())
    cancelled = spb.Turn(state=spb.TURN_STATE_CANCELLED, error_code="cancelled")
    assert [turn_records.notice_type(t) for t in (finished, waiting, lost, cancelled)] == [
        "turn.finished",
        "turn.waiting",
        "turn.failed",
        "turn.cancelled",
    ]
    assert turn_records.turn_json(lost)["errorCode"] == "owner_lost"


async def test_a_notice_this_servers_allow_list_refuses_is_queued_for_another() -> None:
    """The server that records a turn's end queues its notice whatever its
    own allow-list says (a mesh whose lists differ, for a while); a server
    whose list admits the URL sends it."""
    store = MemoryStore()  # one outbox, as a shared store's is for every server
    await store.create(SessionRecord("acme/s1", "demo", 1.0, 1.0))
    async with receiving() as receiver:
        elsewhere = WebhookSender(
            WebhookSettings(allow=("http://127.0.0.2",), secret=SECRET), store.outbox()
        )
        delivering = WebhookSender(
            WebhookSettings(allow=(receiver.url,), secret=SECRET), store.outbox()
        )
        records = turn_records.TurnRecords(store, 600, elsewhere)
        turn = spb.Turn(turn_id="t1", state=spb.TURN_STATE_FINISHED, webhook_url=receiver.url)
        assert await records.save("acme/s1", turn)
        assert await store.outbox().next_due() is not None  # queued
        delivering.start()
        try:
            await receiver.requests(1)
        finally:
            await delivering.stop()
            await elsewhere.stop()
        ((headers, body),) = receiver.seen
        assert headers["webhook-id"] == "msg_t1"
        assert json.loads(body)["data"]["turnId"] == "t1"
    # A server with no webhooks configured queues none.
    other = MemoryStore()
    await other.create(SessionRecord("acme/s1", "demo", 1.0, 1.0))
    off = WebhookSender(WebhookSettings(), other.outbox())
    assert await turn_records.TurnRecords(other, 600, off).save("acme/s1", turn)
    assert await other.outbox().next_due() is None
    await off.stop()


async def test_an_end_whose_notice_could_not_be_queued_is_not_recorded() -> None:
    """The outbox failing (not full) leaves the record open: an ended record
    is final, so writing it would lose the notice for good."""
    store = MemoryStore()
    await store.create(SessionRecord("acme/s1", "demo", 1.0, 1.0))
    # Redis on port 9 of loopback: nothing listens, each call fails at once.
    failing = RedisOutbox(connect("redis://127.0.0.1:9/0"))
    hooks = WebhookSender(WebhookSettings(allow=("http://127.0.0.1",), secret=SECRET), failing)
    try:
        with pytest.raises(OutboxUnavailable):
            await hooks.send("http://127.0.0.1/hook", "turn.finished", {}, "msg_x")
        records = turn_records.TurnRecords(store, 600, hooks)
        running = spb.Turn(turn_id="t1", state=spb.TURN_STATE_RUNNING, webhook_url="http://h/")
        assert await records.save("acme/s1", running)
        finished = spb.Turn(turn_id="t1", state=spb.TURN_STATE_FINISHED, webhook_url="http://h/")
        assert not await records.save("acme/s1", finished)
        kept = await records.load("acme/s1", "t1")
        assert kept is not None and kept.state == spb.TURN_STATE_RUNNING
        assert await store.open_turns(10) == ([("acme/s1", "t1")], None)  # the sweep's to settle
        # A full outbox drops the notice (counted) and the end is written.
        full = WebhookSender(
            WebhookSettings(allow=("http://127.0.0.1",), secret=SECRET, max_pending=0),
            store.outbox(),
        )
        assert await turn_records.TurnRecords(store, 600, full).save("acme/s1", finished)
        await full.stop()
    finally:
        await hooks.stop()


def _bulky_outcome(schema_bytes: int) -> event_pb2.RunOutcome:
    """Sixteen questions (a worker's most), each with a schema and metadata
    of ``schema_bytes`` of JSON text."""
    outcome = event_pb2.RunOutcome(type="interrupt")
    for n in range(16):
        interrupt = outcome.interrupts.add(id=f"int_{n}", reason="question", message="why?" * 50)
        interrupt.response_schema.update({"description": "x" * schema_bytes})
        interrupt.metadata.update({"context": "y" * schema_bytes})
    return outcome


def test_a_small_turn_is_kept_whole() -> None:
    turn = spb.Turn(turn_id="t1", state=spb.TURN_STATE_FINISHED, outcome=_bulky_outcome(100))
    assert turn_records.bounded(turn) == (turn, False)


def test_a_turn_past_the_bound_loses_its_bulky_parts_first() -> None:
    bulky = spb.Turn(turn_id="t1", state=spb.TURN_STATE_FINISHED, outcome=_bulky_outcome(10_000))
    assert bulky.ByteSize() > turn_records.MAX_TURN_BYTES
    cut, truncated = turn_records.bounded(bulky)
    assert truncated and cut.ByteSize() <= turn_records.MAX_TURN_BYTES
    assert len(json.dumps(turn_records.turn_json(cut))) <= turn_records.MAX_TURN_BYTES
    # The questions stay, without their schema and metadata.
    assert [i.id for i in cut.outcome.interrupts] == [f"int_{n}" for n in range(16)]
    assert all(i.message == "why?" * 50 for i in cut.outcome.interrupts)
    assert not any(
        i.HasField("response_schema") or i.HasField("metadata") for i in cut.outcome.interrupts
    )
    assert bulky.outcome.interrupts[0].HasField("response_schema")  # the original is unchanged


def test_long_texts_are_cut_then_the_outcomes_lists_go() -> None:
    failed = spb.Turn(
        turn_id="t1",
        state=spb.TURN_STATE_FAILED,
        error_code="agent_error",
        error_message="e" * 200_000,
        problem=event_pb2.Problem(title="t", detail="d" * 200_000, status=500),
    )
    cut, truncated = turn_records.bounded(failed)
    assert truncated and cut.ByteSize() <= turn_records.MAX_TURN_BYTES
    assert cut.error_message == "e" * 999 + "\u2026" and cut.problem.detail.startswith("ddd")
    assert (cut.error_code, cut.problem.status) == ("agent_error", 500)
    # Calls by the hundred thousand: no list fits, the turn's ids, state and
    # outcome type stay (GetSession's pause says what it waits for).
    waiting = spb.Turn(
        turn_id="t2",
        session_id="s1",
        state=spb.TURN_STATE_FINISHED,
        webhook_url="http://h/",
        outcome=event_pb2.RunOutcome(
            type="success", pending_tool_call_ids=[f"call_{n}" for n in range(100_000)]
        ),
    )
    waiting.end_time.GetCurrentTime()
    cut, truncated = turn_records.bounded(waiting)
    assert truncated and cut.ByteSize() <= turn_records.MAX_TURN_BYTES
    assert (cut.turn_id, cut.session_id, cut.state, cut.webhook_url, cut.outcome.type) == (
        "t2",
        "s1",
        spb.TURN_STATE_FINISHED,
        "http://h/",
        "success",
    )
    assert cut.end_time == waiting.end_time and not cut.outcome.pending_tool_call_ids


async def test_a_bulky_turns_record_and_notice_are_bounded_in_bytes() -> None:
    store = MemoryStore()
    await store.create(SessionRecord("acme/s1", "demo", 1.0, 1.0))
    hooks = WebhookSender(
        WebhookSettings(allow=("http://127.0.0.1",), secret=SECRET), store.outbox()
    )
    try:  # not started: the notice stays in the outbox
        records = turn_records.TurnRecords(store, 600, hooks)
        turn = spb.Turn(
            turn_id="t1",
            state=spb.TURN_STATE_FINISHED,
            webhook_url="http://127.0.0.1/hook",
            outcome=_bulky_outcome(50_000),
        )
        assert await records.save("acme/s1", turn)
        stored = await store.get_turn("acme/s1", "t1")
        assert stored is not None and len(stored) <= turn_records.MAX_TURN_BYTES
        assert [i.id for i in spb.Turn.FromString(stored).outcome.interrupts] == [
            f"int_{n}" for n in range(16)
        ]
        (queued,) = await store.outbox().claim(float("inf"), 30, 10)
        assert len(queued.body) <= MAX_NOTICE_BYTES
        body = json.loads(queued.body)
        assert body["type"] == "turn.waiting" and body["truncated"] is True
        assert "responseSchema" not in body["data"]["outcome"]["interrupts"][0]
        await store.outbox().settle(queued, None)
        # One that fits says nothing of truncation.
        small = spb.Turn(turn_id="t2", state=spb.TURN_STATE_FINISHED, webhook_url=turn.webhook_url)
        assert await records.save("acme/s1", small)
        (plain,) = await store.outbox().claim(float("inf"), 30, 10)
        assert "truncated" not in json.loads(plain.body)
    finally:
        await hooks.stop()
