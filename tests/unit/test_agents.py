"""The agent contract, the built-in agents and the loader."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import turnmesh.agent
from turnmesh.agent import (
    AgentLoadError,
    AgentRequest,
    AgentRunnable,
    TokenUsage,
    load_agent,
)
from turnmesh.agent.builtin import _common
from turnmesh.agent.builtin._calculator import calculate, find_expression
from turnmesh.agent.builtin.demo import DemoAgent
from turnmesh.agent.builtin.echo import EchoAgent


class RecordingEmitter:
    """Records what an agent emits, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def emit_delta(self, text: str) -> None:
        self.calls.append(("delta", text))

    async def emit_tool_call(
        self, name: str, arguments: Mapping[str, Any] | str, *, call_id: str | None = None
    ) -> str:
        call_id = call_id or f"call-{len(self.calls)}"
        self.calls.append(("tool_call", name, arguments, call_id))
        return call_id

    async def emit_tool_result(self, call_id: str, content: str) -> None:
        self.calls.append(("tool_result", call_id, content))

    @property
    def deltas(self) -> list[str]:
        return [call[1] for call in self.calls if call[0] == "delta"]

    @property
    def tools(self) -> list[tuple[Any, ...]]:
        return [call for call in self.calls if call[0] != "delta"]


def make_request(
    message: str,
    *,
    history: list[dict[str, Any]] | None = None,
    metadata: dict[str, Any] | None = None,
) -> AgentRequest:
    return AgentRequest.from_messages(
        [message], session_id="s1", turn_id="t1", history=history, metadata=metadata
    )


async def run(agent: AgentRunnable, request: AgentRequest) -> tuple[RecordingEmitter, Any]:
    emitter = RecordingEmitter()
    response = await agent.run(request, emitter=emitter)
    return emitter, response


# --- contract --------------------------------------------------------------


def test_public_names_are_pinned() -> None:
    assert turnmesh.agent.__all__ == [
        "BUILTIN_AGENTS",
        "MAX_CHECKPOINT_BYTES",
        "AgentError",
        "AgentFile",
        "AgentLoadError",
        "AgentRequest",
        "AgentResponse",
        "AgentRunnable",
        "ClientTool",
        "EventEmitter",
        "Interrupt",
        "Resume",
        "TokenUsage",
        "ToolResult",
        "load_agent",
    ]
    assert turnmesh.agent.AgentRequest.__module__ == "turnmesh.agent"


def test_request_coalesces_messages() -> None:
    request = AgentRequest.from_messages(["one", "two"], session_id="s", turn_id="t")
    assert request.message == "one\n\ntwo"
    assert request.messages == ["one", "two"]
    assert request.history == []
    assert request.metadata == {}
    assert request.files == []


def test_request_needs_a_message() -> None:
    with pytest.raises(ValueError, match="at least one user message"):
        AgentRequest.from_messages([], session_id="s", turn_id="t")


def test_token_usage_total() -> None:
    assert TokenUsage(input_tokens=3, output_tokens=4).total_tokens == 7
    assert TokenUsage().total_tokens == 0


def test_builtin_agents_are_runnable() -> None:
    assert isinstance(EchoAgent(), AgentRunnable)
    assert isinstance(DemoAgent(), AgentRunnable)


# --- echo ------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        "hello world",
        "one",
        "  leading and trailing  ",
        "tabs\tand\nnewlines\n\n  and   runs of spaces",
        "unicode: héllo wörld ✓",
    ],
)
async def test_echo_streams_each_word_and_reassembles_exactly(message: str) -> None:
    emitter, response = await run(EchoAgent(), make_request(message))
    assert "".join(emitter.deltas) == message
    assert len(emitter.deltas) == len(message.split())
    assert emitter.tools == []
    assert response.text == message
    words = len(message.split())
    assert response.usage == TokenUsage(input_tokens=words, output_tokens=words)


async def test_echo_whitespace_only_message_is_one_delta() -> None:
    emitter, _ = await run(EchoAgent(), make_request(" \n "))
    assert emitter.deltas == [" \n "]


async def test_echo_sleeps_between_deltas(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    monkeypatch.setattr(_common, "asyncio", types.SimpleNamespace(sleep=fake_sleep))
    emitter, _ = await run(EchoAgent(), make_request("a b c", metadata={"delay_ms": 50}))
    assert emitter.deltas == ["a ", "b ", "c"]
    assert sleeps == [0.05, 0.05]  # between deltas, not before the first


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (50, 0.05),
        (50.0, 0.05),
        (-5, 0.0),
        (1e9, 10.0),
        ("50", 0.0),
        (True, 0.0),
        (float("nan"), 0.0),
        (None, 0.0),
    ],
)
def test_delay_is_clamped(value: object, seconds: float) -> None:
    assert _common.delay_seconds({"delay_ms": value}) == pytest.approx(seconds)


