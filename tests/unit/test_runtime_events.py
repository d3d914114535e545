"""The one fold of a turn's events into its answer."""

from __future__ import annotations

from turnmesh.runtime.events import Answer, now_ms, sum_usage
from turnmesh.v1 import event_pb2

ET = event_pb2.EventType


def test_the_answer_is_the_text_after_the_last_tool_result_and_usage_is_summed() -> None:
    events = [
        event_pb2.Event(type=ET.RUN_STARTED),
        event_pb2.Event(type=ET.TEXT_MESSAGE_CONTENT, delta="Let me "),
        event_pb2.Event(type=ET.TEXT_MESSAGE_CONTENT, delta="check."),
        event_pb2.Event(type=ET.TOOL_CALL_START, tool_call_id="c1", tool_call_name="calc"),
        event_pb2.Event(type=ET.TOOL_CALL_RESULT, tool_call_id="c1", content="42"),
        event_pb2.Event(type=ET.TEXT_MESSAGE_CONTENT, delta="It is "),
        event_pb2.Event(type=ET.TEXT_MESSAGE_CONTENT, delta="42."),
        event_pb2.Event(
            type=ET.RUN_FINISHED,
            usage=[
                event_pb2.TokenUsage(input_tokens=3, output_tokens=4, total_tokens=7),
                event_pb2.TokenUsage(input_tokens=10, output_tokens=1, total_tokens=11),
            ],
        ),
    ]
    answer = Answer()
    for event in events:
        answer.feed(event)
    assert answer.text == "It is 42."
    assert answer.usage == event_pb2.TokenUsage(input_tokens=13, output_tokens=5, total_tokens=18)


def test_an_unfinished_or_failed_turn_has_no_usage() -> None:
    answer = Answer()
    answer.feed(event_pb2.Event(type=ET.TEXT_MESSAGE_CONTENT, delta="partial"))
    answer.feed(event_pb2.Event(type=ET.RUN_ERROR, code="agent_error"))
    assert answer.text == "partial"
    assert answer.usage == event_pb2.TokenUsage()
    assert sum_usage([]) == event_pb2.TokenUsage()


def test_timestamps_are_whole_milliseconds() -> None:
    stamp = now_ms()
    assert stamp == int(stamp) and stamp > 1.7e12
