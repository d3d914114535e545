"""Client tools and pauses on OpenAI chat completions, with the official
openai SDK through Envoy: the tool loop (non-streamed, streamed, the SDK's
stream helper), stateless and with X-Session-Id; approvals and questions
(the ``interrupts`` extension, answered by ``resume``); and every wrong
answer refused in OpenAI's error shape."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any, cast

import httpx
import openai
import pytest

from tests.conftest import SharedMesh

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"input": {"type": "string"}},
            "required": ["input"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
TIME: Any = {"type": "function", "function": {"name": "get_time"}}
ASK = "what does get_weather say for Paris?"


@pytest.fixture
async def sdk(shared_mesh: SharedMesh) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(
        base_url=f"http://{shared_mesh.edge}/v1", api_key="not-needed", max_retries=0
    )
    yield client
    await client.close()


def _sid() -> str:
    return f"tools-{uuid.uuid4().hex[:12]}"


def _as_param(message: Any) -> Any:
    """An answer's message as the next request sends it back (the SDK's own
    model, dumped as the OpenAI cookbook does)."""
    return message.model_dump(exclude_none=True)


async def test_a_stateless_tool_loop_resends_the_conversation(
    sdk: openai.AsyncOpenAI, rest: httpx.AsyncClient
) -> None:
    messages: list[Any] = [{"role": "user", "content": ASK}]
    raw = await sdk.chat.completions.with_raw_response.create(
        model="demo", messages=messages, tools=[WEATHER, TIME], tool_choice="auto"
    )
    first = raw.parse()
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"input": ASK}
    # No X-Session-Id: the throw-away session is gone, the conversation is the state.
    gone = await rest.get(f"/v1/sessions/{raw.headers['x-session-id']}")
    assert gone.status_code == 404

    messages += [
        _as_param(choice.message),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    second = await sdk.chat.completions.create(model="demo", messages=messages, tools=[WEATHER])
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == 'Your get_weather returned: "sunny, 21 C".'
    assert not second.choices[0].message.tool_calls

    # Text parts are a tool's result too; a user message after the results goes with them.
    third = await sdk.chat.completions.create(
        model="demo",
        messages=[
            *messages[:2],
            {
                "role": "tool",
                "tool_call_id": call.id,
                "content": [{"type": "text", "text": "rain"}],
            },
            {"role": "user", "content": "thanks"},
        ],
    )
    assert third.choices[0].message.content == (
        'Your get_weather returned: "rain". You also said: "thanks".'
    )


async def test_a_streamed_tool_call_is_openais_deltas(sdk: openai.AsyncOpenAI) -> None:
    stream = await sdk.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": ASK}],
        tools=[WEATHER],
        stream=True,
        stream_options={"include_usage": True},
    )
    deltas: list[Any] = []
    finish = []
    async for chunk in stream:
        for choice in chunk.choices:
            deltas += choice.delta.tool_calls or []
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    assert finish == ["tool_calls"]
    opening, *fragments = deltas
    # id, type and name on the first delta of the call only; then arguments.
    assert (opening.index, opening.type) == (0, "function")
    assert opening.id and opening.id.startswith("call_")
    assert opening.function is not None and opening.function.name == "get_weather"
    assert fragments
    for fragment in fragments:
        assert (fragment.index, fragment.id, fragment.type) == (0, None, None)
        assert fragment.function is not None and fragment.function.name is None
    arguments = "".join(f.function.arguments or "" for f in fragments)
    assert json.loads(arguments) == {"input": ASK}


async def test_the_sdks_stream_helper_runs_the_whole_loop(sdk: openai.AsyncOpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": ASK}]
    done = []
    async with sdk.chat.completions.stream(
        model="demo", messages=messages, tools=[WEATHER]
    ) as stream:
        async for event in stream:
            if event.type == "tool_calls.function.arguments.done":
                done.append((event.name, event.parsed_arguments))
        first = await stream.get_final_completion()
    # A strict tool's arguments are parsed by the helper itself.
    assert done == [("get_weather", {"input": ASK})]
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.parsed_arguments == {"input": ASK}

    messages += [
        _as_param(choice.message),
        {"role": "tool", "tool_call_id": call.id, "content": "cloudy"},
    ]
    async with sdk.chat.completions.stream(
        model="demo", messages=messages, tools=[WEATHER]
    ) as stream:
        second = await stream.get_final_completion()
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == 'Your get_weather returned: "cloudy".'


@pytest.mark.parametrize("streamed", [False, True])
async def test_with_x_session_id_the_tool_messages_answer_the_sessions_pause(
    sdk: openai.AsyncOpenAI, rest: httpx.AsyncClient, streamed: bool
) -> None:
    sid = _sid()
    headers = {"X-Session-Id": sid}
    messages: list[Any] = [{"role": "user", "content": ASK}]
    first = await _complete(sdk, messages, streamed, tools=[WEATHER], extra_headers=headers)
    (call,) = first.choices[0].message.tool_calls or []
    assert first.choices[0].finish_reason == "tool_calls"
    session = (await rest.get(f"/v1/sessions/{sid}")).json()["session"]
    assert [c["id"] for c in session["pause"]["toolCalls"]] == [call.id]

    # A plain message while it waits: 409, saying what it waits for and how to answer.
    with pytest.raises(openai.ConflictError) as awaiting:
        await sdk.chat.completions.create(
            model="demo",
            messages=[{"role": "user", "content": "hello?"}],
            extra_headers=headers,
        )
    assert awaiting.value.code == "awaiting_client"
    assert awaiting.value.param == "messages[0]"
    assert call.id in awaiting.value.message and '"tool"' in awaiting.value.message

    # The whole conversation or only the tool message: the session holds the rest.
    messages += [
        _as_param(first.choices[0].message),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    answer = await _complete(sdk, messages[-1:] if streamed else messages, streamed, headers)
    assert answer.choices[0].message.content == 'Your get_weather returned: "sunny".'
    history = (await rest.get(f"/v1/sessions/{sid}/history")).json()["messages"]
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant"]
    assert history[1]["tool_calls"][0]["id"] == call.id
    assert (history[2]["tool_call_id"], history[2]["content"]) == (call.id, "sunny")

    # Answered once: the same results again are 409, naming the tool message.
    with pytest.raises(openai.ConflictError) as again:
        await sdk.chat.completions.create(model="demo", messages=messages, extra_headers=headers)
    assert again.value.code == "not_waiting"
    assert again.value.param == "messages[2]"


async def _complete(
    sdk: openai.AsyncOpenAI,
    messages: list[Any],
    streamed: bool,
    extra_headers: dict[str, str],
    **options: Any,
) -> Any:
    """A completion, or the one the SDK's stream helper builds from the chunks."""
    if not streamed:
        return await sdk.chat.completions.create(
            model="demo", messages=messages, extra_headers=extra_headers, **options
        )
    async with sdk.chat.completions.stream(
        model="demo", messages=messages, extra_headers=extra_headers, **options
    ) as stream:
        return await stream.get_final_completion()