# --- demo: calculator ------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "expression", "result"),
    [
        ("What is 12*(3+4)?", "12*(3+4)", "84"),
        ("compute 2 + 3 * 4 please", "2 + 3 * 4", "14"),
        ("(2+3)*4", "(2+3)*4", "20"),
        ("and 2**10?", "2**10", "1024"),
        ("What is 7 / 2?", "7 / 2", "3.5"),
        ("10 % 4", "10 % 4", "2"),
        ("What is -5 + 3?", "-5 + 3", "-2"),
        ("0.1 + 0.2", "0.1 + 0.2", "0.3"),
        ("7 // 2", "7 // 2", "3"),
    ],
)
async def test_demo_calculator(message: str, expression: str, result: str) -> None:
    emitter, response = await run(DemoAgent(), make_request(message))
    (call, tool_result) = emitter.tools
    assert call[:3] == ("tool_call", "calculator", {"expression": expression})
    assert tool_result == ("tool_result", call[3], result)
    answer = f"{expression} = {result}."
    assert "".join(emitter.deltas) == answer
    assert len(emitter.deltas) > 1  # streamed word by word
    assert emitter.calls.index(tool_result) < emitter.calls.index(("delta", emitter.deltas[0]))
    assert response.text == answer
    assert response.metadata == {"rule": "calculator"}
    assert response.usage == TokenUsage(
        input_tokens=len(message.split()), output_tokens=len(answer.split())
    )


async def test_demo_division_by_zero_is_a_result_not_an_exception() -> None:
    emitter, response = await run(DemoAgent(), make_request("What is 1/0?"))
    assert emitter.tools[1][2] == "error: division by zero"
    assert response.text == "I could not calculate 1/0: division by zero."


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("__import__('os')", "only numbers"),
        ("__import__('os').system('ls')", "only numbers"),
        ("x + 1", "only numbers"),
        ("abs(-1)", "only numbers"),
        ("(1).real", "only numbers"),
        ("[1] * 3", "only numbers"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("1 < 2", "only numbers"),
        ("1 +", "invalid expression"),
        ("(1 + 2", "invalid expression"),
        ("5 % 0", "division by zero"),
        ("9**9**9", "exponent too large"),
        ("10**200", "result too large"),
        ("1e308 * 10", "result too large"),
        ("2 ** 0.5 * (-8) ** 0.5", "not a real number"),
        ("1+" * 150 + "1", "expression too long"),
    ],
)
def test_calculator_rejects_unsafe_or_unbounded_input(expression: str, error: str) -> None:
    result = calculate(expression)
    assert result.startswith("error: ")
    assert error in result


@pytest.mark.parametrize("text", ["no numbers here", "I am 42", "2024", "what is x+y"])
def test_find_expression_needs_an_operation_on_numbers(text: str) -> None:
    assert find_expression(text) is None


async def test_demo_does_not_call_a_tool_for_code() -> None:
    emitter, response = await run(DemoAgent(), make_request("run __import__('os').system('ls')"))
    assert emitter.tools == []
    assert response.metadata == {"rule": "echo"}


# --- demo: clock -----------------------------------------------------------


@pytest.mark.parametrize(
    "message", ["What time is it?", "Check the clock", "what's the date today", "What day is it?"]
)
async def test_demo_clock(message: str) -> None:
    now = datetime(2024, 5, 1, 12, 30, 5, tzinfo=UTC)
    emitter, response = await run(DemoAgent(clock=lambda: now), make_request(message))
    call, result = emitter.tools
    assert call[:3] == ("tool_call", "clock", {"timezone": "UTC"})
    assert result == ("tool_result", call[3], "2024-05-01T12:30:05+00:00")
    assert "".join(emitter.deltas) == "It is 2024-05-01 12:30:05 UTC."
    assert response.text == "It is 2024-05-01 12:30:05 UTC."


async def test_demo_clock_defaults_to_now() -> None:
    emitter, _ = await run(DemoAgent(), make_request("what time is it"))
    stamp = datetime.fromisoformat(emitter.tools[1][2])
    assert stamp.utcoffset() is not None
    assert stamp.utcoffset().total_seconds() == 0  # type: ignore[union-attr]


# --- demo: history ---------------------------------------------------------

HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "What is 2+2?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression":"2+2"}'},
            }
        ],
    },
    {"role": "tool", "content": "4", "tool_call_id": "c1"},
    {"role": "assistant", "content": "2+2 = 4."},
]


@pytest.mark.parametrize(
    ("message", "answer"),
    [
        ("What did I ask first?", 'You first asked: "Hi there".'),
        ("WHAT DID I SAY FIRST", 'You first asked: "Hi there".'),
        ("what was my first question?", 'You first asked: "Hi there".'),
        ("What did I ask last?", 'You last asked: "What is 2+2?".'),
        ("what did i ask before", 'You last asked: "What is 2+2?".'),
        ("What did I say previously?", 'You last asked: "What is 2+2?".'),
        ("what did I ask last time?", 'You last asked: "What is 2+2?".'),
    ],
)
async def test_demo_answers_from_history(message: str, answer: str) -> None:
    emitter, response = await run(DemoAgent(), make_request(message, history=HISTORY))
    assert emitter.tools == []
    assert "".join(emitter.deltas) == answer
    assert response.text == answer
    assert response.metadata == {"rule": "history"}


