"""HistoryBuilder: a turn's events become OpenAI-shaped history messages."""

from __future__ import annotations

from google.protobuf import struct_pb2, timestamp_pb2

from turnmesh.server.sessions import pauses
from turnmesh.server.sessions.history import HistoryBuilder
from turnmesh.v1 import event_pb2, message_pb2

ET = event_pb2.EventType
TURN = "turn-1"


def created() -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=1_700_000_000, nanos=123)


def build(
    events: list[event_pb2.Event], metadata: struct_pb2.Struct | None = None
) -> list[message_pb2.Message]:
    builder = HistoryBuilder(TURN)
    for event in events:
        builder.feed(event)
    return builder.finish(created(), metadata)


def text(delta: str) -> list[event_pb2.Event]:
    return [
        event_pb2.Event(type=ET.TEXT_MESSAGE_START, message_id="m", role="assistant"),
        event_pb2.Event(type=ET.TEXT_MESSAGE_CONTENT, message_id="m", delta=delta),
        event_pb2.Event(type=ET.TEXT_MESSAGE_END, message_id="m"),
    ]


def call(call_id: str, name: str, *arg_pieces: str) -> list[event_pb2.Event]:
    return [
        event_pb2.Event(type=ET.TOOL_CALL_START, tool_call_id=call_id, tool_call_name=name),
        *(
            event_pb2.Event(type=ET.TOOL_CALL_ARGS, tool_call_id=call_id, delta=p)
            for p in arg_pieces
        ),
        event_pb2.Event(type=ET.TOOL_CALL_END, tool_call_id=call_id),
    ]


def result(call_id: str, content: str) -> event_pb2.Event:
    return event_pb2.Event(
        type=ET.TOOL_CALL_RESULT, tool_call_id=call_id, content=content, role="tool"
    )


def shape(messages: list[message_pb2.Message]) -> list[dict[str, object]]:
    return [
        {
            "role": m.role,
            "content": m.content,
            "tool_calls": [
                (c.id, c.type, c.function.name, c.function.arguments) for c in m.tool_calls
            ],
            "tool_call_id": m.tool_call_id,
        }
        for m in messages
    ]


def assistant(content: str, *calls: tuple[str, str, str, str]) -> dict[str, object]:
    return {"role": "assistant", "content": content, "tool_calls": list(calls), "tool_call_id": ""}


def tool(call_id: str, content: str) -> dict[str, object]:
    return {"role": "tool", "content": content, "tool_calls": [], "tool_call_id": call_id}


def test_text_only_is_one_assistant_message() -> None:
    events = [
        *text("Hello, "),
        event_pb2.Event(type=ET.TEXT_MESSAGE_CONTENT, message_id="m", delta="world"),
    ]
    assert shape(build(events)) == [assistant("Hello, world")]


def test_text_tool_call_result_and_final_text() -> None:
    events = [
        *text("Let me look. "),
        *call("c1", "lookup", '{"q": ', '"x"}'),
        result("c1", "42"),
        *text("It is 42."),
    ]
    assert shape(build(events)) == [
        assistant("Let me look. ", ("c1", "function", "lookup", '{"q": "x"}')),
        tool("c1", "42"),
        assistant("It is 42."),
    ]


def test_two_tool_calls_in_one_assistant_message() -> None:
    events = [
        *text("Both: "),
        *call("c1", "a", "{}"),
        *call("c2", "b", '{"n":', "1}"),
        result("c1", "A"),
        result("c2", "B"),
        *text("done"),
    ]
    assert shape(build(events)) == [
        assistant("Both: ", ("c1", "function", "a", "{}"), ("c2", "function", "b", '{"n":1}')),
        tool("c1", "A"),
        tool("c2", "B"),
        assistant("done"),
    ]


