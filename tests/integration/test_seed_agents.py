"""Agents written for the seed's contract (AReaL's ``AgentRunnable``), each in a
real worker from a ``kind: areal`` agent file, behind a real server and Envoy,
reached over every surface: native gRPC, REST/SSE, OpenAI chat completions and
Responses (the openai SDK), AG-UI (the real @ag-ui/client) and ``/v1/chat``."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from google.protobuf import json_format
from openai.types.chat import ChatCompletionMessageParam

from tests.support.mesh import Component, Mesh
from tests.support.seed_agents import CLOCK, GHOST, TOOL_SUMMARY, WEATHER
from turnmesh.client import AsyncClient, TurnFailedError
from turnmesh.v1 import event_pb2

AGUI_CLIENT = Path(__file__).resolve().parents[2] / "clients" / "agui"
# Agent name -> the seed agent's class in tests/support/seed_agents.py.
AGENTS = {
    "seed-summary": "SummaryAgent",
    "seed-stream": "StreamingAgent",
    "seed-tools": "ToolAgent",
    "seed-raise": "RaisingAgent",
}
STREAMED = "Streaming back: hi"


@dataclass
class SeedMesh:
    server: Component
    edge: str


@pytest.fixture(scope="module")
def seed_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeedMesh]:
    workdir = tmp_path_factory.mktemp("seed-mesh")
    # Nothing here is killed: a slow heartbeat spares a loaded machine.
    mesh = Mesh(workdir / "mesh", heartbeat_interval=1.0)
    try:
        mesh.start_router()
        workers = []
        for name, cls in AGENTS.items():
            agent_file = workdir / f"{name}.yaml"
            agent_file.write_text(f"name: {name}\nkind: areal\nclass: seed_agents:{cls}\n")
            workers.append(mesh.spawn_worker(name, str(agent_file)))
        mesh.wait_ready(*workers)
        server = mesh.spawn_server("server", "--agent", "seed-summary")
        mesh.wait_ready(server)
        envoy = mesh.start_envoy([server])
        yield SeedMesh(server, envoy.listener_address)
    finally:
        mesh.stop()


@pytest.fixture
async def client(seed_mesh: SeedMesh) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(seed_mesh.edge) as c:  # native gRPC through Envoy
        yield c


@pytest.fixture
def sdk(seed_mesh: SeedMesh) -> Iterator[openai.OpenAI]:
    sdk = openai.OpenAI(base_url=f"http://{seed_mesh.edge}/v1", api_key="x", max_retries=0)
    yield sdk
    sdk.close()


def _of(events: list[event_pb2.Event], kind: event_pb2.EventType.ValueType) -> list[Any]:
    return [e for e in events if e.type == kind]


def _assert_tool_turn(events: list[event_pb2.Event]) -> None:
    """ToolAgent's calls, each result on its own call (by name, first in first out)."""
    starts = _of(events, event_pb2.TOOL_CALL_START)
    assert [s.tool_call_name for s in starts] == ["weather", "weather", "clock", "ghost"]
    ids = [s.tool_call_id for s in starts]
    assert len(set(ids)) == 4
    results = {r.tool_call_id: r.content for r in _of(events, event_pb2.TOOL_CALL_RESULT)}
    assert results == {
        ids[0]: WEATHER["Oslo"],
        ids[1]: WEATHER["Lima"],
        ids[2]: CLOCK,
        ids[3]: GHOST,
    }


# --- native gRPC -------------------------------------------------------------------


async def test_a_summary_agent_sees_the_seeds_request(client: AsyncClient) -> None:
    sid = (await client.create_session(agent="seed-summary")).session_id
    first = await client.send(sid, "hello", metadata={"tag": "x"})
    assert first.text == "You said: hello"
    seen = json_format.MessageToDict(first.events[-1].result)
    assert seen == {
        "session_key": sid,
        "run_id": first.turn_id,
        "queue_mode": "collect",
        "history": [],
        "metadata": {"tag": "x"},
    }
    second = await client.send(sid, "again")
    assert json_format.MessageToDict(second.events[-1].result)["history"] == [
        ["user", "hello"],
        ["assistant", "You said: hello"],
    ]


async def test_a_streaming_agent_streams_its_deltas(client: AsyncClient) -> None:
    sid = (await client.create_session(agent="seed-stream")).session_id
    result = await client.send(sid, "hi")
    deltas = [e.delta for e in _of(result.events, event_pb2.TEXT_MESSAGE_CONTENT)]
    assert deltas == ["Streaming", " back:", " hi"]
    assert result.text == STREAMED
    assert [m.content for m in await client.history(sid)] == ["hi", STREAMED]


async def test_a_tool_agent_and_the_history_it_leaves(client: AsyncClient) -> None:
    sid = (await client.create_session(agent="seed-tools")).session_id
    result = await client.send(sid, "weather?")
    _assert_tool_turn(result.events)
    assert result.text == TOOL_SUMMARY
    history = await client.history(sid)
    # Every tool message answers a call an assistant message made: none dangles.
    called = {c.id for m in history for c in m.tool_calls}
    answered = [m.tool_call_id for m in history if m.role == "tool"]
    assert len(answered) == 4
    assert set(answered) == called
    assert (history[-1].role, history[-1].content) == ("assistant", TOOL_SUMMARY)


