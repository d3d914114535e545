"""Turns that wait for the client, through the native API (typed gRPC client
and REST through Envoy): a client tool's call and its result, an approval
granted and one denied, a question, a cancelled pause, and every wrong
answer refused with nothing changed."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from google.protobuf import struct_pb2

from tests.conftest import SharedMesh
from turnmesh.client import (
    AsyncClient,
    AwaitingClientError,
    InvalidArgumentError,
    NotWaitingError,
    SessionBusyError,
)
from turnmesh.v1 import event_pb2, message_pb2

WEATHER = message_pb2.ToolDefinition(name="get_weather", description="the weather in a city")


def _value(payload: object) -> struct_pb2.Value:
    value = struct_pb2.Value()
    if isinstance(payload, dict):
        value.struct_value.update(payload)
    elif isinstance(payload, str):
        value.string_value = payload
    elif isinstance(payload, bool):
        value.bool_value = payload
    return value


async def test_a_client_tool_call_waits_for_its_result_then_the_agent_goes_on(
    client: AsyncClient, client2: AsyncClient
) -> None:
    session = await client.create_session(agent="demo")
    sid = session.session_id
    first = await client.send(sid, "what does get_weather say for Paris?", tools=[WEATHER])
    outcome = first.outcome
    assert outcome is not None and outcome.type == "success"
    (call_id,) = outcome.pending_tool_call_ids
    assert [e.tool_call_name for e in first.tool_calls] == ["get_weather"]
    # The session says what it waits for, on either server.
    waiting = (await client2.get_session(sid)).pause
    assert waiting.turn_id == first.turn_id
    assert [c.id for c in waiting.tool_calls] == [call_id]
    assert waiting.tool_calls[0].function.name == "get_weather"
    assert '"input"' in waiting.tool_calls[0].function.arguments
    # History ends with the call (its result comes next), no empty answer.
    history = await client.history(sid)
    assert [m.role for m in history] == ["user", "assistant"]
    assert history[-1].tool_calls[0].id == call_id

    answer = await client2.send(
        sid,
        "",
        tool_results=[message_pb2.ToolResult(tool_call_id=call_id, content="sunny, 21 C")],
    )
    assert answer.outcome is None
    assert 'Your get_weather returned: "sunny, 21 C"' in answer.text
    history = await client.history(sid)
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
    assert (history[2].tool_call_id, history[2].content) == (call_id, "sunny, 21 C")
    assert not (await client.get_session(sid)).HasField("pause")
    # Answered once: a second answer is refused.
    with pytest.raises(NotWaitingError):
        await client.send(
            sid, "", tool_results=[message_pb2.ToolResult(tool_call_id=call_id, content="x")]
        )


async def test_wrong_answers_are_refused_and_change_nothing(client: AsyncClient) -> None:
    sid = (await client.create_session(agent="demo")).session_id
    # Answers to a session that waits for nothing.
    with pytest.raises(NotWaitingError):
        await client.send(sid, "", tool_results=[message_pb2.ToolResult(tool_call_id="c1")])
    first = await client.send(sid, "call get_weather", tools=[WEATHER])
    assert first.outcome is not None
    (call_id,) = first.outcome.pending_tool_call_ids
    before = await client.history(sid)
    # A plain message while the session waits: 409, naming what it waits for.
    with pytest.raises(AwaitingClientError) as awaiting:
        await client.send(sid, "hello?")
    assert awaiting.value.metadata["tool_call_ids"] == call_id
    # A wrong id, the right one twice, none at all, a resume it never asked.
    bad: list[dict[str, list[message_pb2.ToolResult] | list[message_pb2.ResumeEntry]]] = [
        {"tool_results": [message_pb2.ToolResult(tool_call_id="call_nope", content="x")]},
        {
            "tool_results": [
                message_pb2.ToolResult(tool_call_id=call_id, content="x"),
                message_pb2.ToolResult(tool_call_id=call_id, content="y"),
            ]
        },
        {"resume": [message_pb2.ResumeEntry(interrupt_id="int_x", status="resolved")]},
    ]
    for answers in bad:
        with pytest.raises(InvalidArgumentError) as invalid:
            await client.send(sid, "", **answers)  # type: ignore[arg-type]
        assert call_id in str(invalid.value) or "twice" in str(invalid.value)
    with pytest.raises(InvalidArgumentError) as blank:
        await client.send(
            sid, "", resume=[message_pb2.ResumeEntry(interrupt_id="i", status="maybe")]
        )
    assert "resume[0].status" in blank.value.violations
    long_id = "c" * 257  # ids are bounded: errors and logs echo them
    with pytest.raises(InvalidArgumentError) as too_long:
        await client.send(
            sid,
            "",
            tool_results=[message_pb2.ToolResult(tool_call_id=long_id)],
            resume=[message_pb2.ResumeEntry(interrupt_id=long_id, status="resolved")],
        )
    assert {"tool_results[0].tool_call_id", "resume[0].interrupt_id"} <= set(
        too_long.value.violations
    )
    assert await client.history(sid) == before
    assert (await client.get_session(sid)).pause.turn_id == first.turn_id


async def test_an_approval_granted_runs_the_tool_and_one_denied_does_not(
    client: AsyncClient,
) -> None:
    for approved, expected in ((True, "Approved: calculator returned 42"), (False, "did not")):
        sid = (await client.create_session(agent="demo")).session_id
        first = await client.send(sid, "What is 6*7, with approval?")
        outcome = first.outcome
        assert outcome is not None and outcome.type == "interrupt"
        (interrupt,) = outcome.interrupts
        assert interrupt.reason == "tool_approval" and interrupt.tool_call_id
        assert interrupt.HasField("expires_at")
        assert [e.tool_call_name for e in first.tool_calls] == ["calculator"]
        entry = message_pb2.ResumeEntry(
            interrupt_id=interrupt.id, status="resolved", payload=_value({"approved": approved})
        )
        answer = await client.send(sid, "", resume=[entry])
        assert expected in answer.text
        results = [e for e in answer.events if e.type == event_pb2.TOOL_CALL_RESULT]
        assert [r.tool_call_id for r in results] == [interrupt.tool_call_id]
        history = await client.history(sid)
        # The gated call is answered right after the message that made it.
        assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
        assert history[1].tool_calls[0].id == history[2].tool_call_id


async def test_an_approval_answered_with_a_message_or_cancelled_keeps_history_well_formed(
    client: AsyncClient,
) -> None:
    """The gated call's result answers the message that made the call: it
    comes before the turn's user message (a chat model refuses a tool
    message anywhere else), whether the approval came with a message, was
    cancelled, or expired into the server's own answer."""

    async def paused() -> tuple[str, event_pb2.Interrupt]:
        sid = (await client.create_session(agent="demo")).session_id
        first = await client.send(sid, "What is 6*7, with approval?")
        assert first.outcome is not None
        (interrupt,) = first.outcome.interrupts
        return sid, interrupt

    sid, interrupt = await paused()
    yes = message_pb2.ResumeEntry(
        interrupt_id=interrupt.id, status="resolved", payload=_value({"approved": True})
    )
    await client.send(sid, "go ahead please", resume=[yes])
    history = await client.history(sid)
    assert [m.role for m in history] == ["user", "assistant", "tool", "user", "assistant"]
    assert history[2].tool_call_id == interrupt.tool_call_id and history[2].content == "42"
    assert history[3].content == "go ahead please"

    sid, interrupt = await paused()
    turn_id = (await client.get_session(sid)).pause.turn_id
    await client.cancel_turn(sid, turn_id)
    await client.send(sid, "never mind")
    history = await client.history(sid)
    assert [m.role for m in history] == ["user", "assistant", "tool", "user", "assistant"]
    assert history[2].tool_call_id == interrupt.tool_call_id
    assert "not approved" in history[2].content + history[2].error