def test_interleaved_argument_pieces_go_to_their_own_call() -> None:
    events = [
        event_pb2.Event(type=ET.TOOL_CALL_START, tool_call_id="c1", tool_call_name="a"),
        event_pb2.Event(type=ET.TOOL_CALL_START, tool_call_id="c2", tool_call_name="b"),
        event_pb2.Event(type=ET.TOOL_CALL_ARGS, tool_call_id="c2", delta='{"b"'),
        event_pb2.Event(type=ET.TOOL_CALL_ARGS, tool_call_id="c1", delta='{"a"'),
        event_pb2.Event(type=ET.TOOL_CALL_ARGS, tool_call_id="c1", delta=":1}"),
        event_pb2.Event(type=ET.TOOL_CALL_ARGS, tool_call_id="c2", delta=":2}"),
        result("c1", "A"),
        result("c2", "B"),
    ]
    messages = build(events)
    assert [c.function.arguments for c in messages[0].tool_calls] == ['{"a":1}', '{"b":2}']


def test_two_rounds_of_tool_calls_make_two_assistant_messages() -> None:
    events = [
        *call("c1", "a", "{}"),
        result("c1", "A"),
        *text("then "),
        *call("c2", "b", "{}"),
        result("c2", "B"),
        *text("end"),
    ]
    assert shape(build(events)) == [
        assistant("", ("c1", "function", "a", "{}")),
        tool("c1", "A"),
        assistant("then ", ("c2", "function", "b", "{}")),
        tool("c2", "B"),
        assistant("end"),
    ]


def test_no_text_at_all_is_one_empty_assistant_message() -> None:
    assert shape(build([])) == [assistant("")]


def test_tool_calls_without_final_text_end_with_an_empty_assistant_message() -> None:
    events = [*call("c1", "a", "{}"), result("c1", "A")]
    assert shape(build(events)) == [
        assistant("", ("c1", "function", "a", "{}")),
        tool("c1", "A"),
        assistant(""),
    ]


def test_other_events_are_ignored() -> None:
    events = [
        event_pb2.Event(type=ET.RUN_STARTED),
        event_pb2.Event(type=ET.CUSTOM, name="keepalive"),
        *text("hi"),
        event_pb2.Event(type=ET.RUN_FINISHED),
    ]
    assert shape(build(events)) == [assistant("hi")]


def test_every_message_carries_the_turn_id_and_created_at() -> None:
    events = [*text("a"), *call("c1", "f", "{}"), result("c1", "r"), *text("b")]
    messages = build(events)
    assert len(messages) == 3
    for message in messages:
        assert message.turn_id == TURN
        assert message.created_at == created()


def test_metadata_goes_on_the_last_message_only() -> None:
    metadata = struct_pb2.Struct()
    metadata.update({"model": "m1", "tokens": 3})
    events = [*call("c1", "f", "{}"), result("c1", "r"), *text("b")]
    messages = build(events, metadata)
    assert messages[-1].metadata == metadata
    assert all(not m.HasField("metadata") for m in messages[:-1])


def test_metadata_goes_on_the_added_empty_final_message() -> None:
    metadata = struct_pb2.Struct()
    metadata.update({"k": "v"})
    messages = build([*call("c1", "f", "{}"), result("c1", "r")], metadata)
    assert messages[-1].content == ""
    assert messages[-1].metadata == metadata


def test_empty_or_missing_metadata_leaves_the_field_unset() -> None:
    assert not build(text("a"), struct_pb2.Struct())[-1].HasField("metadata")
    assert not build(text("a"), None)[-1].HasField("metadata")


def test_a_gated_calls_result_goes_first_and_a_missing_one_is_an_error() -> None:
    pause = message_pb2.Pause(turn_id="t1")
    pause.interrupts.add(id="int_a", reason="tool_approval", tool_call_id="call_a")
    pause.interrupts.add(id="int_b", reason="tool_approval", tool_call_id="call_b")
    pause.interrupts.add(id="int_q", reason="question")
    at = timestamp_pb2.Timestamp(seconds=1)
    built = [
        message_pb2.Message(role="assistant", content="running it"),
        message_pb2.Message(role="tool", tool_call_id="call_a", content="42"),
        message_pb2.Message(role="tool", tool_call_id="call_a", content="again"),
        message_pb2.Message(role="assistant", content="done"),
    ]
    gated, rest = pauses.gated_results(pause, built, "t2", at)
    assert [(m.tool_call_id, m.content, m.error) for m in gated] == [
        ("call_a", "42", ""),
        ("call_b", "", pauses.NO_RESULT),
    ]
    assert gated[1].turn_id == "t2" and gated[1].created_at == at
    assert [m.content for m in rest] == ["running it", "done"]
    # No approvals answered: the turn's messages as they were.
    assert pauses.gated_results(None, built, "t2", at) == ([], built)


