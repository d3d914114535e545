"""RunRequest (protobuf) -> AgentRequest (what the agent sees)."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from turnmesh.agent import (
    AgentFile,
    AgentRequest,
    ClientTool,
    Interrupt,
    Resume,
    ToolResult,
)
from turnmesh.runtime.errors import FieldViolation, InvalidArgument
from turnmesh.runtime.principals import principal_of
from turnmesh.v1 import event_pb2, message_pb2, worker_service_pb2

__all__ = ["to_agent_request"]


def to_agent_request(
    request: worker_service_pb2.RunRequest, history: list[dict[str, Any]] | None = None
) -> AgentRequest:
    """``history``: the whole history, when the caller resolved it (the
    request may carry only its tail); else the request's own."""
    if not request.messages and not request.tool_results and not request.resume:
        raise InvalidArgument([FieldViolation("messages", "at least one message is required")])
    if history is None:
        history = [history_message(m) for m in request.history]
    return AgentRequest.from_messages(
        list(request.messages),
        session_id=request.session_id,
        turn_id=request.turn_id,
        history=history,
        metadata=json_format.MessageToDict(request.metadata)
        if request.HasField("metadata")
        else {},
        files=[agent_file(f) for f in request.files],
        principal=principal_of(request.session_id),
        tools=[client_tool(t) for t in request.tools],
        tool_results=tool_results(request),
        resume=resume_entries(request, history),
        checkpoint=request.answering.agent_checkpoint,
    )


def client_tool(tool: message_pb2.ToolDefinition) -> ClientTool:
    return ClientTool(
        name=tool.name,
        description=tool.description,
        parameters=json_format.MessageToDict(tool.parameters),
    )


def tool_results(request: worker_service_pb2.RunRequest) -> list[ToolResult]:
    names = {call.id: call.function.name for call in request.answering.tool_calls}
    return [
        ToolResult(
            tool_call_id=r.tool_call_id,
            content=r.content,
            error=r.error or None,
            name=names.get(r.tool_call_id, ""),
        )
        for r in request.tool_results
    ]


def resume_entries(
    request: worker_service_pb2.RunRequest, history: list[dict[str, Any]]
) -> list[Resume]:
    """Each answer with the interrupt it answers and, for an approval, the
    call it gates (from the paused turn: the history's tail)."""
    asked = {i.id: i for i in request.answering.interrupts}
    wanted = {i.tool_call_id for i in asked.values() if i.tool_call_id}
    calls: dict[str, dict[str, Any]] = {}
    for message in reversed(history):
        if len(calls) == len(wanted):
            break
        for call in message.get("tool_calls", ()):
            if call["id"] in wanted:
                calls[call["id"]] = call
    out = []
    for entry in request.resume:
        interrupt = asked.get(entry.interrupt_id, event_pb2.Interrupt(id=entry.interrupt_id))
        call = calls.get(interrupt.tool_call_id)
        out.append(
            Resume(
                interrupt=agent_interrupt(interrupt),
                status=entry.status,
                payload=json_format.MessageToDict(entry.payload)
                if entry.HasField("payload")
                else None,
                tool_call=call,
            )
        )
    return out


def agent_interrupt(interrupt: event_pb2.Interrupt) -> Interrupt:
    return Interrupt(
        id=interrupt.id,
        reason=interrupt.reason,
        message=interrupt.message,
        tool_call_id=interrupt.tool_call_id or None,
        response_schema=json_format.MessageToDict(interrupt.response_schema)
        if interrupt.HasField("response_schema")
        else None,
        metadata=json_format.MessageToDict(interrupt.metadata),
    )


def _call_dict(call: message_pb2.ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": call.type or "function",
        "function": {"name": call.function.name, "arguments": call.function.arguments},
    }


def history_message(message: message_pb2.Message) -> dict[str, Any]:
    """A history message in the OpenAI chat shape."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [_call_dict(call) for call in message.tool_calls]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.error:
        out["error"] = message.error
    if message.metadata.fields:
        # A turn's final answer keeps its agent's RUN_FINISHED.result: what
        # an agent noted for its next turns (a2a: the remote's context).
        out["metadata"] = json_format.MessageToDict(message.metadata)
    if message.files:
        # Earlier turns' files, as read then: agents can answer from them later.
        out["files"] = [
            {"filename": f.filename, "mime_type": f.mime_type, "text": f.text, "error": f.error}
            for f in message.files
        ]
    return out


def agent_file(file: message_pb2.File) -> AgentFile:
    text = None
    if file.mime_type.lower().startswith("text/"):
        text = file.content.decode("utf-8", errors="replace")
    return AgentFile(
        filename=file.filename, mime_type=file.mime_type, content=file.content, text=text
    )
