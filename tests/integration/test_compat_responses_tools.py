"""Function tools and pauses on /v1/responses, through Envoy: the real openai
SDK runs a function-tool loop (with previous_response_id and stateless,
streamed and not), an approval as OpenAI's mcp_approval_request, a question
(no shape in this API: an incomplete response, answered with ``resume``),
openai-agents runs its @function_tool against the mesh, and every wrong
answer is refused with nothing changed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, cast

import httpx
import openai
import pytest
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai.types.responses import ResponseFunctionToolCall

from tests.conftest import SharedMesh
from turnmesh.server.compat.openai_responses import parse_response_id

WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"input": {"type": "string"}},
        "required": ["input"],
        "additionalProperties": False,
    },
    "strict": True,
}


@pytest.fixture
async def sdk(shared_mesh: SharedMesh) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(
        base_url=f"http://{shared_mesh.edge}/v1", api_key="not-needed", max_retries=0
    )
    yield client
    await client.close()


async def _history(rest: httpx.AsyncClient, response_id: str) -> list[dict[str, Any]]:
    session_id, _ = parse_response_id(response_id, "id")
    answer = await rest.get(f"/v1/sessions/{session_id}/history")
    messages: list[dict[str, Any]] = answer.json().get("messages", [])
    return messages


def _calls(response: Any) -> list[ResponseFunctionToolCall]:
    return [item for item in response.output if item.type == "function_call"]


async def test_a_function_tool_loop_with_previous_response_id(
    sdk: openai.AsyncOpenAI, rest: httpx.AsyncClient
) -> None:
    first = await sdk.responses.create(
        model="demo", input="what does get_weather say for Paris?", tools=[WEATHER]
    )
    assert first.status == "completed"
    # The agent said nothing: the output is the call alone.
    (call,) = first.output
    assert isinstance(call, ResponseFunctionToolCall)
    assert call.name == "get_weather" and call.status == "completed"
    assert call.id and call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"input": "what does get_weather say for Paris?"}
    assert [t.name for t in first.tools if t.type == "function"] == ["get_weather"]
    # Retrieved while it waits: the same call.
    stored = await sdk.responses.retrieve(first.id)
    assert [(c.id, c.call_id, c.arguments) for c in _calls(stored)] == [
        (call.id, call.call_id, call.arguments)
    ]
    # A plain message while it waits: 409, naming the call, never retried.
    with pytest.raises(openai.ConflictError) as waiting:
        await sdk.responses.create(model="demo", input="hello?", previous_response_id=first.id)
    assert waiting.value.code == "awaiting_client"
    assert waiting.value.param == "input"
    assert call.call_id in waiting.value.message and "function_call_output" in waiting.value.message
    assert waiting.value.response.headers["x-should-retry"] == "false"

    answer = await sdk.responses.create(
        model="demo",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}],
        tools=[WEATHER],
    )
    assert answer.status == "completed"
    assert answer.output_text.startswith('Your get_weather returned: "sunny, 21 C"')
    assert _calls(answer) == []
    history = await _history(rest, answer.id)
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant"]
    assert history[2]["tool_call_id"] == call.call_id
    # The conversation goes on as usual.
    after = await sdk.responses.create(
        model="demo", input="what did I ask first?", previous_response_id=answer.id
    )
    assert "what does get_weather say for Paris?" in after.output_text


async def test_a_streamed_function_tool_loop(sdk: openai.AsyncOpenAI) -> None:
    async with sdk.responses.stream(
        model="demo", input="call get_weather for Oslo", tools=[WEATHER]
    ) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added, delta, done, item_done = events[2:6]
    assert added.type == "response.output_item.added"
    assert added.item.type == "function_call"
    assert (added.item.status, added.item.arguments) == ("in_progress", "")
    assert delta.type == "response.function_call_arguments.delta"
    assert done.type == "response.function_call_arguments.done"
    assert item_done.type == "response.output_item.done"
    assert delta.item_id == done.item_id == added.item.id == item_done.item.id
    assert delta.output_index == done.output_index == added.output_index == 0
    assert json.loads(done.arguments) == {"input": "call get_weather for Oslo"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    (call,) = _calls(final)
    assert call.arguments == done.arguments and call.status == "completed"

    async with sdk.responses.stream(
        model="demo",
        previous_response_id=final.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "snow"}],
    ) as stream:
        events = [event async for event in stream]
        answer = await stream.get_final_response()
    assert 'Your get_weather returned: "snow"' in answer.output_text
    assert [e.type for e in events][-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]


async def test_the_stateless_loop_resends_the_whole_input(
    sdk: openai.AsyncOpenAI, rest: httpx.AsyncClient
) -> None:
    """What openai-agents does by default: no previous_response_id, the
    input resent with the call and its output (and the agent's own words)."""
    asked: Any = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hi!", "annotations": []}],
        },
        {"role": "user", "content": "ask get_weather about Rome"},
    ]
    first = await sdk.responses.create(model="demo", input=asked, tools=[WEATHER])
    (call,) = _calls(first)
    replayed: Any = call.model_dump(exclude_unset=True)
    assert set(replayed) >= {"id", "call_id", "name", "arguments", "type", "status"}
    answer = await sdk.responses.create(
        model="demo",
        input=[
            *asked,
            replayed,
            {"type": "function_call_output", "call_id": call.call_id, "output": "warm"},
        ],
        tools=[WEATHER],
    )
    assert answer.output_text.startswith('Your get_weather returned: "warm"')
    # A new conversation, seeded with the input: the call and its result in order.
    assert parse_response_id(answer.id, "id")[0] != parse_response_id(first.id, "id")[0]
    history = await _history(rest, answer.id)
    assert [m["role"] for m in history] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert history[4]["tool_calls"][0]["id"] == call.call_id
    assert history[4]["tool_calls"][0]["function"]["name"] == "get_weather"
    # An output with a new message after it: both reach the agent.
    both = await sdk.responses.create(
        model="demo",
        input=[
            *asked,
            replayed,
            {"type": "function_call_output", "call_id": call.call_id, "output": "warm"},
            {"role": "user", "content": "thanks"},
        ],
    )
    assert 'returned: "warm"' in both.output_text and 'You also said: "thanks"' in both.output_text