async def test_a_fork_of_a_paused_approval_waits_for_the_approval_again(
    client: AsyncClient,
) -> None:
    """History keeps what a paused turn asked: a fork at that turn waits for
    the same approval (never for a result of the agent's own call), and
    answering it there runs the agent's tool."""
    sid = (await client.create_session(agent="demo")).session_id
    first = await client.send(sid, "What is 6*7, with approval?")
    assert first.outcome is not None
    (interrupt,) = first.outcome.interrupts
    history = await client.history(sid)
    assert [i.id for i in history[-1].interrupts] == [interrupt.id]
    assert not history[-1].interrupts[0].HasField("expires_at")
    # Answered in the source first: the fork at the paused turn still asks.
    yes = message_pb2.ResumeEntry(
        interrupt_id=interrupt.id, status="resolved", payload=_value({"approved": True})
    )
    await client.send(sid, "", resume=[yes])
    fork = await client.fork_session(sid, at_turn_id=first.turn_id)
    pause = fork.pause
    assert [i.id for i in pause.interrupts] == [interrupt.id]
    assert pause.interrupts[0].tool_call_id == interrupt.tool_call_id
    assert list(pause.tool_calls) == []  # the calculator's call is the agent's
    assert pause.interrupts[0].HasField("expires_at")
    fake = message_pb2.ToolResult(tool_call_id=interrupt.tool_call_id, content="666")
    with pytest.raises(InvalidArgumentError):
        await client.send(fork.session_id, "", tool_results=[fake])
    no = message_pb2.ResumeEntry(
        interrupt_id=interrupt.id, status="resolved", payload=_value({"approved": False})
    )
    denied = await client.send(fork.session_id, "", resume=[no])
    assert "did not" in denied.text
    roles = [m.role for m in await client.history(fork.session_id)]
    assert roles == ["user", "assistant", "tool", "assistant"]


