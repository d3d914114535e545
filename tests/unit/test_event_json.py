"""The JSON of an event (as Envoy prints it) has AG-UI's names and value types."""

from __future__ import annotations

import json

from google.protobuf import json_format

from turnmesh.v1 import event_pb2


def _json(event: event_pb2.Event) -> dict[str, object]:
    data: dict[str, object] = json.loads(json_format.MessageToJson(event))
    return data


def test_text_event_json_is_agui_shaped() -> None:
    event = event_pb2.Event(
        type=event_pb2.TEXT_MESSAGE_CONTENT,
        seq=3,
        thread_id="s",
        run_id="t",
        message_id="m",
        delta="hi",
        timestamp=1.5e12,
    )
    data = _json(event)
    assert data["type"] == "TEXT_MESSAGE_CONTENT"
    assert data["messageId"] == "m"
    assert data["threadId"] == "s"
    assert data["runId"] == "t"
    assert isinstance(data["timestamp"], float | int)
    assert isinstance(data["seq"], int)


def test_run_finished_usage_is_a_list_of_numbers() -> None:
    event = event_pb2.Event(type=event_pb2.RUN_FINISHED, execution_time_ms=12)
    event.usage.add(input_tokens=1, output_tokens=2, total_tokens=3)
    data = _json(event)
    assert data["usage"] == [{"inputTokens": 1, "outputTokens": 2, "totalTokens": 3}]
    assert data["executionTimeMs"] == 12


def test_tool_call_fields() -> None:
    data = _json(
        event_pb2.Event(
            type=event_pb2.TOOL_CALL_START,
            tool_call_id="c",
            tool_call_name="calculator",
            parent_message_id="m",
        )
    )
    assert data == {
        "type": "TOOL_CALL_START",
        "toolCallId": "c",
        "toolCallName": "calculator",
        "parentMessageId": "m",
    }