async def test_a_seeded_conversation_keeps_calls_and_replies_and_waits_for_the_rest(
    sdk: openai.AsyncOpenAI, rest: httpx.AsyncClient
) -> None:
    sid = _sid()
    calls = [
        {"id": "call_a", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": ""}},
    ]
    messages: list[Any] = [
        {"role": "user", "content": "what time is it?"},
        {"role": "assistant", "content": None, "tool_calls": calls[:1]},
        {"role": "tool", "tool_call_id": "call_a", "content": "noon"},
        {"role": "assistant", "content": "It is noon."},
        {"role": "user", "content": "and the weather?"},
        {"role": "assistant", "content": None, "tool_calls": calls[1:]},
        {"role": "tool", "tool_call_id": "call_b", "content": "hail"},
    ]
    answer = await sdk.chat.completions.create(
        model="demo", messages=messages, extra_headers={"X-Session-Id": sid}
    )
    assert answer.choices[0].message.content == 'Your get_weather returned: "hail".'
    history = (await rest.get(f"/v1/sessions/{sid}/history")).json()["messages"]
    assert [m["role"] for m in history] == [
        "user", "assistant", "tool", "assistant", "user", "assistant", "tool", "assistant"
    ]  # fmt: skip
    assert history[1]["tool_calls"][0]["id"] == "call_a"
    assert history[2]["tool_call_id"] == "call_a"
    assert history[5]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert (history[6]["tool_call_id"], history[6]["content"]) == ("call_b", "hail")


async def test_wrong_tool_results_are_openais_errors(sdk: openai.AsyncOpenAI) -> None:
    two: Any = {
        "role": "assistant",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        ],
    }
    asked: Any = {"role": "user", "content": "go"}

    async def refused(messages: list[Any], **options: Any) -> openai.BadRequestError:
        with pytest.raises(openai.BadRequestError) as info:
            await sdk.chat.completions.create(model="demo", messages=messages, **options)
        assert info.value.type == "invalid_request_error"
        return info.value

    def tool(call_id: str, content: str = "x") -> Any:
        return {"role": "tool", "tool_call_id": call_id, "content": content}

    unknown = await refused([asked, two, tool("c1"), tool("nope")])
    assert unknown.param == "messages[3].tool_call_id"
    assert "c1, c2" in unknown.message
    twice = await refused([asked, two, tool("c1"), tool("c1")])
    assert twice.param == "messages[3].tool_call_id" and "twice" in twice.message
    missing = await refused([asked, two, tool("c2")])
    assert missing.param == "messages" and "c1" in missing.message
    # OpenAI's rule: every call is answered before the user's next message.
    unanswered = await refused([asked, two, asked])
    assert unanswered.param == "messages[1].tool_calls"
    # A tool message with no assistant's calls before it answers nothing.
    orphan = await refused([asked, tool("c1")])
    assert orphan.param == "messages[1].role"
    image: Any = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]
    assert (await refused([asked, two, tool("c1"), tool("c2", image)])).param == (
        "messages[3].content[0].type"
    )
    assert (await refused([asked, two, {"role": "tool", "content": "x"}])).param == (
        "messages[2].tool_call_id"
    )
    # The declared tools and the choice among them.
    custom: Any = [{"type": "custom", "custom": {"name": "grammar"}}]
    assert (await refused([asked], tools=custom)).param == "tools[0].type"
    bad_name: Any = [{"type": "function", "function": {"name": "no spaces"}}]
    assert (await refused([asked], tools=bad_name)).param == "tools[0].function.name"
    undeclared: Any = {"type": "function", "function": {"name": "get_time"}}
    assert (await refused([asked], tools=[WEATHER], tool_choice=undeclared)).param == (
        "tool_choice.function.name"
    )
    assert (await refused([asked], tool_choice=cast(Any, "sometimes"))).param == "tool_choice"
    # Nested past what a turn's request can carry (protobuf's depth limit).
    deep: Any = {}
    for _ in range(31):
        deep = {"a": deep}
    too_deep: Any = [{"type": "function", "function": {"name": "f", "parameters": deep}}]
    assert (await refused([asked], tools=too_deep)).param == "tools[0].function.parameters"
    deep_answer = [{"interrupt_id": "int_1", "status": "resolved", "payload": deep}]
    assert (await refused([asked], extra_body={"resume": deep_answer})).param == (
        "resume[0].payload"
    )
    legacy: Any = [{"name": "f", "parameters": {}}]
    assert (await refused([asked], extra_body={"functions": legacy})).param == "functions"
    # `resume` answers a waiting session's interrupts: a new one has none.
    resume = [{"interrupt_id": "int_1", "status": "resolved"}]
    assert (await refused([asked], extra_body={"resume": resume})).param == "resume"


