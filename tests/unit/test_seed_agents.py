"""``kind: areal``: agents written for the seed's ``AgentRunnable`` (AReaL's agent
service) run unmodified in a worker, their emitter mapped onto turnmesh's."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.protobuf import json_format

from tests.support import seed_agents
from tests.support.seed_agents import CLOCK, GHOST, TOOL_SUMMARY, WEATHER
from turnmesh.agent import AgentFile, AgentLoadError, load_agent
from turnmesh.agent import AgentRequest as NativeRequest
from turnmesh.agent.areal import (
    AgentRequest,
    AgentResponse,
    AReaLAgent,
    EventEmitter,
    QueueMode,
    seed_request,
)
from turnmesh.runtime.interceptors import ErrorMappingInterceptor
from turnmesh.v1 import event_pb2, message_pb2, worker_service_pb2, worker_service_pb2_grpc
from turnmesh.worker import WorkerServicer

if TYPE_CHECKING:
    from turnmesh.v1.worker_service_pb2_grpc import WorkerServiceAsyncStub

ET = event_pb2.EventType
SEED = "tests.support.seed_agents"


# --- harness: the adapter in a real WorkerServicer, over in-process gRPC ------


@contextlib.asynccontextmanager
async def _worker(agent: AReaLAgent) -> AsyncIterator[WorkerServiceAsyncStub]:
    server = grpc.aio.server(interceptors=[ErrorMappingInterceptor()])
    servicer = WorkerServicer(agent, agent_name=agent.name, worker_id="worker-1")
    worker_service_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield worker_service_pb2_grpc.WorkerServiceStub(channel)
    finally:
        await server.stop(None)


async def _turn(agent: AReaLAgent, message: str = "hi", **fields: Any) -> list[event_pb2.Event]:
    metadata = fields.pop("metadata", None)
    request = worker_service_pb2.RunRequest(
        session_id="sess-1", turn_id="turn-1", messages=[message], **fields
    )
    if metadata is not None:
        request.metadata.update(metadata)
    async with _worker(agent) as stub:
        return [event async for response in stub.Run(request) for event in response.events]


def _names(events: list[event_pb2.Event]) -> list[str]:
    return [ET.Name(e.type) for e in events]


def _text(events: list[event_pb2.Event]) -> str:
    return "".join(e.delta for e in events if e.type == ET.TEXT_MESSAGE_CONTENT)


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "seed.yaml"
    path.write_text(text)
    return str(path)


# --- agent files ---------------------------------------------------------------


def test_kind_areal_wraps_the_class_under_the_files_name(tmp_path: Path) -> None:
    name, agent = load_agent(
        _write(tmp_path, f"name: seeder\nkind: areal\nclass: {SEED}:ToolAgent\n")
    )
    assert name == "seeder"
    assert isinstance(agent, AReaLAgent)
    assert agent.name == "seeder"
    assert isinstance(agent.agent, seed_agents.ToolAgent)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: a\nkind: areal\n", "an areal agent needs `class` (package.module:Class)"),
        ("name: a\nkind: echo\nclass: x:Y\n", "`class` is for areal agents"),
        ("name: a\nkind: areal\nclass: no_colon\n", "class: Value error, expected package"),
        ("name: a\nkind: areal\nclass: ':Agent'\n", "expected package.module:Class"),
        (
            "name: a\nkind: areal\nclass: no_such_module_xyz:Agent\n",
            "class: cannot import module 'no_such_module_xyz'",
        ),
        (f"name: a\nkind: areal\nclass: {SEED}:Nobody\n", "has no attribute 'Nobody'"),
        (f"name: a\nkind: areal\nclass: {SEED}:LookAlikeResponse\n", "is not an agent"),
        ("name: a\nkind: areal\nagent_class: x:Y\n", "agent_class: Extra inputs"),
    ],
)
def test_a_bad_areal_file_names_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(AgentLoadError) as refused:
        load_agent(path)
    assert message in str(refused.value)
    assert path in str(refused.value)


def test_an_instance_is_wrapped_as_it_is() -> None:
    agent = AReaLAgent(seed_agents.StreamingAgent())
    assert agent.name == "streamingagent"
    assert AReaLAgent(f"{SEED}:StreamingAgent", name="s").name == "s"


# --- the request the seed agent sees ---------------------------------------------


def test_the_request_has_the_seeds_fields_and_types() -> None:
    native = NativeRequest.from_messages(
        ["one", "two"],
        session_id="alice/thread",
        turn_id="turn-9",
        history=[
            {"role": "user", "content": "look", "files": [{"filename": "a.txt", "text": "x"}]},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "content": "r", "tool_call_id": "c1"},
        ],
        metadata={"k": [1, 2]},
        files=[
            AgentFile("notes.txt", "text/plain", b"", text="the notes"),
            AgentFile("blank.txt", "text/plain", b"", text=""),
        ],
    )
    request = seed_request(native)
    assert isinstance(request, AgentRequest)
    assert (request.session_key, request.run_id) == ("alice/thread", "turn-9")
    assert request.message.startswith("one\n\ntwo\n\n<file name='notes.txt'")
    assert "the notes" in request.message
    assert request.queue_mode is QueueMode.COLLECT
    assert isinstance(request.queue_mode, str)  # a str enum, as the seed's
    assert request.queue_mode.value == "collect"
    assert request.metadata == {"k": [1, 2]}
    request.metadata["k"] = "changed"  # the agent's copy, not the turn's
    assert native.metadata == {"k": [1, 2]}
    assert request.history == [
        {"role": "user", "content": "look"},  # turnmesh's `files` key dropped
        native.history[1],
        native.history[2],
    ]


def test_no_files_leave_the_message_as_it_is() -> None:
    native = NativeRequest.from_messages(["just this"], session_id="s", turn_id="t")
    assert seed_request(native).message == "just this"
    assert seed_request(native).history == []


# --- each seed agent through a worker -----------------------------------------------


async def test_a_summary_only_agent_answers_with_its_summary() -> None:
    history = [
        message_pb2.Message(role="user", content="earlier"),
        message_pb2.Message(role="assistant", content="You said: earlier"),
    ]
    events = await _turn(
        AReaLAgent(f"{SEED}:SummaryAgent"), "hello", history=history, metadata={"tag": "x"}
    )
    assert _names(events) == [
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    assert _text(events) == "You said: hello"
    assert json_format.MessageToDict(events[-1].result) == {
        "session_key": "sess-1",
        "run_id": "turn-1",
        "queue_mode": "collect",
        "history": [["user", "earlier"], ["assistant", "You said: earlier"]],
        "metadata": {"tag": "x"},
    }


async def test_a_streaming_agent_streams_and_is_not_repeated() -> None:
    events = await _turn(AReaLAgent(f"{SEED}:StreamingAgent"), "hi")
    assert _names(events) == [
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    assert [e.delta for e in events[1:4]] == ["Streaming", " back:", " hi"]
    assert json_format.MessageToDict(events[-1].result) == {"words": 3.0}


async def test_tool_results_are_matched_by_name_first_in_first_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="turnmesh.agent.areal"):
        events = await _turn(AReaLAgent(f"{SEED}:ToolAgent", name="tools"), "go")
    starts = [e for e in events if e.type == ET.TOOL_CALL_START]
    results = [e for e in events if e.type == ET.TOOL_CALL_RESULT]
    assert [s.tool_call_name for s in starts] == ["weather", "weather", "clock", "ghost"]
    ids = [s.tool_call_id for s in starts]
    assert len(set(ids)) == 4
    assert all(i.startswith("call_") for i in ids)
    args = {e.tool_call_id: e.delta for e in events if e.type == ET.TOOL_CALL_ARGS}
    assert json.loads(args[ids[0]]) == {"city": "Oslo"}
    assert json.loads(args[ids[1]]) == {"city": "Lima"}
    # Each result answers its call: Oslo's the first weather call, Lima's the second.
    assert {r.tool_call_id: r.content for r in results} == {
        ids[0]: WEATHER["Oslo"],
        ids[1]: WEATHER["Lima"],
        ids[2]: CLOCK,
        ids[3]: GHOST,
    }
    # The result that named no open call became a whole call of its own.
    ghost = [e for e in events if e.tool_call_id == ids[3]]
    assert _names(ghost) == [
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
    ]
    assert ghost[1].delta == "{}"
    assert [r.message for r in caplog.records] == [
        "areal agent tools sent a result for 'ghost' with no open call of that name: "
        "sent as a call of its own"
    ]
    # Text before the calls, then the summary as the answer after the last result.
    assert _names(events)[:3] == ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"]
    assert events[1].delta == "Let me look that up."
    assert _names(events)[-4:] == [
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    assert events[-3].delta == TOOL_SUMMARY


async def test_a_raising_agent_is_a_generic_agent_error(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        events = await _turn(AReaLAgent(f"{SEED}:RaisingAgent"))
    assert _names(events) == ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "RUN_ERROR"]
    error = events[-1]
    assert (error.message, error.code) == ("the agent failed", "agent_error")
    assert error.problem.title == "Agent error"
    assert "hunter2" not in str(events)
    logged = [r for r in caplog.records if r.exc_info]
    assert "hunter2" in str(logged[0].exc_info[1])  # type: ignore[index]


class _WrongReturn:
    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> Any:
        return "not a response"


async def test_a_response_without_a_summary_is_an_agent_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR):
        events = await _turn(AReaLAgent(_WrongReturn()))
    assert _names(events) == ["RUN_ERROR"]
    assert events[-1].code == "agent_error"
    logged = [r for r in caplog.records if r.exc_info]
    assert "must return an AgentResponse" in str(logged[0].exc_info[1])  # type: ignore[index]


# --- the emitter alone ------------------------------------------------------------


class _Recorder:
    """turnmesh's emitter, recording."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def emit_delta(self, text: str) -> None:
        self.calls.append(("delta", text))

    async def emit_tool_call(
        self, name: str, arguments: Mapping[str, Any] | str, *, call_id: str | None = None
    ) -> str:
        assert call_id is not None  # the adapter always names its calls
        self.calls.append(("call", name, arguments, call_id))
        return call_id

    async def emit_tool_result(self, call_id: str, content: str) -> None:
        self.calls.append(("result", call_id, content))


