"""The simple chat API: ``POST /v1/chat`` and ``POST /v1/chat:stream``."""

from __future__ import annotations

from collections.abc import AsyncIterator

from turnmesh.runtime.events import Answer
from turnmesh.server.compat._common import Mesh, turn_error
from turnmesh.v1 import compat_service_pb2 as cpb
from turnmesh.v1 import event_pb2


async def _session_for(mesh: Mesh, request: cpb.ChatRequest) -> str:
    """The request's session, or a new one if it is absent, unknown or expired."""
    if request.session_id and await mesh.session_exists(request.session_id):
        return request.session_id
    return await mesh.create_session(None, request.agent_name or None)


async def stream(mesh: Mesh, request: cpb.ChatRequest) -> AsyncIterator[event_pb2.Event]:
    session_id = await _session_for(mesh, request)
    async with mesh.turn(session_id, request.message, files=request.files) as events:
        async for event in events:
            yield event


async def chat(mesh: Mesh, request: cpb.ChatRequest) -> cpb.ChatResponse:
    response = cpb.ChatResponse()
    calls: dict[str, cpb.ChatToolCall] = {}
    answer = Answer()
    async for event in stream(mesh, request):
        answer.feed(event)
        response.session_id = event.thread_id
        if event.type == event_pb2.TEXT_MESSAGE_START:
            response.message_id = event.message_id
        elif event.type == event_pb2.TOOL_CALL_START:
            calls[event.tool_call_id] = response.tool_calls.add(
                name=event.tool_call_name, status="pending"
            )
        elif event.type == event_pb2.TOOL_CALL_ARGS:
            calls[event.tool_call_id].arguments += event.delta
        elif event.type == event_pb2.TOOL_CALL_RESULT:
            calls[event.tool_call_id].status = "completed"
        elif event.type == event_pb2.RUN_FINISHED:
            response.execution_time_ms = event.execution_time_ms
        elif event.type == event_pb2.RUN_ERROR:
            raise turn_error(event)
    response.content = answer.text
    response.tokens_used.prompt_tokens = answer.usage.input_tokens
    response.tokens_used.completion_tokens = answer.usage.output_tokens
    response.tokens_used.total_tokens = answer.usage.total_tokens
    return response