async def test_tool_messages_to_a_session_that_waits_for_none_are_409(
    sdk: openai.AsyncOpenAI, rest: httpx.AsyncClient
) -> None:
    sid = _sid()
    headers = {"X-Session-Id": sid}
    await sdk.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "hi"}], extra_headers=headers
    )
    before = (await rest.get(f"/v1/sessions/{sid}/history")).json()
    with pytest.raises(openai.ConflictError) as info:
        await sdk.chat.completions.create(
            model="demo",
            messages=[{"role": "tool", "tool_call_id": "call_x", "content": "x"}],
            extra_headers=headers,
        )
    assert info.value.code == "not_waiting"
    assert info.value.param == "messages[0]"
    assert "user message" in info.value.message
    assert (await rest.get(f"/v1/sessions/{sid}/history")).json() == before
    # A wrong id for a session that waits: 400 naming the tool message.
    first = await sdk.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": ASK}], tools=[WEATHER],
        extra_headers=headers,
    )  # fmt: skip
    (call,) = first.choices[0].message.tool_calls or []
    with pytest.raises(openai.BadRequestError) as wrong:
        await sdk.chat.completions.create(
            model="demo",
            messages=[{"role": "tool", "tool_call_id": "call_x", "content": "x"}],
            extra_headers=headers,
        )
    assert wrong.value.param == "messages[0].tool_call_id"
    assert call.id in wrong.value.message


