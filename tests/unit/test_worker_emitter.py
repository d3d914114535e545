"""The worker's emitter: agent calls -> balanced AG-UI events on a queue."""

from __future__ import annotations

from turnmesh.v1 import event_pb2
from turnmesh.worker.emitter import ET, QueueEmitter


def drain(emitter: QueueEmitter) -> list[event_pb2.Event]:
    events = []
    while not emitter.queue.empty():
        event = emitter.queue.get_nowait()
        assert event is not None
        events.append(event)
    return events


def names(events: list[event_pb2.Event]) -> list[str]:
    return [ET.Name(e.type) for e in events]


async def test_deltas_share_one_text_message_and_empty_ones_are_dropped() -> None:
    emitter = QueueEmitter()
    await emitter.emit_delta("Hello ")
    await emitter.emit_delta("")
    await emitter.emit_delta("world")
    events = drain(emitter) + emitter.closing_events("Hello world")
    assert names(events) == [
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
    ]
    assert events[0].role == "assistant"
    assert len({e.message_id for e in events}) == 1
    assert [e.delta for e in events[1:3]] == ["Hello ", "world"]
    assert all(e.timestamp > 0 for e in events)
    assert all(e.seq == 0 and not e.thread_id and not e.run_id for e in events)


async def test_tool_call_closes_text_and_names_its_parent_message() -> None:
    emitter = QueueEmitter()
    await emitter.emit_delta("Let me check.")
    call_id = await emitter.emit_tool_call("lookup", {"q": "ü", "n": 1})
    await emitter.emit_tool_result(call_id, "found")
    events = drain(emitter)
    assert names(events) == [
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
    ]
    text_id = events[0].message_id
    start, args, end, result = events[3:]
    assert call_id.startswith("call_")
    assert (start.tool_call_id, start.tool_call_name) == (call_id, "lookup")
    assert start.parent_message_id == text_id
    assert args.delta == '{"q":"ü","n":1}'  # compact JSON
    assert end.tool_call_id == call_id
    assert (result.tool_call_id, result.content, result.role) == (call_id, "found", "tool")
    assert result.message_id and result.message_id != text_id
    assert not emitter.text_since_tool_result


async def test_tool_call_without_text_gets_a_minted_parent_shared_by_parallel_calls() -> None:
    emitter = QueueEmitter()
    first = await emitter.emit_tool_call("a", '{"raw": true}', call_id="given")
    second = await emitter.emit_tool_call("b", {})
    events = drain(emitter)
    assert first == "given"
    starts = [e for e in events if e.type == ET.TOOL_CALL_START]
    assert starts[0].parent_message_id
    assert starts[0].parent_message_id == starts[1].parent_message_id
    args = [e.delta for e in events if e.type == ET.TOOL_CALL_ARGS]
    assert args == ['{"raw": true}', "{}"]  # a string is passed through as given
    assert second != first


async def test_empty_string_arguments_send_no_args_event() -> None:
    emitter = QueueEmitter()
    await emitter.emit_tool_call("noop", "")
    assert names(drain(emitter)) == ["TOOL_CALL_START", "TOOL_CALL_END"]


async def test_final_text_is_sent_when_nothing_was_streamed_after_the_last_result() -> None:
    emitter = QueueEmitter()
    await emitter.emit_delta("thinking")
    call_id = await emitter.emit_tool_call("t", {})
    await emitter.emit_tool_result(call_id, "r")
    drain(emitter)
    closing = emitter.closing_events("the answer")
    assert names(closing) == ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"]
    assert closing[1].delta == "the answer"
    assert emitter.closing_events("the answer") == []  # only once


async def test_nothing_to_close_when_text_was_streamed_or_final_text_is_empty() -> None:
    emitter = QueueEmitter()
    assert emitter.closing_events("") == []
    await emitter.emit_delta("done")
    await emitter.emit_tool_call("t", {})  # closes the text; no result follows
    drain(emitter)
    assert emitter.text_since_tool_result
    assert emitter.closing_events("done") == []


async def test_events_stop_at_finish() -> None:
    emitter = QueueEmitter()
    await emitter.emit_delta("x")
    emitter.finish()
    assert names([e async for e in emitter.events()]) == [
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
    ]