async def test_a_raising_agent_fails_the_turn_without_its_secret(client: AsyncClient) -> None:
    sid = (await client.create_session(agent="seed-raise")).session_id
    with pytest.raises(TurnFailedError) as failed:
        await client.send(sid, "hi")
    assert failed.value.event.code == "agent_error"
    assert failed.value.event.problem.title == "Agent error"
    assert "hunter2" not in str(failed.value.event)
    assert await client.history(sid) == []  # a failed turn leaves no history


# --- REST and SSE ------------------------------------------------------------------


async def test_rest_sse_turn_with_a_tool_agent(seed_mesh: SeedMesh) -> None:
    async with httpx.AsyncClient(base_url=f"http://{seed_mesh.edge}", timeout=60) as rest:
        created = await rest.post("/v1/sessions", json={"agentName": "seed-tools"})
        sid = created.json()["session"]["sessionId"]
        response = await rest.post(f"/v1/sessions/{sid}/turns", json={"message": "go"})
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = [
        json.loads(line.removeprefix("data: "))
        for line in response.text.splitlines()
        if line.startswith("data: ")
    ]
    events = [json_format.ParseDict(f, event_pb2.Event()) for f in frames]
    _assert_tool_turn(events)
    assert frames[-1]["type"] == "RUN_FINISHED"


# --- OpenAI chat completions and Responses -------------------------------------------


def test_chat_completions(sdk: openai.OpenAI) -> None:
    hi: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    summary = sdk.chat.completions.create(model="seed-summary", messages=hi)
    assert summary.choices[0].message.content == "You said: hi"
    tools = sdk.chat.completions.create(model="seed-tools", messages=hi)
    # All the text the turn wrote, as its streamed deltas add up to: what it
    # said before its tool calls, then its summary.
    assert tools.choices[0].message.content == "Let me look that up." + TOOL_SUMMARY
    stream = sdk.chat.completions.create(model="seed-stream", messages=hi, stream=True)
    deltas = [c.choices[0].delta.content for c in stream if c.choices]
    assert [d for d in deltas if d] == ["Streaming", " back:", " hi"]
    # A failed turn is a 400 TURN_FAILED on one-piece surfaces (docs/api.md).
    with pytest.raises(openai.BadRequestError) as failed:
        sdk.chat.completions.create(model="seed-raise", messages=hi)
    assert failed.value.code == "turn_failed"
    assert "the agent failed" in failed.value.message
    assert "hunter2" not in str(failed.value.body)


def test_responses(sdk: openai.OpenAI) -> None:
    assert sdk.responses.create(model="seed-tools", input="go").output_text == TOOL_SUMMARY
    with sdk.responses.stream(model="seed-stream", input="hi") as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas == ["Streaming", " back:", " hi"]
    assert final.output_text == STREAMED
    with sdk.responses.stream(model="seed-raise", input="hi") as stream:
        failed = [e for e in stream if e.type == "response.failed"]
    error = failed[0].response.error
    assert error is not None
    assert error.model_dump()["code"] == "agent_error"  # not among the SDK's literal codes


# --- AG-UI (the real client) and /v1/chat ----------------------------------------------


def _agui(edge: str, thread: str) -> dict[str, Any]:
    node = shutil.which("node")
    assert node, "node is installed by `make install` (system-deps)"
    done = subprocess.run(
        [node, "run.mjs", f"http://{edge}/v1/agui", thread],
        cwd=AGUI_CLIENT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # The client verifies every event it gets; it warns about none of ours.
    assert "warn" not in done.stderr.lower(), done.stderr
    output: dict[str, Any] = json.loads(done.stdout)
    return output


async def test_agui_client_runs_the_tool_agent(seed_mesh: SeedMesh, client: AsyncClient) -> None:
    thread = (await client.create_session("seed-agui-tools", agent="seed-tools")).session_id
    output = _agui(seed_mesh.edge, thread)  # two runs on the thread
    assert "error" not in output, output
    assert output["events"].count("TOOL_CALL_START") == 8
    assert output["events"].count("TOOL_CALL_RESULT") == 8
    messages = output["messages"]
    calls = [c for m in messages for c in m.get("toolCalls", [])]
    assert [c["function"]["name"] for c in calls] == ["weather", "weather", "clock", "ghost"] * 2
    by_id = {m["toolCallId"]: m["content"] for m in messages if m["role"] == "tool"}
    assert [by_id[c["id"]] for c in calls[:4]] == [WEATHER["Oslo"], WEATHER["Lima"], CLOCK, GHOST]
    assert messages[-1]["role"] == "assistant"
    assert messages[-1]["content"] == TOOL_SUMMARY


async def test_agui_client_sees_a_raising_agent_fail(
    seed_mesh: SeedMesh, client: AsyncClient
) -> None:
    thread = (await client.create_session("seed-agui-raise", agent="seed-raise")).session_id
    output = _agui(seed_mesh.edge, thread)
    assert "RUN_ERROR" in output["events"]
    assert "hunter2" not in json.dumps(output)


@pytest.mark.parametrize(
    ("agent", "content"), [("seed-summary", "You said: hi"), ("seed-stream", STREAMED)]
)
def test_simple_chat(seed_mesh: SeedMesh, agent: str, content: str) -> None:
    with httpx.Client(base_url=f"http://{seed_mesh.edge}", timeout=60) as rest:
        response = rest.post("/v1/chat", json={"message": "hi", "agent_name": agent})
    assert response.status_code == 200, response.text
    assert response.json()["content"] == content