@pytest.mark.parametrize("message", ["What did I ask first?", "what did I ask last?"])
async def test_demo_history_question_without_history(message: str) -> None:
    _, response = await run(DemoAgent(), make_request(message))
    assert response.text == "You have not asked me anything before this message."


async def test_demo_fallback_counts_the_conversation() -> None:
    emitter, response = await run(DemoAgent(), make_request("Nice weather", history=HISTORY))
    answer = 'You said: "Nice weather". This is message 3 of our conversation.'
    assert response.text == answer
    assert emitter.deltas == _common.split_words(answer)
    assert len(emitter.deltas) == len(answer.split())


async def test_demo_fallback_first_message() -> None:
    _, response = await run(DemoAgent(), make_request("hello"))
    assert response.text == 'You said: "hello". This is message 1 of our conversation.'


async def test_demo_honours_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    monkeypatch.setattr(_common, "asyncio", types.SimpleNamespace(sleep=fake_sleep))
    emitter, _ = await run(DemoAgent(), make_request("hello", metadata={"delay_ms": 20}))
    assert sleeps == [0.02] * (len(emitter.deltas) - 1)


# --- loader ----------------------------------------------------------------


@pytest.fixture
def samples_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


@pytest.mark.parametrize(("spec", "cls"), [("echo", EchoAgent), ("demo", DemoAgent)])
def test_load_builtin(spec: str, cls: type) -> None:
    name, agent = load_agent(spec)
    assert name == spec
    assert type(agent) is cls


def test_builtin_names_are_listed() -> None:
    assert sorted(turnmesh.agent.BUILTIN_AGENTS) == ["demo", "echo", "openai"]


@pytest.mark.usefixtures("samples_on_path")
@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ("_agent_samples:NamedAgent", "named"),
        ("_agent_samples:PlainAgent", "plainagent"),
        ("_agent_samples:instance_agent", "named"),
        ("turnmesh.agent.builtin.echo:EchoAgent", "echo"),
    ],
)
def test_load_module_class(spec: str, name: str) -> None:
    loaded_name, agent = load_agent(spec)
    assert loaded_name == name
    assert isinstance(agent, AgentRunnable)


@pytest.mark.usefixtures("samples_on_path")
@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nope", "unknown agent 'nope': use a built-in agent (demo, echo, openai) or"),
        ("", "unknown agent '': use a built-in agent (demo, echo, openai)"),
        ("no_such_module_xyz:Agent", "cannot import module 'no_such_module_xyz'"),
        (
            "_agent_samples_broken:Agent",
            "importing module '_agent_samples_broken' failed: RuntimeError: boom at import time",
        ),
        ("_agent_samples:Missing", "module '_agent_samples' has no attribute 'Missing'"),
        ("_agent_samples:NoRun", "'_agent_samples:NoRun' is not an agent"),
        ("_agent_samples:SyncRun", "'_agent_samples:SyncRun' is not an agent"),
        (
            "_agent_samples:NeedsArguments",
            "cannot instantiate '_agent_samples:NeedsArguments' with no arguments: TypeError",
        ),
        (":NamedAgent", "invalid agent spec ':NamedAgent'"),
        ("_agent_samples:", "invalid agent spec '_agent_samples:'"),
    ],
)
def test_load_errors(spec: str, message: str) -> None:
    with pytest.raises(AgentLoadError) as caught:
        load_agent(spec)
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)


async def test_demo_reads_earlier_files_only_as_far_back_as_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A seeded history may hold 64 MiB of file text: the demo reads the
    newest files up to MAX_HISTORY_CHARS (older ones are not searched), and
    scans long text in a thread, not on the worker's event loop."""
    from turnmesh.agent.builtin import _files

    def message_with(text: str, name: str) -> dict[str, Any]:
        file = {"filename": name, "mime_type": "text/plain", "text": text, "error": ""}
        return {"role": "user", "content": "see file", "files": [file]}

    filler = "nothing relevant here. " * (_files.MAX_HISTORY_CHARS // 23 // 2)
    history = [
        message_with("We keep llamas.", "old.txt"),  # past the bound
        message_with(filler, "a.txt"),
        message_with(filler, "b.txt"),
        message_with("The penguin budget is 12 dollars.", "new.txt"),
    ]
    threads: list[object] = []
    real = asyncio.to_thread

    async def recorded(work: Any, *args: Any) -> Any:
        threads.append(work)
        return await real(work, *args)

    monkeypatch.setattr(asyncio, "to_thread", recorded)
    _, penguin = await run(DemoAgent(), make_request("penguin budget?", history=history))
    assert penguin.text == 'From new.txt (attached earlier): "The penguin budget is 12 dollars.".'
    _, llama = await run(DemoAgent(), make_request("any llamas?", history=history))
    assert llama.metadata == {"rule": "echo"}  # not found: old.txt is past the bound
    assert len(threads) == 2