async def test_tool_choice_picks_what_the_agent_sees(sdk: openai.AsyncOpenAI) -> None:
    both = "ask get_weather or get_time"
    messages: Any = [{"role": "user", "content": both}]

    async def called(**options: Any) -> list[str]:
        answer = await sdk.chat.completions.create(model="demo", messages=messages, **options)
        return [c.function.name for c in answer.choices[0].message.tool_calls or []]

    assert await called(tools=[WEATHER, TIME], parallel_tool_calls=False) == ["get_weather"]
    named: Any = {"type": "function", "function": {"name": "get_time"}}
    assert await called(tools=[WEATHER, TIME], tool_choice=named) == ["get_time"]
    allowed: Any = {
        "type": "allowed_tools",
        "allowed_tools": {"mode": "auto", "tools": [named]},
    }
    assert await called(tools=[WEATHER, TIME], tool_choice=allowed) == ["get_time"]
    # "none": the agent sees no tools and answers in words.
    assert await called(tools=[WEATHER, TIME], tool_choice="none") == []


async def test_an_approval_is_asked_in_words_and_answered_with_resume(
    sdk: openai.AsyncOpenAI, rest: httpx.AsyncClient
) -> None:
    # Without X-Session-Id: the waiting session is kept, named in the response header.
    raw = await sdk.chat.completions.with_raw_response.create(
        model="demo", messages=[{"role": "user", "content": "what is 6*7 with approval"}]
    )
    first = raw.parse()
    sid = raw.headers["x-session-id"]
    choice = first.choices[0]
    assert choice.finish_reason == "stop"
    assert not choice.message.tool_calls  # the agent's own tool: nothing for the client to run
    assert choice.message.content and "May I run calculator" in choice.message.content
    (interrupt,) = cast(Any, choice.message).interrupts
    assert interrupt["reason"] == "tool_approval"
    assert interrupt["tool_call_id"].startswith("call_")
    assert interrupt["expires_at"].endswith("Z")
    headers = {"X-Session-Id": sid}

    with pytest.raises(openai.ConflictError) as awaiting:
        await sdk.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "6*7?"}], extra_headers=headers
        )
    assert awaiting.value.code == "awaiting_client"
    assert interrupt["id"] in awaiting.value.message and "resume" in awaiting.value.message
    wrong = [{"interrupt_id": "int_nope", "status": "resolved", "payload": {"approved": True}}]
    with pytest.raises(openai.BadRequestError) as invalid:
        await sdk.chat.completions.create(
            model="demo",
            messages=[{"role": "user", "content": "yes"}],
            extra_headers=headers,
            extra_body={"resume": wrong},
        )
    assert invalid.value.param == "resume[0].interrupt_id"

    # The conversation as the client has it; the answer is the resume entry.
    resume = [
        {"interrupt_id": interrupt["id"], "status": "resolved", "payload": {"approved": True}}
    ]
    answer = await sdk.chat.completions.create(
        model="demo",
        messages=[
            {"role": "user", "content": "what is 6*7 with approval"},
            _as_param(choice.message),
        ],
        extra_headers=headers,
        extra_body={"resume": resume},
    )
    assert answer.choices[0].message.content == "Approved: calculator returned 42."
    assert (await rest.get(f"/v1/sessions/{sid}")).json()["session"].get("pause") is None
    await rest.delete(f"/v1/sessions/{sid}")


async def test_a_streamed_question_names_its_interrupt_and_the_answer_resumes(
    sdk: openai.AsyncOpenAI,
) -> None:
    headers = {"X-Session-Id": _sid()}
    stream = await sdk.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "ask me something"}],
        stream=True,
        extra_headers=headers,
    )
    text, interrupts, finish = "", [], []
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            interrupts += cast(Any, choice.delta.model_extra or {}).get("interrupts", [])
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    assert text == "Which color do you like?"
    assert finish == ["stop"]
    (question,) = interrupts
    assert question["reason"] == "question"
    assert question["response_schema"]["required"] == ["color"]

    resume = [{"interrupt_id": question["id"], "status": "resolved", "payload": {"color": "green"}}]
    answer = await _complete(
        sdk,
        [{"role": "assistant", "content": text}],
        True,
        headers,
        extra_body={"resume": resume},
    )
    assert answer.choices[0].message.content == 'You answered: "green".'


