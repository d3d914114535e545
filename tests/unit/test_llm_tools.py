"""Tools for the `openai` agent: schemas from signatures, calls with time
limits, failures as results; and the agent's own cancellation of a tool."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, Literal

import pytest

from tests.support.scripted_llm import ScriptedLLM
from turnmesh.agent import AgentRequest
from turnmesh.agent.builtin.llm import ModelSettings, OpenAIAgent
from turnmesh.agent.tools import Tool, ToolLoadError, load_tool


def weather(city: str, unit: Literal["C", "F"] = "C", days: int = 1) -> dict[str, Any]:
    """The weather in a city.

    More words that are not part of the description.
    """
    return {"city": city, "unit": unit, "days": days}


def test_schema_from_the_signature() -> None:
    schema = Tool.from_function(weather).schema()
    assert schema["type"] == "function"
    function = schema["function"]
    assert (function["name"], function["description"]) == ("weather", "The weather in a city.")
    parameters = function["parameters"]
    assert parameters["required"] == ["city"]
    assert parameters["properties"]["unit"]["enum"] == ["C", "F"]
    assert parameters["properties"]["days"]["type"] == "integer"


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"city": "Oslo"}', '{"city": "Oslo", "unit": "C", "days": 1}'),
        ('{"city": "Oslo", "unit": "K"}', "error: invalid arguments for weather: unit:"),
        ("{not json", "error: invalid arguments for weather: not a JSON object"),
        ('{"days": 2}', "error: invalid arguments for weather: city: Field required"),
    ],
)
async def test_invoke_validates_arguments(arguments: str, expected: str) -> None:
    result = await Tool.from_function(weather).invoke(arguments, timeout=5)
    assert result.startswith(expected)


async def test_a_raising_tool_is_an_error_result_without_its_message() -> None:
    def explode() -> str:
        raise KeyError("secret-token-123")

    result = await Tool.from_function(explode).invoke("{}", timeout=5)
    assert result == "error: explode failed (KeyError)"


async def test_a_slow_tool_is_cut_off() -> None:
    async def nap() -> str:
        await asyncio.sleep(30)
        return "rested"

    result = await Tool.from_function(nap).invoke("{}", timeout=0.05)
    assert result == "error: nap did not finish within 0.05 seconds"


def test_load_tool_errors() -> None:
    with pytest.raises(ToolLoadError, match=r"expected 'package\.module:function'"):
        load_tool("no_colon")
    with pytest.raises(ToolLoadError, match="cannot import module"):
        load_tool("no.such.module:f")
    with pytest.raises(ToolLoadError, match="is not a function"):
        load_tool("turnmesh.agent.builtin.tools:UTC")
    assert load_tool("turnmesh.agent.builtin.tools:calculator").name == "calculator"

    def star(*args: int) -> None: ...

    with pytest.raises(ToolLoadError, match="cannot take"):
        Tool.from_function(star)


class Recorder:
    """An EventEmitter that remembers what it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.tool_started = asyncio.Event()

    async def emit_delta(self, text: str) -> None:
        self.calls.append(("delta", text))

    async def emit_tool_call(self, name: str, arguments: Any, *, call_id: str | None = None) -> str:
        self.calls.append(("call", name))
        self.tool_started.set()
        return call_id or "c"

    async def emit_tool_result(self, call_id: str, content: str) -> None:
        self.calls.append(("result", content))


@pytest.fixture
def scripted() -> Iterator[ScriptedLLM]:
    server = ScriptedLLM().start()
    try:
        yield server
    finally:
        server.stop()


async def test_cancelling_the_agent_cancels_its_running_tool(scripted: ScriptedLLM) -> None:
    cancelled = asyncio.Event()

    async def slow(seconds: float) -> str:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "done"

    agent = OpenAIAgent(
        ModelSettings(name="scripted", base_url=scripted.base_url),
        tools=[Tool.from_function(slow)],
        tool_timeout_seconds=60,
    )
    emitter = Recorder()
    request = AgentRequest.from_messages(["[slow-tool] go"], session_id="s", turn_id="t")
    run = asyncio.create_task(agent.run(request, emitter=emitter))
    await asyncio.wait_for(emitter.tool_started.wait(), 10)
    await asyncio.sleep(0)  # let the tool start awaiting
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    await asyncio.wait_for(cancelled.wait(), 5)
    assert ("result", "done") not in emitter.calls
    await agent.close()


async def test_the_agent_sends_file_text_to_the_model(scripted: ScriptedLLM) -> None:
    from turnmesh.agent import AgentFile

    agent = OpenAIAgent(ModelSettings(name="scripted", base_url=scripted.base_url))
    request = AgentRequest.from_messages(
        ["what does it say?"],
        session_id="s",
        turn_id="t",
        files=[
            AgentFile("a.txt", "text/plain", b"x", text="The code is 7391."),
            AgentFile("b.pdf", "application/pdf", b"x", error="the PDF is damaged"),
        ],
    )
    response = await agent.run(request, emitter=Recorder())
    sent = scripted.requests[-1]["body"]["messages"][-1]["content"]
    assert "The code is 7391." in sent and "a.txt" in sent
    assert "could not be read: the PDF is damaged" in sent
    assert response.usage is not None and response.usage.input_tokens == 11
    await agent.close()
