"""Pure logic of the compatibility surfaces: ids, event shapes, request parsing."""

from __future__ import annotations

import base64
import json

import pytest
from google.api import httpbody_pb2
from google.protobuf import json_format

from turnmesh.runtime import turn_errors
from turnmesh.runtime.errors import (
    AwaitingClient,
    InvalidArgument,
    TurnCancelled,
    TurnFailed,
    TurnmeshError,
    Unavailable,
)
from turnmesh.runtime.turn_errors import TurnError
from turnmesh.server.compat import _files, agui, openai_chat, openai_responses
from turnmesh.server.compat.simple_chat import _Calls
from turnmesh.v1 import compat_service_pb2 as cpb
from turnmesh.v1 import event_pb2

ET = event_pb2


def body(payload: object) -> httpbody_pb2.HttpBody:
    return httpbody_pb2.HttpBody(content_type="application/json", data=json.dumps(payload).encode())


def fields(error: InvalidArgument) -> list[str]:
    return [v.field for v in error.violations]


@pytest.mark.parametrize("session_id", ["s", "thread-1.a:B_c", "01J" + "Z" * 23, "x" * 128])
def test_response_ids_round_trip(session_id: str) -> None:
    rid = openai_responses.response_id(session_id, "01JTURN")
    assert rid.startswith("resp_")
    assert openai_responses.parse_response_id(rid, "f") == (session_id, "01JTURN")


@pytest.mark.parametrize("value", ["", "resp_", "garbage", "resp_x", "resp_.YQ", "resp_t.!!!"])
def test_bad_response_ids_name_the_field(value: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        openai_responses.parse_response_id(value, "previous_response_id")
    assert fields(info.value) == ["previous_response_id"]


AGUI_FIELDS = {
    ET.RUN_STARTED: {"type", "timestamp", "threadId", "runId"},
    ET.RUN_FINISHED: {"type", "timestamp", "threadId", "runId"},
    ET.RUN_ERROR: {"type", "timestamp", "message", "code"},
    ET.TEXT_MESSAGE_START: {"type", "timestamp", "messageId", "role"},
    ET.TEXT_MESSAGE_CONTENT: {"type", "timestamp", "messageId", "delta"},
    ET.TEXT_MESSAGE_END: {"type", "timestamp", "messageId"},
    ET.TOOL_CALL_START: {"type", "timestamp", "toolCallId", "toolCallName", "parentMessageId"},
    ET.TOOL_CALL_ARGS: {"type", "timestamp", "toolCallId", "delta"},
    ET.TOOL_CALL_END: {"type", "timestamp", "toolCallId"},
    ET.TOOL_CALL_RESULT: {"type", "timestamp", "messageId", "toolCallId", "content", "role"},
}


@pytest.mark.parametrize("kind", sorted(AGUI_FIELDS))
def test_agui_events_carry_exactly_aguis_fields(kind: event_pb2.EventType.ValueType) -> None:
    event = event_pb2.Event(
        type=kind,
        seq=7,
        thread_id="s",
        run_id="turn",
        timestamp=1700000000123.0,
        message_id="m",
        delta="d",
        tool_call_id="c",
        tool_call_name="calculator",
        parent_message_id="p",
        content="r",
        message="boom",
        code="agent_error",
    )
    out = agui.to_agui(event, "thread", "client-run")
    assert out is not None
    assert set(out) == AGUI_FIELDS[kind]
    assert isinstance(out["timestamp"], int)
    if "runId" in out:
        assert out["runId"] == "client-run"
        assert out["threadId"] == "thread"
    if "role" in out:
        assert out["role"] == ("tool" if kind == ET.TOOL_CALL_RESULT else "assistant")


async def test_chat_completion_requests_are_checked_field_by_field() -> None:
    with pytest.raises(InvalidArgument) as info:
        await openai_chat.parse(body({"model": "", "messages": [{"role": "robot"}]}))
    assert fields(info.value) == ["model", "messages[0].role"]
    with pytest.raises(InvalidArgument) as info:
        await openai_chat.parse(httpbody_pb2.HttpBody(data=b"[1, 2]"))
    assert fields(info.value) == ["body"]


async def test_chat_history_maps_developer_to_system_and_parts_to_text() -> None:
    request = await openai_chat.parse(
        body(
            {
                "model": "demo",
                "messages": [
                    {"role": "developer", "content": "rules"},
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "a"}, {"type": "image_url"}],
                    },
                ],
                "temperature": 0.2,
            }
        )
    )
    history = openai_chat.to_history(request.messages)
    assert [(m.role, m.content) for m in history] == [("system", "rules"), ("user", "a")]


async def test_responses_input_must_end_with_a_user_message() -> None:
    with pytest.raises(InvalidArgument) as info:
        await openai_responses.parse(
            body({"model": "demo", "input": [{"role": "assistant", "content": "x"}]})
        )
    assert fields(info.value) == ["input"]
    parsed = await openai_responses.parse(body({"model": "demo", "input": "hi"}))
    assert [i.text() for i in parsed.items() if isinstance(i, openai_responses.InputMessage)] == [
        "hi"
    ]


async def test_agui_input_is_checked() -> None:
    with pytest.raises(InvalidArgument) as info:
        await agui.parse(
            body(
                {
                    "threadId": "t",
                    "messages": [{"id": "1", "role": "user", "content": "hi"}],
                    "forwardedProps": {"policy": "shout"},
                }
            )
        )
    assert fields(info.value) == ["forwardedProps.policy"]
    with pytest.raises(InvalidArgument) as info:
        await agui.parse(
            body({"threadId": "t", "messages": [{"role": "assistant", "content": "x"}]})
        )
    assert fields(info.value) == ["messages[0].role"]