async def test_simple_chat_shows_a_call_awaiting_approval_as_pending(
    rest: httpx.AsyncClient,
) -> None:
    first = await rest.post("/v1/chat", json={"message": "What is 6*7, with approval?"})
    assert first.status_code == 200, first.text
    body = first.json()
    (call,) = body["tool_calls"]
    assert (call["name"], call["status"]) == ("calculator", "pending")
    assert call["arguments"] == {"expression": "6*7"}
    assert body["content"].startswith("May I run calculator")  # the question, not ""
    sid = body["session_id"]
    # Not a finished answer: the session waits, and says for what.
    refused = await rest.post("/v1/chat", json={"message": "and now?", "session_id": sid})
    assert refused.status_code == 409
    assert refused.json()["reason"] == "AWAITING_CLIENT"
    session = (await rest.get(f"/v1/sessions/{sid}")).json()["session"]
    (interrupt,) = session["pause"]["interrupts"]
    answer = {"resume": [{"interruptId": interrupt["id"], "status": "cancelled"}]}
    assert (await rest.post(f"/v1/sessions/{sid}/turns", json=answer)).status_code == 200
    history = (await rest.get(f"/v1/sessions/{sid}/history")).json()["messages"]
    assert history[-1]["content"] == "You did not approve calculator, so I did not run it."
    after = await rest.post("/v1/chat", json={"message": "What is 2+2?", "session_id": sid})
    assert [c["status"] for c in after.json()["tool_calls"]] == ["success"]


async def test_simple_chat_runs_a_client_tool_loop_in_its_body(rest: httpx.AsyncClient) -> None:
    tools = [{"name": "get_weather", "description": "the weather"}]
    first = (await rest.post("/v1/chat", json={"message": ASK, "tools": tools})).json()
    (call,) = first["tool_calls"]
    assert (call["name"], call["status"]) == ("get_weather", "pending")
    assert call["arguments"] == {"input": ASK} and call["id"].startswith("call_")
    assert first["interrupts"] == []
    sid = first["session_id"]
    answer = {"tool_call_id": call["id"], "content": "sunny"}
    wrong = await rest.post(
        "/v1/chat",
        json={"session_id": sid, "tool_results": [{**answer, "tool_call_id": "call_nope"}]},
    )
    assert wrong.status_code == 400
    assert wrong.json()["violations"][0]["field"] == "tool_results[0].tool_call_id"
    done = await rest.post("/v1/chat", json={"session_id": sid, "tool_results": [answer]})
    assert done.status_code == 200, done.text
    assert done.json()["content"] == 'Your get_weather returned: "sunny".'
    again = await rest.post("/v1/chat", json={"session_id": sid, "tool_results": [answer]})
    assert (again.status_code, again.json()["reason"]) == (409, "NOT_WAITING")
    # Answers need the session that waits for them.
    unknown = await rest.post(
        "/v1/chat", json={"session_id": "never-was", "tool_results": [answer]}
    )
    assert unknown.status_code == 404
    absent = await rest.post("/v1/chat", json={"tool_results": [answer]})
    assert absent.json()["violations"][0]["field"] == "session_id"


async def test_simple_chat_answers_an_approval_with_resume(rest: httpx.AsyncClient) -> None:
    first = (await rest.post("/v1/chat", json={"message": "What is 6*7, with approval?"})).json()
    (call,) = first["tool_calls"]
    (interrupt,) = first["interrupts"]
    assert (interrupt["reason"], interrupt["tool_call_id"]) == ("tool_approval", call["id"])
    assert interrupt["expires_at"].endswith("Z")
    resume = [
        {"interrupt_id": interrupt["id"], "status": "resolved", "payload": {"approved": True}}
    ]
    done = await rest.post("/v1/chat", json={"session_id": first["session_id"], "resume": resume})
    assert done.status_code == 200, done.text
    body = done.json()
    assert body["content"] == "Approved: calculator returned 42."
    # The approved call, named as the turn that made it named it.
    assert [(c["id"], c["name"], c["status"], c["arguments"]) for c in body["tool_calls"]] == [
        (call["id"], "calculator", "success", {"expression": "6*7"})
    ]


@pytest.mark.parametrize(
    ("message", "content"),
    [
        ("narrated", "calling tools. between tools. done."),
        ("narrated client", "calling tools. "),
    ],
)
async def test_the_whole_answer_is_what_the_stream_adds_up_to(
    sdk: openai.AsyncOpenAI, message: str, content: str
) -> None:
    """Text before, between and after tool calls is in both forms alike."""
    request: Any = {
        "model": "probe",
        "messages": [{"role": "user", "content": message}],
        "tools": [WEATHER],
    }
    whole = await sdk.chat.completions.create(**request)
    streamed = "".join(
        [
            chunk.choices[0].delta.content or ""
            async for chunk in await sdk.chat.completions.create(**request, stream=True)
            if chunk.choices
        ]
    )
    assert whole.choices[0].message.content == streamed == content
    calls = whole.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == (["get_weather"] if "client" in message else [])