class _AfterTheLastCall:
    """Calls a tool once, answers it, then answers it again."""

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        await emitter.emit_tool_call("f", '{"n": 1}')
        await emitter.emit_tool_result("f", "first")
        await emitter.emit_tool_result("f", "again")
        return AgentResponse()


async def test_a_second_result_for_an_answered_call_opens_a_new_one() -> None:
    recorder = _Recorder()
    native = NativeRequest.from_messages(["x"], session_id="s", turn_id="t")
    response = await AReaLAgent(_AfterTheLastCall()).run(native, emitter=recorder)
    assert (response.text, response.metadata) == ("", {})
    (_, _, _, first), result, (_, _, args, second), again = recorder.calls
    assert result == ("result", first, "first")
    assert again == ("result", second, "again")
    assert first != second
    assert args == "{}"


class _Hooks:
    def __init__(self) -> None:
        self.closed: list[str] = []

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        return AgentResponse()

    async def close_session(self, session_key: str) -> None:
        self.closed.append(session_key)

    async def close_all_sessions(self) -> None:
        self.closed.append("*")


async def test_the_seeds_hooks_are_called_under_turnmeshs_names() -> None:
    inner = _Hooks()
    agent = AReaLAgent(inner)
    await agent.close_session("s1")
    await agent.close()
    assert inner.closed == ["s1", "*"]
    # An agent without the hooks is fine too.
    without = AReaLAgent(seed_agents.StreamingAgent())
    await without.close_session("s1")
    await without.close()
