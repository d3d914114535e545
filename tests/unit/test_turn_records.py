"""What a turn's record and its webhook notice say, from what is known."""

from __future__ import annotations

from turnmesh.server import turn_records
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