async def test_an_approval_beside_the_agents_own_call_keeps_history_well_formed(
    client: AsyncClient,
) -> None:
    """One paused message with a gated call and a call of the agent's own,
    whose result follows it: a fork there waits for the approval, and each
    answer's result goes with the results of its message (as chat models
    require), in the session and in the fork."""
    sid = (await client.create_session(agent="probe")).session_id
    first = await client.send(sid, "mixed approval")
    assert first.outcome is not None
    (interrupt,) = first.outcome.interrupts
    fork = await client.fork_session(sid, at_turn_id=first.turn_id)
    assert [i.id for i in fork.pause.interrupts] == [interrupt.id]
    assert list(fork.pause.tool_calls) == []
    yes = message_pb2.ResumeEntry(
        interrupt_id=interrupt.id, status="resolved", payload=_value({"approved": True})
    )
    for session_id in (sid, fork.session_id):
        await client.send(session_id, "", resume=[yes])
        history = await client.history(session_id)
        assert [(m.role, m.tool_call_id or m.content) for m in history[1:]] == [
            ("assistant", ""),
            ("tool", history[1].tool_calls[1].id),  # lookup's, from the paused turn
            ("tool", interrupt.tool_call_id),  # deploy's, once approved
            ("assistant", "resume resolved"),
        ]
        assert history[3].content == "deployed"


async def test_an_approval_of_a_call_named_like_a_client_tool_is_asked(
    client: AsyncClient,
) -> None:
    """The agent's own tool wins a name clash with the caller's: its call
    waits for approval, as it would without the caller's tool."""
    sid = (await client.create_session(agent="demo")).session_id
    calculator = message_pb2.ToolDefinition(name="calculator", description="the client's")
    first = await client.send(sid, "What is 6*7, with approval?", tools=[calculator])
    assert first.outcome is not None and first.outcome.type == "interrupt"
    assert list(first.outcome.pending_tool_call_ids) == []
    (interrupt,) = first.outcome.interrupts
    yes = message_pb2.ResumeEntry(
        interrupt_id=interrupt.id, status="resolved", payload=_value({"approved": True})
    )
    assert "42" in (await client.send(sid, "", resume=[yes])).text


