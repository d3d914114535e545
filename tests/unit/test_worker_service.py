"""WorkerService over a real in-process gRPC server and channel."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.protobuf import json_format

from turnmesh.agent import AgentRequest, AgentResponse, AgentRunnable, EventEmitter, TokenUsage
from turnmesh.agent.builtin.demo import DemoAgent
from turnmesh.agent.builtin.echo import EchoAgent
from turnmesh.runtime.interceptors import ErrorMappingInterceptor
from turnmesh.v1 import event_pb2, message_pb2, worker_service_pb2, worker_service_pb2_grpc
from turnmesh.worker import WorkerServicer

if TYPE_CHECKING:
    from turnmesh.v1.worker_service_pb2_grpc import WorkerServiceAsyncStub

ET = event_pb2.EventType


# --- test agents -----------------------------------------------------------


class RaisingAgent:
    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        await emitter.emit_delta("partial ")
        raise RuntimeError("db password is hunter2")


class BlockingAgent:
    """Blocks until cancelled, and records that the cancellation reached it."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        raise AssertionError("unreachable")


class GatedAgent:
    """Emits one delta, then waits for the test to have received it."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        await emitter.emit_delta("first ")
        await self.release.wait()  # deadlocks if the worker buffered the first delta
        await emitter.emit_delta("second")
        return AgentResponse(text="first second")


class FlaggingAgent:
    """Wraps an agent and flags when its run has returned."""

    def __init__(self, inner: AgentRunnable) -> None:
        self.inner = inner
        self.finished = asyncio.Event()

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        response = await self.inner.run(request, emitter=emitter)
        self.finished.set()
        return response


class RecordingAgent:
    """Streams nothing; returns fixed text and metadata; keeps the request it got."""

    def __init__(self, metadata: dict[str, Any] | None = None) -> None:
        self.requests: list[AgentRequest] = []
        self.metadata = metadata or {"model": "none", "n": 2}

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        self.requests.append(request)
        return AgentResponse(text="done", metadata=self.metadata)


class ToolThenTextAgent:
    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        call_id = await emitter.emit_tool_call("search", {"q": request.message})
        await emitter.emit_tool_result(call_id, "3 results")
        return AgentResponse(text="Found 3 results.", usage=TokenUsage(5, 3))


class WrongReturnAgent:
    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> Any:
        return "not a response"


# --- harness ---------------------------------------------------------------


@contextlib.asynccontextmanager
async def worker(
    agent: Any, name: str = "test"
) -> AsyncIterator[tuple[WorkerServiceAsyncStub, WorkerServicer]]:
    servicer = WorkerServicer(agent, agent_name=name, worker_id="worker-1")
    server = grpc.aio.server(interceptors=[ErrorMappingInterceptor()])
    worker_service_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield worker_service_pb2_grpc.WorkerServiceStub(channel), servicer
    finally:
        await server.stop(None)


def run_request(*messages: str, **kwargs: Any) -> worker_service_pb2.RunRequest:
    metadata = kwargs.pop("metadata", None)
    request = worker_service_pb2.RunRequest(
        session_id="sess-1", turn_id="turn-1", messages=list(messages), **kwargs
    )
    if metadata is not None:
        request.metadata.update(metadata)
    return request


async def collect(
    stub: WorkerServiceAsyncStub, request: worker_service_pb2.RunRequest
) -> list[event_pb2.Event]:
    return [event async for response in stub.Run(request) for event in response.events]


def names(events: list[event_pb2.Event]) -> list[str]:
    return [ET.Name(e.type) for e in events]


def assert_well_formed(events: list[event_pb2.Event]) -> None:
    # The server starts the turn and numbers its events: a worker sends only
    # the agent's events, then how the run ended, each with its timestamp.
    assert all(e.seq == 0 and not e.thread_id and not e.run_id for e in events)
    assert all(e.timestamp > 0 for e in events)
    assert ET.RUN_STARTED not in [e.type for e in events]
    assert events[-1].type in (ET.RUN_FINISHED, ET.RUN_ERROR)


# --- tests -----------------------------------------------------------------


async def test_echo_event_order_and_usage() -> None:
    async with worker(EchoAgent(), "echo") as (stub, _):
        events = await collect(stub, run_request("hello big world"))
    assert_well_formed(events)
    assert names(events) == [
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    text = events[0:5]
    assert events[0].role == "assistant"
    assert len({e.message_id for e in text}) == 1
    assert "".join(e.delta for e in text) == "hello big world"
    finished = events[-1]
    assert list(finished.usage) == [
        event_pb2.TokenUsage(input_tokens=3, output_tokens=3, total_tokens=6)
    ]
    assert finished.execution_time_ms >= 0


async def test_collected_messages_are_coalesced() -> None:
    async with worker(EchoAgent()) as (stub, _):
        events = await collect(stub, run_request("one", "two"))
    assert "".join(e.delta for e in events if e.type == ET.TEXT_MESSAGE_CONTENT) == "one\n\ntwo"


async def test_demo_calculator_tool_call_sequence() -> None:
    async with worker(DemoAgent(), "demo") as (stub, _):
        events = await collect(stub, run_request("What is 12*(3+4)?"))
    assert_well_formed(events)
    kinds = names(events)
    assert kinds[:4] == [
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
    ]
    assert kinds[4] == "TEXT_MESSAGE_START"
    assert set(kinds[5:-2]) == {"TEXT_MESSAGE_CONTENT"}
    assert len(kinds[5:-2]) > 1
    assert kinds[-2:] == ["TEXT_MESSAGE_END", "RUN_FINISHED"]

    start, args, end, result = events[0:4]
    assert start.tool_call_name == "calculator"
    assert start.parent_message_id
    assert args.delta == '{"expression":"12*(3+4)"}'
    assert start.tool_call_id == args.tool_call_id == end.tool_call_id == result.tool_call_id
    assert (result.content, result.role) == ("84", "tool")
    answer = "".join(e.delta for e in events if e.type == ET.TEXT_MESSAGE_CONTENT)
    assert answer == "12*(3+4) = 84."
    finished = events[-1]
    assert json_format.MessageToDict(finished.result) == {"rule": "calculator"}
    assert list(finished.usage) == [
        event_pb2.TokenUsage(input_tokens=3, output_tokens=3, total_tokens=6)
    ]


async def test_echo_deltas_arrive_while_the_agent_is_still_running() -> None:
    agent = FlaggingAgent(EchoAgent())
    first_delta_before_finish: bool | None = None
    contents = 0
    async with worker(agent) as (stub, _):
        async for response in stub.Run(run_request("a b c d e", metadata={"delay_ms": 50})):
            for event in response.events:
                if event.type == ET.TEXT_MESSAGE_CONTENT:
                    if contents == 0:
                        first_delta_before_finish = not agent.finished.is_set()
                    contents += 1
                if event.type == ET.RUN_FINISHED:
                    assert agent.finished.is_set()
    assert first_delta_before_finish is True
    assert contents == 5


async def test_first_delta_is_sent_before_the_agent_continues() -> None:
    agent = GatedAgent()
    async with worker(agent) as (stub, _):
        call = stub.Run(run_request("go"))
        received: list[event_pb2.Event] = []
        async with asyncio.timeout(10):  # fails, rather than hangs, if deltas were buffered
            async for response in call:
                for event in response.events:
                    received.append(event)
                    if event.type == ET.TEXT_MESSAGE_CONTENT and event.delta == "first ":
                        agent.release.set()
    assert names(received)[-1] == "RUN_FINISHED"
    assert [e.delta for e in received if e.type == ET.TEXT_MESSAGE_CONTENT] == [
        "first ",
        "second",
    ]


async def test_agent_exception_is_a_run_error_without_internals(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="turnmesh.worker"):
        async with worker(RaisingAgent()) as (stub, servicer):
            events = await collect(stub, run_request("hi"))
            assert servicer.inflight == 0
    assert_well_formed(events)
    assert names(events) == [
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "RUN_ERROR",
    ]
    error = events[-1]
    assert error.message == "the agent failed"
    assert error.code == "agent_error"
    assert error.problem == event_pb2.Problem(
        type="https://turnmesh.dev/problems/agent-error",
        title="Agent error",
        status=500,
        detail="the agent raised an error while running this turn",
    )
    for event in events:
        assert "hunter2" not in str(event)
        assert "RuntimeError" not in str(event)
    # ... but the server's log has the traceback.
    logged = [r for r in caplog.records if r.exc_info]
    assert logged
    assert "hunter2" in str(logged[0].exc_info[1])  # type: ignore[index]


async def test_wrong_return_type_is_a_run_error() -> None:
    async with worker(WrongReturnAgent()) as (stub, _):
        events = await collect(stub, run_request("hi"))
    assert names(events) == ["RUN_ERROR"]


async def test_client_cancel_reaches_the_agent() -> None:
    agent = BlockingAgent()
    async with worker(agent) as (stub, _):
        call = stub.Run(run_request("wait"))
        async with asyncio.timeout(10):
            await agent.started.wait()
            info = await stub.GetInfo(worker_service_pb2.GetInfoRequest())
            assert info.inflight_turns == 1
            call.cancel()
            await agent.cancelled.wait()
    assert call.cancelled()


async def test_final_text_without_streaming_is_sent_as_one_message() -> None:
    agent = RecordingAgent()
    async with worker(agent) as (stub, _):
        events = await collect(stub, run_request("hi"))
    assert names(events) == [
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    assert events[1].delta == "done"
    finished = events[-1]
    assert list(finished.usage) == []  # the agent reported none
    assert json_format.MessageToDict(finished.result) == {"model": "none", "n": 2}


async def test_text_after_the_last_tool_result_is_sent_when_not_streamed() -> None:
    async with worker(ToolThenTextAgent()) as (stub, _):
        events = await collect(stub, run_request("cats"))
    assert names(events) == [
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    assert events[5].delta == "Found 3 results."
    assert events[-1].usage[0] == event_pb2.TokenUsage(
        input_tokens=5, output_tokens=3, total_tokens=8
    )


async def test_metadata_that_json_cannot_hold_is_stringified() -> None:
    when = datetime(2024, 1, 2, tzinfo=UTC)
    async with worker(RecordingAgent(metadata={"at": when})) as (stub, _):
        events = await collect(stub, run_request("hi"))
    assert events[-1].type == ET.RUN_FINISHED
    assert json_format.MessageToDict(events[-1].result) == {"at": str(when)}


async def test_request_is_converted_for_the_agent() -> None:
    agent = RecordingAgent()
    history = [
        message_pb2.Message(role="user", content="What is 2+2?", turn_id="t0"),
        message_pb2.Message(
            role="assistant",
            tool_calls=[
                message_pb2.ToolCall(
                    id="c1",
                    type="function",
                    function=message_pb2.FunctionCall(name="calc", arguments='{"e":"2+2"}'),
                )
            ],
        ),
        message_pb2.Message(role="tool", content="4", tool_call_id="c1"),
        message_pb2.Message(role="assistant", content="4."),
    ]
    files = [
        message_pb2.File(content="héllo".encode(), mime_type="text/plain", filename="a.txt"),
        message_pb2.File(content=b"\xff\xfe", mime_type="text/csv", filename="b.csv"),
        message_pb2.File(content=b"\x89PNG", mime_type="image/png", filename="c.png"),
    ]
    request = run_request(
        "hi", history=history, files=files, metadata={"delay_ms": 5, "tags": ["x"]}
    )
    async with worker(agent) as (stub, _):
        await collect(stub, request)
    (got,) = agent.requests
    assert (got.message, got.messages, got.session_id, got.turn_id) == (
        "hi",
        ["hi"],
        "sess-1",
        "turn-1",
    )
    assert got.history == [
        {"role": "user", "content": "What is 2+2?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "calc", "arguments": '{"e":"2+2"}'},
                }
            ],
        },
        {"role": "tool", "content": "4", "tool_call_id": "c1"},
        {"role": "assistant", "content": "4."},
    ]
    assert got.metadata == {"delay_ms": 5, "tags": ["x"]}
    assert [(f.filename, f.mime_type, f.content, f.text) for f in got.files] == [
        ("a.txt", "text/plain", "héllo".encode(), "héllo"),
        ("b.csv", "text/csv", b"\xff\xfe", "\ufffd\ufffd"),
        ("c.png", "image/png", b"\x89PNG", None),
    ]


async def test_a_run_without_messages_is_invalid_before_any_event() -> None:
    async with worker(EchoAgent()) as (stub, _):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await collect(stub, worker_service_pb2.RunRequest(session_id="s", turn_id="t"))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "messages" in (caught.value.details() or "")


async def test_get_info() -> None:
    async with worker(EchoAgent(), "echo") as (stub, _):
        info = await stub.GetInfo(worker_service_pb2.GetInfoRequest())
    assert info == worker_service_pb2.GetInfoResponse(
        agent_name="echo", ready=True, worker_id="worker-1", inflight_turns=0
    )