def _call(call_id: str) -> message_pb2.ToolCall:
    return message_pb2.ToolCall(id=call_id, function=message_pb2.FunctionCall(name=call_id))


def _asks(*interrupts: event_pb2.Interrupt, **fields: object) -> message_pb2.Message:
    message = message_pb2.Message(role="assistant", turn_id="t1", **fields)  # type: ignore[arg-type]
    message.interrupts.extend(interrupts)
    return message


def test_a_paused_message_keeps_what_it_asked_where_history_can_find_it() -> None:
    """Interrupts go on the message with the calls the turn waits on, even
    when the agent's own results follow it; else on the last assistant
    message, or an empty one after a tool's result."""
    at = timestamp_pb2.Timestamp(seconds=1)
    approval = event_pb2.RunOutcome(type="interrupt")
    approval.interrupts.add(id="i1", reason="tool_approval", tool_call_id="deploy")
    built = [
        message_pb2.Message(role="assistant", tool_calls=[_call("deploy"), _call("lookup")]),
        message_pb2.Message(role="tool", tool_call_id="lookup", content="found"),
        message_pb2.Message(role="assistant", content="May I deploy?"),
    ]
    pauses.keep_interrupts(built, approval, "t1", at)
    assert [len(m.interrupts) for m in built] == [1, 0, 0]
    question = event_pb2.RunOutcome(type="interrupt")
    question.interrupts.add(id="q1", reason="question")
    after_tool = [
        message_pb2.Message(role="assistant", tool_calls=[_call("lookup")]),
        message_pb2.Message(role="tool", tool_call_id="lookup", content="found"),
    ]
    pauses.keep_interrupts(after_tool, question, "t1", at)
    assert [(m.role, len(m.interrupts)) for m in after_tool] == [
        ("assistant", 0),
        ("tool", 0),
        ("assistant", 1),
    ]


def test_seeded_history_waits_for_what_its_paused_message_waits_on() -> None:
    user = message_pb2.Message(role="user", content="go")
    gate = event_pb2.Interrupt(id="i1", reason="tool_approval", tool_call_id="deploy")
    question = event_pb2.Interrupt(id="q1", reason="question")
    cases: list[tuple[list[message_pb2.Message], list[str], list[str]]] = [
        # A client's calls, one answered already.
        (
            [user, _asks(tool_calls=[_call("a"), _call("b")]), _tool("a")],
            ["b"],
            [],
        ),
        # An approval beside the agent's own call and its result, then words.
        (
            [
                user,
                _asks(gate, tool_calls=[_call("deploy"), _call("lookup")]),
                _tool("lookup"),
                _asks(content="May I deploy?"),
            ],
            [],
            ["i1"],
        ),
        # A question after the agent's own call.
        ([user, _asks(tool_calls=[_call("lookup")]), _tool("lookup"), _asks(question)], [], ["q1"]),
        # A question alone.
        ([user, _asks(question, content="Which one?")], [], ["q1"]),
        # The agent went on after a call it left open: nothing is the client's.
        ([user, _asks(tool_calls=[_call("x")]), _asks(content="done")], [], []),
        # Answered, then a user's message.
        ([_asks(tool_calls=[_call("a")]), _tool("a"), user], [], []),
    ]
    for history, calls, interrupts in cases:
        pause = pauses.seeded(history, 60)
        if not calls and not interrupts:
            assert pause is None, history
            continue
        assert pause is not None, history
        assert [c.id for c in pause.tool_calls] == calls
        assert [i.id for i in pause.interrupts] == interrupts
        assert all(i.HasField("expires_at") for i in pause.interrupts)


def _tool(call_id: str) -> message_pb2.Message:
    return message_pb2.Message(role="tool", tool_call_id=call_id, content="r")