@pytest.mark.parametrize(
    "calls",
    [
        [message_pb2.ToolCall(id="", function=message_pb2.FunctionCall(name="x"))],
        [message_pb2.ToolCall(id="c" * 257, function=message_pb2.FunctionCall(name="x"))],
        [
            message_pb2.ToolCall(id="c1", function=message_pb2.FunctionCall(name="x")),
            message_pb2.ToolCall(id="c1", function=message_pb2.FunctionCall(name="y")),
        ],
    ],
)
async def test_seeded_calls_nobody_could_answer_are_refused(
    client: AsyncClient, calls: list[message_pb2.ToolCall]
) -> None:
    history = [
        message_pb2.Message(role="user", content="hi"),
        message_pb2.Message(role="assistant", tool_calls=calls),
    ]
    with pytest.raises(InvalidArgumentError, match=r"messages\[1\]\.tool_calls"):
        await client.create_session(agent="demo", messages=history)


async def test_a_seeded_tool_reply_to_no_call_is_refused(rest: httpx.AsyncClient) -> None:
    """Over REST a call is `tool_calls`: a `toolCalls` is dropped unread, and
    the reply it leaves behind answers nothing, which a model refuses."""
    calls = [{"id": "call_1", "function": {"name": "w"}}]
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "toolCalls": calls},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    refused = await rest.post("/v1/sessions", json={"messages": history})
    assert refused.status_code == 400, refused.text
    fields = [v["field"] for v in refused.json()["violations"]]
    assert fields == ["messages[2].tool_call_id"]
    history[1] = {"role": "assistant", "tool_calls": calls}
    assert (await rest.post("/v1/sessions", json={"messages": history})).status_code == 200


async def test_a_question_is_answered_with_a_payload(client: AsyncClient) -> None:
    sid = (await client.create_session(agent="demo")).session_id
    first = await client.send(sid, "please ask me something")
    assert first.outcome is not None
    (question,) = first.outcome.interrupts
    assert question.reason == "question"
    assert question.response_schema["type"] == "object"
    entry = message_pb2.ResumeEntry(
        interrupt_id=question.id, status="resolved", payload=_value({"color": "green"})
    )
    answer = await client.send(sid, "", resume=[entry])
    assert 'You answered: "green"' in answer.text
    # Then the conversation goes on as usual.
    assert "message 2 of our conversation" in (await client.send(sid, "hi")).text


async def test_a_cancelled_pause_tells_the_agent_on_the_next_turn(client: AsyncClient) -> None:
    sid = (await client.create_session(agent="demo")).session_id
    first = await client.send(sid, "use get_weather", tools=[WEATHER])
    assert first.outcome is not None
    (call_id,) = first.outcome.pending_tool_call_ids
    state = await client.cancel_turn(sid, first.turn_id)
    assert state == 5  # TURN_STATE_CANCELLED
    assert not (await client.get_session(sid)).HasField("pause")
    with pytest.raises(NotWaitingError) as late:
        await client.send(sid, "", tool_results=[message_pb2.ToolResult(tool_call_id=call_id)])
    assert late.value.metadata["why"] == "cancelled"
    after = await client.send(sid, "hello again")
    assert "hello again" in after.text
    history = await client.history(sid)
    # The unanswered call got an error result before the new message.
    assert [m.role for m in history] == ["user", "assistant", "tool", "user", "assistant"]
    assert history[2].tool_call_id == call_id and history[2].error


async def test_while_the_answer_runs_more_answers_and_interrupting_messages_are_refused(
    client: AsyncClient, shared_mesh: SharedMesh
) -> None:
    """Answers are taken only by a session that waits; an INTERRUPT message
    does not cancel the turn carrying the client's answers (that would throw
    them away and leave the session waiting for them again)."""
    sid = (await client.create_session(agent="probe")).session_id
    first = await client.send(sid, "mixed calls", tools=[WEATHER])
    assert first.outcome is not None
    (call_id,) = first.outcome.pending_tool_call_ids
    result = [message_pb2.ToolResult(tool_call_id=call_id, content="rain")]
    # The answer runs until the test opens its gate (a file the agent polls).
    gate = uuid.uuid4().hex
    running = client.stream_turn(sid, "", tool_results=result, metadata={"gate": gate})
    events = [await anext(aiter(running))]
    while events[-1].type != event_pb2.TEXT_MESSAGE_CONTENT:
        events.append(await anext(aiter(running)))
    with pytest.raises(SessionBusyError):
        await client.send(sid, "", tool_results=result)
    with pytest.raises(SessionBusyError, match="answers its pause"):
        await client.send(sid, "stop", policy="interrupt")
    (shared_mesh.mesh.probe_dir / f"gate-{gate}").write_text("open")
    events += [event async for event in running]
    assert events[-1].type == event_pb2.RUN_FINISHED
    assert not (await client.get_session(sid)).HasField("pause")
    history = await client.history(sid)
    assert [m.role for m in history] == ["user", "assistant", "tool", "tool", "assistant"]
    assert (history[3].tool_call_id, history[3].content) == (call_id, "rain")
    # Once it ended, an interrupting message runs as usual.
    assert (await client.send(sid, "stop", policy="interrupt")).events[-1].type == (
        event_pb2.RUN_FINISHED
    )