async def test_tool_choice_none_declares_no_tools(sdk: openai.AsyncOpenAI) -> None:
    answer = await sdk.responses.create(
        model="demo", input="call get_weather", tools=[WEATHER], tool_choice="none"
    )
    assert _calls(answer) == [] and "call get_weather" in answer.output_text
    named = await sdk.responses.create(
        model="demo",
        input="call get_weather",
        tools=[cast(Any, {**WEATHER, "name": "other"}), WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
    )
    assert [c.name for c in _calls(named)] == ["get_weather"]


async def test_an_approval_is_an_mcp_approval_request(sdk: openai.AsyncOpenAI) -> None:
    for approve, expected in ((True, "Approved: calculator returned 42"), (False, "did not")):
        first = await sdk.responses.create(model="demo", input="What is 6*7, with approval?")
        assert first.status == "completed"
        (request,) = [item for item in first.output if item.type == "mcp_approval_request"]
        assert request.name == "calculator" and request.server_label == "demo"
        assert json.loads(request.arguments) == {"expression": "6*7"}
        with pytest.raises(openai.BadRequestError) as wrong:
            await sdk.responses.create(
                model="demo",
                previous_response_id=first.id,
                input=[
                    {
                        "type": "mcp_approval_response",
                        "approval_request_id": "int_x",
                        "approve": True,
                    }
                ],
            )
        assert wrong.value.param == "input[0].approval_request_id"
        assert request.id in wrong.value.message
        answer = await sdk.responses.create(
            model="demo",
            previous_response_id=first.id,
            input=[
                {
                    "type": "mcp_approval_response",
                    "approval_request_id": request.id,
                    "approve": approve,
                }
            ],
        )
        assert expected in answer.output_text


async def test_an_answered_approval_is_answered_again_in_a_branch(
    sdk: openai.AsyncOpenAI,
) -> None:
    """Approved once; then, from the same response, denied: the branch waits
    for the approval the paused response asked, as the first time."""
    first = await sdk.responses.create(model="demo", input="What is 6*7, with approval?")
    (request,) = [item for item in first.output if item.type == "mcp_approval_request"]

    def answer(approve: bool) -> list[Any]:
        return [
            {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": approve}
        ]

    approved = await sdk.responses.create(
        model="demo", previous_response_id=first.id, input=answer(True)
    )
    assert "Approved: calculator returned 42" in approved.output_text
    denied = await sdk.responses.create(
        model="demo", previous_response_id=first.id, input=answer(False)
    )
    assert "did not" in denied.output_text


async def test_a_streamed_approval_request(sdk: openai.AsyncOpenAI) -> None:
    async with sdk.responses.stream(model="demo", input="What is 2+3 with approval") as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [e.item.type for e in added] == ["mcp_approval_request"]
    (request,) = [item for item in final.output if item.type == "mcp_approval_request"]
    assert request.id == added[0].item.id


async def test_a_question_is_incomplete_and_answered_with_resume(
    sdk: openai.AsyncOpenAI,
) -> None:
    first = await sdk.responses.create(model="demo", input="please ask me something")
    # It does not look done: it waits for an answer this API has no shape for.
    assert first.status == "incomplete"
    assert first.to_dict()["incomplete_details"] == {"reason": "interrupt"}
    assert first.output_text == "Which color do you like?"
    (question,) = (first.model_extra or {})["interrupts"]
    assert question["reason"] == "question"
    assert question["response_schema"]["required"] == ["color"]
    with pytest.raises(openai.ConflictError) as waiting:
        await sdk.responses.create(model="demo", input="green", previous_response_id=first.id)
    assert waiting.value.code == "awaiting_client"
    assert question["id"] in waiting.value.message and "resume" in waiting.value.message
    answer = await sdk.responses.create(
        model="demo",
        input=[],
        previous_response_id=first.id,
        extra_body={
            "resume": [{"interrupt_id": question["id"], "status": "resolved", "payload": "green"}]
        },
    )
    assert answer.status == "completed"
    assert answer.output_text == 'You answered: "green".'


async def test_a_streamed_question_ends_incomplete(sdk: openai.AsyncOpenAI) -> None:
    async with sdk.responses.stream(model="demo", input="ask me a question") as stream:
        events = [event async for event in stream]
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output_text == "Which color do you like?"


async def test_wrong_answers_are_refused_and_change_nothing(
    sdk: openai.AsyncOpenAI, rest: httpx.AsyncClient
) -> None:
    first = await sdk.responses.create(model="demo", input="use get_weather", tools=[WEATHER])
    (call,) = _calls(first)
    before = await _history(rest, first.id)

    def output(call_id: str, text: str = "x") -> Any:
        return {"type": "function_call_output", "call_id": call_id, "output": text}

    wrong: list[tuple[Any, str]] = [
        ([output("call_nope")], "input[0].call_id"),
        ([output(call.call_id), output(call.call_id)], "input[1].call_id"),
        ([{"type": "function_call_output", "output": "x"}], "input[0].call_id"),
        (
            [{"type": "mcp_approval_response", "approval_request_id": "int_x", "approve": True}],
            "input",
        ),
    ]
    for items, param in wrong:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.responses.create(model="demo", previous_response_id=first.id, input=items)
        assert refused.value.param == param, items
    assert await _history(rest, first.id) == before
    # Answers to a response that waits for none: 409.
    plain = await sdk.responses.create(model="demo", input="hi")
    with pytest.raises(openai.ConflictError) as not_waiting:
        await sdk.responses.create(
            model="demo", previous_response_id=plain.id, input=[output(call.call_id)]
        )
    assert not_waiting.value.code == "not_waiting"
    assert not_waiting.value.response.headers["x-should-retry"] == "false"
    # The pause is still there, and answered right it goes on.
    answer = await sdk.responses.create(
        model="demo", previous_response_id=first.id, input=[output(call.call_id, "fog")]
    )
    assert 'returned: "fog"' in answer.output_text


async def test_stateless_answers_must_answer_the_inputs_own_calls(
    sdk: openai.AsyncOpenAI,
) -> None:
    call: Any = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": "{}",
    }
    user: Any = {"role": "user", "content": "weather?"}
    out: Any = {"type": "function_call_output", "call_id": "call_1", "output": "ok"}
    wrong: list[tuple[Any, str]] = [
        ([user, out], "input[1].call_id"),  # no call before it
        ([user, call, out, out], "input[3].call_id"),  # twice
        ([user, call, {**out, "call_id": "call_2"}], "input[2].call_id"),
        ([user, call, {"role": "user", "content": "and?"}], "input"),  # a call left unanswered
        (
            [
                user,
                {"type": "mcp_approval_response", "approval_request_id": "i", "approve": True},
            ],
            "input[1].approval_request_id",  # no approval request before it
        ),
        ([user, call, {**out, "output": [{"type": "input_image"}]}], "input[2].output[0].type"),
        ([user, {"type": "web_search_call"}], "input[1].type"),
    ]
    for items, param in wrong:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.responses.create(model="demo", input=items)
        assert refused.value.param == param, items
    # Tools OpenAI hosts, and a tool_choice that names no tool of the request.
    with pytest.raises(openai.BadRequestError) as hosted:
        await sdk.responses.create(model="demo", input="hi", tools=[{"type": "web_search"}])
    assert hosted.value.param == "tools[0].type"
    with pytest.raises(openai.BadRequestError) as badly_named:
        await sdk.responses.create(
            model="demo", input="hi", tools=[cast(Any, {**WEATHER, "name": "no spaces allowed"})]
        )
    assert badly_named.value.param == "tools[0].name"
    with pytest.raises(openai.BadRequestError) as choice:
        await sdk.responses.create(
            model="demo",
            input="hi",
            tools=[WEATHER],
            tool_choice={"type": "function", "name": "nope"},
        )
    assert choice.value.param == "tool_choice.name"


# openai-agents ---------------------------------------------------------------


@function_tool
def secret_word(input: str) -> str:  # the demo agent's arguments: {"input": <message>}
    """The secret word of the day."""
    return f"swordfish ({len(input)} characters asked)"


class Recorded:
    """An AsyncOpenAI client whose request bodies to /v1/responses are kept."""

    def __init__(self, shared_mesh: SharedMesh) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.http = openai.DefaultAsyncHttpxClient(
            event_hooks={"request": [self._keep]}, timeout=60
        )
        self.sdk = openai.AsyncOpenAI(
            base_url=f"http://{shared_mesh.edge}/v1",
            api_key="not-needed",
            max_retries=0,
            http_client=self.http,
        )

    async def _keep(self, request: Any) -> None:
        if request.url.path == "/v1/responses":
            self.bodies.append(json.loads(request.content))

    def agent(self) -> Agent[Any]:
        set_tracing_disabled(True)
        return Agent(
            name="assistant",
            instructions="Use your tools.",
            tools=[secret_word],
            model=OpenAIResponsesModel(model="demo", openai_client=self.sdk),
        )


@pytest.fixture
async def recorded(shared_mesh: SharedMesh) -> AsyncIterator[Recorded]:
    client = Recorded(shared_mesh)
    yield client
    await client.sdk.close()
    await client.http.aclose()


def _expected(message: str) -> str:
    return f'Your secret_word returned: "swordfish ({len(message)} characters asked)"'


async def test_openai_agents_runs_its_function_tool_against_the_mesh(
    recorded: Recorded,
) -> None:
    message = "what is the secret_word today?"
    result = await Runner.run(recorded.agent(), message)
    assert _expected(message) in result.final_output
    # The tool ran in this process, between two calls of the mesh.
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    # The second call resent the whole input: no previous response.
    first, second = recorded.bodies
    assert first["tools"][0]["name"] == "secret_word"
    assert "previous_response_id" not in second
    assert [i.get("type", "message") for i in second["input"]] == [
        "message",
        "function_call",
        "function_call_output",
    ]


async def test_openai_agents_streamed_and_chained_by_response_id(recorded: Recorded) -> None:
    message = "tell me the secret_word"
    streamed = Runner.run_streamed(recorded.agent(), message)
    kinds = [event.type async for event in streamed.stream_events()]
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
    assert _expected(message) in streamed.final_output
    assert all(body["stream"] is True for body in recorded.bodies)
    recorded.bodies.clear()
    # Chained: only the new items each call, the mesh keeps the conversation.
    chained = await Runner.run(recorded.agent(), message, auto_previous_response_id=True)
    assert _expected(message) in chained.final_output
    first, second = recorded.bodies
    assert "previous_response_id" not in first
    assert second["previous_response_id"].startswith("resp_")
    assert [i["type"] for i in second["input"]] == ["function_call_output"]


async def _sessions(rest: httpx.AsyncClient) -> set[str]:
    """Every session's id (this test process's mesh; nothing else runs in it now)."""
    ids: set[str] = set()
    token = ""
    while True:
        page = (await rest.get("/v1/sessions", params={"pageSize": 100, "pageToken": token})).json()
        ids.update(s["sessionId"] for s in page.get("sessions", []))
        token = page.get("nextPageToken", "")
        if not token:
            return ids


def _deep(levels: int) -> Any:
    value: Any = {}
    for _ in range(levels):
        value = {"d": value}
    return value


async def test_hostile_tools_and_answers_are_400_and_leave_no_session(
    sdk: openai.AsyncOpenAI, rest: httpx.AsyncClient
) -> None:
    first = await sdk.responses.create(model="demo", input="use get_weather", tools=[WEATHER])
    (call,) = _calls(first)
    answered = {"type": "function_call_output", "call_id": call.call_id, "output": "sun"}
    # A later turn in the same session: answering `first` again forks it.
    later = await sdk.responses.create(
        model="demo", previous_response_id=first.id, input=[cast(Any, answered)]
    )
    assert not _calls(later)
    before = await _sessions(rest)

    def tool(parameters: Any) -> Any:
        return {"type": "function", "name": "t", "parameters": parameters}

    resume_entry: Any = {"interrupt_id": "i", "status": "resolved"}
    wrong: list[tuple[dict[str, Any], int, str]] = [
        ({"input": "hi", "tools": [tool(_deep(40))]}, 400, "tools[0].parameters"),
        ({"input": "hi", "tools": [tool({"maximum": 10**400})]}, 400, "tools[0].parameters"),
        ({"input": "hi", "tools": [tool({"maximum": float("nan")})]}, 400, "tools[0].parameters"),
        (
            {"input": "hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": [1]}},
            400,
            "tool_choice.name",
        ),
        (
            {
                "input": "hi",
                "tools": [WEATHER],
                "tool_choice": {
                    "type": "allowed_tools",
                    "tools": [{"type": "function", "name": {}}],
                },
            },
            400,
            "tool_choice.tools[0]",
        ),
        (
            {
                "previous_response_id": first.id,
                "input": [answered],
                "resume": [{**resume_entry, "payload": _deep(40)}],
            },
            400,
            "resume[0].payload",
        ),
        # Refused by the turn once the session it seeds (or the fork) was
        # made: that session is deleted again.
        ({"input": [{"role": "user", "content": "x" * 10_001}]}, 400, "input[0].content"),
        (
            {
                "previous_response_id": first.id,
                "input": [answered],
                "resume": [resume_entry],
            },
            400,
            "resume[0].interrupt_id",
        ),
    ]
    # A file refused after the fork's history was read: no fork is made.
    bad_image: Any = {"type": "input_image", "image_url": "data:image/png;base64,!!!"}
    wrong.append(
        (
            {
                "previous_response_id": first.id,
                "input": [
                    {"role": "user", "content": [{"type": "input_text", "text": "x"}, bad_image]}
                ],
            },
            400,
            "input[0].content[1]",
        )
    )
    for body, status, param in wrong:
        # json.dumps, not httpx's encoder: it writes NaN, as hostile clients do.
        refused = await rest.post(
            "/v1/responses",
            content=json.dumps({"model": "demo", **body}),
            headers={"content-type": "application/json"},
        )
        assert refused.status_code == status, (body, refused.text)
        assert refused.json()["error"]["param"].startswith(param), (body, refused.text)
    assert await _sessions(rest) == before