@pytest.mark.parametrize(
    "url",
    [
        "data:text/plain,aGk=",  # not base64
        "data:;base64,aGk=",  # no type
        "data:text/plain;base64",  # no comma
        "data:text/plain;base64" + "x" * 2000 + ",aGk=",  # the comma far past the head
        "https://example.com/a.png",
    ],
)
async def test_a_data_url_that_is_not_one_names_its_field(url: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        _files.from_data_url(url, "messages[0].content[1].image_url.url")
    assert fields(info.value) == ["messages[0].content[1].image_url.url"]


async def test_a_data_urls_payload_is_decoded_in_place() -> None:
    url = "data:text/plain;charset=utf-8;base64," + base64.b64encode(b"hello").decode()
    inline = _files.from_data_url(url, "f", "a.txt")
    assert inline.data is url  # the payload is not copied out of the URL
    (file,) = await _files.decode([inline])
    assert (file.content, file.mime_type, file.filename) == (b"hello", "text/plain", "a.txt")


def test_simple_chat_survives_events_naming_unknown_calls() -> None:
    response = cpb.ChatResponse()
    calls = _Calls(response)
    for event in (
        event_pb2.Event(type=event_pb2.TOOL_CALL_START, tool_call_id="a", tool_call_name="f"),
        event_pb2.Event(type=event_pb2.TOOL_CALL_ARGS, tool_call_id="a", delta='{"x": [1, '),
        event_pb2.Event(type=event_pb2.TOOL_CALL_ARGS, tool_call_id="a", delta="2]}"),
        event_pb2.Event(type=event_pb2.TOOL_CALL_RESULT, tool_call_id="a", content="ok"),
        # Never started: a result and arguments naming calls nobody opened.
        event_pb2.Event(type=event_pb2.TOOL_CALL_RESULT, tool_call_id="ghost", content="error: x"),
        event_pb2.Event(type=event_pb2.TOOL_CALL_ARGS, tool_call_id="b", delta="not json"),
    ):
        calls.feed(event)
    calls.finish()
    shaped = [json_format.MessageToDict(c) for c in response.tool_calls]
    assert shaped == [
        {
            "id": "a",
            "name": "f",
            "arguments": {"x": [1.0, 2.0]},
            "arguments_json": '{"x": [1, 2]}',
            "status": "success",
        },
        {"id": "ghost", "status": "error", "arguments": {}},
        {"id": "b", "status": "pending", "arguments": {}, "arguments_json": "not json"},
    ]


@pytest.mark.parametrize(
    "arguments",
    ['{"x": NaN}', '{"x": 1e999}', "[" * 5000 + "]" * 5000, '{"a":' * 200 + "1" + "}" * 200],
)
def test_simple_chat_arguments_no_json_answer_can_print_are_an_empty_object(
    arguments: str,
) -> None:
    response = cpb.ChatResponse()
    calls = _Calls(response)
    calls.feed(
        event_pb2.Event(type=event_pb2.TOOL_CALL_START, tool_call_id="a", tool_call_name="f")
    )
    calls.feed(event_pb2.Event(type=event_pb2.TOOL_CALL_ARGS, tool_call_id="a", delta=arguments))
    calls.finish()
    (call,) = response.tool_calls
    assert call.arguments_json == arguments
    assert json_format.MessageToDict(call.arguments) == {}
    json_format.MessageToJson(response)  # prints: nothing non-finite or too deep in it


async def test_param_keeps_the_callers_own_keys_that_look_like_branch_names() -> None:
    with pytest.raises(InvalidArgument) as info:
        await openai_chat.parse(
            body(
                {
                    "model": "demo",
                    "messages": [{"role": "user", "content": "x"}],
                    "metadata": {"Team": 5, "str": 6},
                }
            )
        )
    assert sorted(fields(info.value)) == ["metadata.Team", "metadata.str"]
    with pytest.raises(InvalidArgument) as info:
        await openai_responses.parse(body({"model": "demo", "input": 5}))
    assert fields(info.value) == ["input"]


@pytest.mark.parametrize(
    ("code", "error", "status"),
    [
        # Queued behind a turn that then paused: 409 on every surface, as a
        # turn refused at once is.
        ("awaiting_client", AwaitingClient, 409),
        ("owner_lost", Unavailable, 503),
        ("cancelled", TurnCancelled, None),
        ("agent_error", TurnFailed, None),
    ],
)
def test_a_failed_turn_maps_to_one_error_on_every_surface(
    code: str, error: type[TurnmeshError], status: int | None
) -> None:
    mapped = turn_errors.turn_error(ET.Event(type=ET.RUN_ERROR, code=code, message="m"))
    assert type(mapped) is error
    if status is not None:
        assert mapped.http_status == status


@pytest.mark.parametrize("error", list(TurnError))
def test_a_streamed_chat_error_frame_is_typed_by_the_error_table(error: TurnError) -> None:
    """The stream's error frame says what the same turn answered in one
    piece says: a mesh fault is a server_error (retried), an agent's failure
    or a cancel the caller's request error (not retried)."""
    event = error.event("it went wrong")
    frame = openai_chat.error_payload(event)["error"]
    assert frame["type"] == type(turn_errors.turn_error(event)).openai_type
    assert frame["code"] == error.code
    faults = (TurnError.WORKER_FAILED, TurnError.WORKER_UNAVAILABLE, TurnError.OWNER_LOST)
    fault = error in (*faults, TurnError.SHUTDOWN)
    assert frame["type"] == ("server_error" if fault else "invalid_request_error")