async def test_rest_shows_the_pause_and_takes_the_answer(
    shared_mesh: SharedMesh, rest: httpx.AsyncClient
) -> None:
    created = (await rest.post("/v1/sessions", json={"agentName": "demo"})).json()
    sid = created["session"]["sessionId"]
    tools = [{"name": "lookup", "description": "look it up", "parameters": {"type": "object"}}]
    body = {"message": "lookup the answer", "tools": tools}
    events = (await rest.post(f"/v1/sessions/{sid}/turns", json=body)).text
    assert '"pendingToolCallIds"' in events
    session = (await rest.get(f"/v1/sessions/{sid}")).json()["session"]
    call = session["pause"]["toolCalls"][0]
    assert call["function"]["name"] == "lookup"
    refused = await rest.post(f"/v1/sessions/{sid}/turns", json={"message": "hi"})
    assert refused.status_code == 409
    assert "awaiting-client" in refused.json()["type"]
    answer = {"toolResults": [{"toolCallId": call["id"], "content": "42"}]}
    done = await rest.post(f"/v1/sessions/{sid}/turns", json=answer)
    assert '"RUN_FINISHED"' in done.text and "pendingToolCallIds" not in done.text
    history = (await rest.get(f"/v1/sessions/{sid}/history")).json()["messages"]
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant"]
    assert history[-1]["content"].startswith('Your lookup returned: "42"')
    assert "pause" not in (await rest.get(f"/v1/sessions/{sid}")).json()["session"]


async def test_history_that_ends_in_calls_seeds_a_session_that_waits_for_them(
    client: AsyncClient, client2: AsyncClient
) -> None:
    """How a stateless caller continues a tool loop: the history up to the
    calls seeds a session, and the results are its first turn."""
    call = message_pb2.ToolCall(id="call_seed_1", type="function")
    call.function.name = "get_weather"
    call.function.arguments = '{"city": "Oslo"}'
    seed = [
        message_pb2.Message(role="user", content="weather in Oslo?"),
        message_pb2.Message(role="assistant", tool_calls=[call]),
    ]
    sid = (await client.create_session(agent="demo", messages=seed)).session_id
    waiting = (await client2.get_session(sid)).pause
    assert [c.id for c in waiting.tool_calls] == ["call_seed_1"] and not waiting.turn_id
    with pytest.raises(AwaitingClientError) as refused:
        await client.send(sid, "hi")
    assert "seeded history" in str(refused.value)
    with pytest.raises(InvalidArgumentError):
        await client.send(sid, "", tool_results=[message_pb2.ToolResult(tool_call_id="other")])
    result = [message_pb2.ToolResult(tool_call_id="call_seed_1", content="snow")]
    answer = await client2.send(sid, "", tool_results=result)
    assert 'Your get_weather returned: "snow"' in answer.text
    assert [m.role for m in await client.history(sid)] == ["user", "assistant", "tool", "assistant"]
    # History whose calls are answered seeds a session that waits for nothing.
    answered = [*seed, message_pb2.Message(role="tool", tool_call_id="call_seed_1", content="ok")]
    other = await client.create_session(agent="demo", messages=answered)
    assert not other.HasField("pause")
