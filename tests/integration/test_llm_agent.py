"""The built-in `openai` agent in a real worker, described by an agent file,
against real OpenAI-compatible servers on loopback: another turnmesh mesh
(its /v1/chat/completions), and a scripted server for the tool-loop paths a
real model cannot be made to produce here."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import SharedMesh
from tests.support.mesh import Component, Mesh, until
from tests.support.scripted_llm import ScriptedLLM
from turnmesh.client import AsyncClient, Client, TurnFailedError
from turnmesh.v1 import event_pb2, message_pb2

AGENT_FILE = """\
name: assistant
kind: openai
model:
  name: {model}
  base_url: {base_url}
  api_key_env: {key_env}
instructions: You are brief.
tools:
  - turnmesh.agent.builtin.tools:calculator
  - turnmesh.agent.builtin.tools:current_time
  - llm_tools:broken
  - llm_tools:slow
  - llm_tools:transfer
approval: [transfer]
tool_timeout_seconds: 0.5
"""


@dataclass
class LlmMesh:
    mesh: Mesh
    server: Component
    scripted: ScriptedLLM


def _start(mesh: Mesh, agent_file: Path) -> Component:
    mesh.start_router()
    worker = mesh.spawn_worker("llm-worker", str(agent_file))
    server = mesh.spawn_server("server", "--agent", "assistant")
    mesh.wait_ready(worker, server)
    return server


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlmMesh]:
    scripted = ScriptedLLM().start()
    workdir = tmp_path_factory.mktemp("llm-mesh")
    agent_file = workdir / "assistant.yaml"
    agent_file.write_text(
        AGENT_FILE.format(model="scripted", base_url=scripted.base_url, key_env="TM_TEST_KEY")
    )
    mesh = Mesh(workdir / "mesh")
    try:
        yield LlmMesh(mesh, _start(mesh, agent_file), scripted)
    finally:
        mesh.stop()
        scripted.stop()


def _types(events: list[event_pb2.Event]) -> list[str]:
    return [event_pb2.EventType.Name(e.type) for e in events]


async def test_a_two_step_tool_loop(llm: LlmMesh) -> None:
    async with AsyncClient(llm.server.address) as client:
        sid = (await client.create_session()).session_id
        result = await client.send(sid, "[two-tools] what is 6*7, and the time?")
    names = [e.tool_call_name for e in result.events if e.type == event_pb2.TOOL_CALL_START]
    assert names == ["calculator", "current_time"]
    results = [e.content for e in result.events if e.type == event_pb2.TOOL_CALL_RESULT]
    assert results[0] == "42"
    assert results[1].startswith("20")  # an ISO timestamp
    # The final answer streams after the second result: the model saw both.
    assert "42" in result.text
    requests = [r["body"] for r in llm.scripted.requests[-3:]]
    assert [m["role"] for m in requests[2]["messages"]][-4:] == [
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    assert {t["function"]["name"] for t in requests[0]["tools"]} >= {"calculator", "slow"}
    assert requests[0]["messages"][0] == {"role": "system", "content": "You are brief."}
    assert requests[0]["stream"] is True
    finished = result.events[-1]
    assert finished.usage[0].input_tokens == 33  # 11 a call, three calls


WEATHER = message_pb2.ToolDefinition(name="get_weather", description="the weather in a city")
WEATHER.parameters.update({"type": "object", "properties": {"city": {"type": "string"}}})


async def test_the_model_calls_the_callers_tool_and_the_client_answers(llm: LlmMesh) -> None:
    async with AsyncClient(llm.server.address) as client:
        sid = (await client.create_session()).session_id
        paused = await client.send(sid, "[client-tool] weather in Oslo?", tools=[WEATHER])
        offered = llm.scripted.requests[-1]["body"]["tools"]
        assert {"type": "function", "function": {
            "name": "get_weather",
            "description": "the weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        }} in offered  # fmt: skip
        assert paused.outcome is not None
        assert list(paused.outcome.pending_tool_call_ids) == ["call_get_weather"]
        result = [message_pb2.ToolResult(tool_call_id="call_get_weather", content="cold, -3 C")]
        answer = await client.send(sid, "", tool_results=result)
    assert answer.outcome is None and "cold, -3 C" in answer.text
    # The model saw its call and the client's result, after the paused turn's message.
    sent = llm.scripted.requests[-1]["body"]["messages"]
    assert [m["role"] for m in sent[-3:]] == ["user", "assistant", "tool"]
    assert sent[-2]["tool_calls"][0]["id"] == "call_get_weather"
    assert sent[-1] == {
        "role": "tool",
        "tool_call_id": "call_get_weather",
        "content": "cold, -3 C",
    }


async def test_a_server_tool_runs_and_a_client_tool_waits_in_one_step(llm: LlmMesh) -> None:
    async with AsyncClient(llm.server.address) as client:
        sid = (await client.create_session()).session_id
        paused = await client.send(sid, "[mixed] go", tools=[WEATHER])
        results = [e.content for e in paused.events if e.type == event_pb2.TOOL_CALL_RESULT]
        assert results == ["42"]
        assert paused.outcome is not None
        assert list(paused.outcome.pending_tool_call_ids) == ["call_get_weather"]
        answer = await client.send(
            sid, "", tool_results=[message_pb2.ToolResult(tool_call_id="call_get_weather")]
        )
    assert "42" in answer.text


@pytest.mark.parametrize(("approved", "expected"), [(True, "moved 5"), (False, "not approved")])
async def test_a_tool_that_needs_approval_runs_only_when_approved(
    llm: LlmMesh, approved: bool, expected: str
) -> None:
    async with AsyncClient(llm.server.address) as client:
        sid = (await client.create_session()).session_id
        asked = await client.send(sid, "[approve] pay them")
        assert asked.outcome is not None and asked.outcome.type == "interrupt"
        (interrupt,) = asked.outcome.interrupts
        assert (interrupt.reason, interrupt.tool_call_id) == ("tool_approval", "call_transfer")
        assert "transfer" in interrupt.message
        assert not [e for e in asked.events if e.type == event_pb2.TOOL_CALL_RESULT]
        answer = message_pb2.ResumeEntry(interrupt_id=interrupt.id, status="resolved")
        answer.payload.struct_value.update({"approved": approved})
        done = await client.send(sid, "", resume=[answer])
    results = [e.content for e in done.events if e.type == event_pb2.TOOL_CALL_RESULT]
    assert expected in results[0] and expected in done.text


async def test_history_is_sent_as_the_conversation(llm: LlmMesh) -> None:
    async with AsyncClient(llm.server.address) as client:
        sid = (await client.create_session()).session_id
        await client.send(sid, "first words")
        await client.send(sid, "second words")
    messages = llm.scripted.requests[-1]["body"]["messages"]
    assert [(m["role"], m["content"].strip()) for m in messages[1:]] == [
        ("user", "first words"),
        ("assistant", "echo: first words"),
        ("user", "second words"),
    ]


@pytest.mark.parametrize(
    ("tag", "expected"),
    [
        ("raising-tool", "error: broken failed (RuntimeError)"),
        ("slow-tool", "error: slow did not finish within 0.5 seconds"),
        ("missing-tool", "error: there is no tool named 'no_such_tool'"),
        ("bad-args", "error: invalid arguments for calculator: expression: Field required"),
    ],
)
async def test_a_failing_tool_is_a_result_the_model_sees(
    llm: LlmMesh, tag: str, expected: str
) -> None:
    async with AsyncClient(llm.server.address) as client:
        sid = (await client.create_session()).session_id
        started = time.monotonic()
        result = await client.send(sid, f"[{tag}] go")
    (tool_result,) = [e.content for e in result.events if e.type == event_pb2.TOOL_CALL_RESULT]
    assert tool_result == expected
    assert "hunter2" not in json.dumps([e.content for e in result.events])
    assert expected in result.text  # the scripted model answers with the results
    if tag == "slow-tool":
        assert time.monotonic() - started < 10  # the 30 s tool was cut off


async def test_a_429_then_success_is_retried(llm: LlmMesh) -> None:
    before = len(llm.scripted.requests)
    async with AsyncClient(llm.server.address) as client:
        sid = (await client.create_session()).session_id
        result = await client.send(sid, "[rate-limit] hello")
    assert "echo: [rate-limit] hello" in result.text
    assert len(llm.scripted.requests) - before == 2


async def test_model_errors_are_a_clean_run_error(llm: LlmMesh) -> None:
    async with AsyncClient(llm.server.address) as client:
        sid = (await client.create_session()).session_id
        with pytest.raises(TurnFailedError) as failed:
            await client.send(sid, "[server-error] hello")
    event = failed.value.event
    assert event.code == "model_error"
    assert event.problem.title == "Model error"
    assert "500" in event.problem.detail
    async with AsyncClient(llm.server.address) as client:
        assert await client.history(sid) == []  # nothing half-done was kept


async def test_cancelling_stops_the_model_stream(llm: LlmMesh) -> None:
    llm.scripted.disconnected.clear()
    async with AsyncClient(llm.server.address) as client:
        sid = (await client.create_session()).session_id
        async with client.stream_turn(sid, "[forever] talk") as events:
            async for event in events:
                if event.type == event_pb2.TEXT_MESSAGE_CONTENT:
                    await client.cancel_turn(sid, event.run_id)
                    break
        # The worker closed its stream to the model: the server's next write fails.
        await until(llm.scripted.disconnected.is_set, timeout=10, what="the model stream closed")


async def test_against_a_turnmesh_mesh_as_the_model(
    shared_mesh: SharedMesh, mesh_factory: Mesh, tmp_path: Path
) -> None:
    """A real OpenAI-compatible server: another mesh's chat completions (its
    `demo` agent is the model), streamed token by token."""
    agent_file = tmp_path / "assistant.yaml"
    agent_file.write_text(
        AGENT_FILE.format(
            model="demo", base_url=f"http://{shared_mesh.edge}/v1", key_env="TM_TEST_KEY"
        )
    )
    server = _start(mesh_factory, agent_file)
    async with AsyncClient(server.address) as client:
        sid = (await client.create_session()).session_id
        result = await client.send(sid, "What is 12*(3+4)?")
        assert "84" in result.text
        deltas = [e for e in result.events if e.type == event_pb2.TEXT_MESSAGE_CONTENT]
        assert len(deltas) == 3  # "12*(3+4) = 84.", streamed word by word
        follow = await client.send(sid, "What did I ask first?")
        assert "12*(3+4)" in follow.text  # the history reached the model

        # The caller's tool, through both meshes: the model (the other mesh's
        # demo, over chat completions) calls it, this turn waits for the
        # client, and the client's result goes back to the model.
        paused = await client.send(sid, "Ask get_weather about Rome", tools=[WEATHER])
        assert paused.outcome is not None
        (call_id,) = paused.outcome.pending_tool_call_ids
        results = [message_pb2.ToolResult(tool_call_id=call_id, content="hot, 30 C")]
        answered = await client.send(sid, "", tool_results=results)
        assert answered.text == 'Your get_weather returned: "hot, 30 C".'


async def test_unreachable_and_bad_key_are_named(
    mesh_factory: Mesh, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted = ScriptedLLM().start()
    try:
        agent_file = tmp_path / "assistant.yaml"
        agent_file.write_text(
            AGENT_FILE.format(
                model="scripted", base_url=scripted.base_url, key_env="TM_BAD_KEY"
            ).replace("tool_timeout_seconds: 0.5", "")
        )
        monkeypatch.setenv("TM_BAD_KEY", "wrong-key")  # the worker's environment
        server = _start(mesh_factory, agent_file)
        async with AsyncClient(server.address) as client:
            sid = (await client.create_session()).session_id
            with pytest.raises(TurnFailedError) as failed:
                await client.send(sid, "hello")
            assert failed.value.event.problem.title == "Model refused the API key"
            assert "wrong-key" not in str(failed.value.event)
        scripted.stop()  # now nothing listens there
        async with AsyncClient(server.address) as client:
            sid = (await client.create_session()).session_id
            with pytest.raises(TurnFailedError) as failed:
                await client.send(sid, "hello")
            assert failed.value.event.problem.title == "Model unreachable"
    finally:
        scripted.stop()


async def test_a_langgraph_graph_runs_as_an_agent(mesh_factory: Mesh, tmp_path: Path) -> None:
    agent_file = tmp_path / "forecaster.yaml"
    agent_file.write_text("name: forecaster\nkind: langgraph\ngraph: lg_graph:graph\n")
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("lg-worker", str(agent_file))
    server = mesh.spawn_server("server", "--agent", "forecaster")
    mesh.wait_ready(worker, server)
    async with AsyncClient(server.address) as client:
        sid = (await client.create_session()).session_id
        result = await client.send(sid, "Weather in Oslo?")
        assert _types(result.events)[:5] == [
            "RUN_STARTED",
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "TOOL_CALL_RESULT",
        ]
        (start,) = [e for e in result.events if e.type == event_pb2.TOOL_CALL_START]
        assert start.tool_call_name == "lookup"
        (args,) = [e for e in result.events if e.type == event_pb2.TOOL_CALL_ARGS]
        assert json.loads(args.delta) == {"city": "Oslo"}
        deltas = [e.delta for e in result.events if e.type == event_pb2.TEXT_MESSAGE_CONTENT]
        assert len(deltas) > 3  # the fake model's tokens, streamed
        assert result.text == "Forecast: sunny and 21C in Oslo."
        # The next turn's input is built from the session history.
        second = await client.send(sid, "And in Lima?")
        assert second.text == "Forecast: sunny and 21C in Lima."
        history = await client.history(sid)
        assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"] * 2


def test_up_with_the_example_agent_file_on_every_surface(tmp_path: Path) -> None:
    """`turnmesh up --agent examples/assistant.yaml`, its endpoint given by the
    environment, reached over REST/SSE, gRPC and the OpenAI SDK."""
    scripted = ScriptedLLM().start()
    example = Path(__file__).resolve().parents[2] / "examples" / "assistant.yaml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNMESH_")}
    env |= {"OPENAI_BASE_URL": scripted.base_url, "OPENAI_MODEL": "scripted"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "turnmesh", "up", "--port", "0", "--agent", str(example),
         "--run-dir", str(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        text=True, env=env, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Ctrl-C stops the mesh."):
                break
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        match = re.search(r"REST/SSE and gRPC\s+http://(\S+)", "".join(lines))
        assert match, "".join(lines)
        edge = match.group(1)
        with httpx.Client(base_url=f"http://{edge}", timeout=30) as rest:
            sid = rest.post("/v1/sessions", json={}).json()["session"]["sessionId"]
            sse = rest.post(f"/v1/sessions/{sid}/turns", json={"message": "[two-tools] go"}).text
            assert '"toolCallName":"calculator"' in sse and '"toolCallName":"current_time"' in sse
        with Client(edge) as client:
            assert "42" in client.send(sid, "[two-tools] again").text
        sdk = openai.OpenAI(base_url=f"http://{edge}/v1", api_key="x", max_retries=0)
        answer = sdk.chat.completions.create(
            model="assistant", messages=[{"role": "user", "content": "[two-tools] once more"}]
        )
        assert "42" in (answer.choices[0].message.content or "")
        sdk.close()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        scripted.stop()
