"""RunRequest (protobuf) -> AgentRequest (what the agent sees)."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from turnmesh.agent import AgentFile, AgentRequest
from turnmesh.runtime.errors import FieldViolation, InvalidArgument
from turnmesh.runtime.principals import principal_of
from turnmesh.v1 import message_pb2, worker_service_pb2

__all__ = ["to_agent_request"]


def to_agent_request(
    request: worker_service_pb2.RunRequest, history: list[dict[str, Any]] | None = None
) -> AgentRequest:
    """``history``: the whole history, when the caller resolved it (the
    request may carry only its tail); else the request's own."""
    if not request.messages:
        raise InvalidArgument([FieldViolation("messages", "at least one message is required")])
    return AgentRequest.from_messages(
        list(request.messages),
        session_id=request.session_id,
        turn_id=request.turn_id,
        history=history if history is not None else [history_message(m) for m in request.history],
        metadata=json_format.MessageToDict(request.metadata)
        if request.HasField("metadata")
        else {},
        files=[agent_file(f) for f in request.files],
        principal=principal_of(request.session_id),
    )


def history_message(message: message_pb2.Message) -> dict[str, Any]:
    """A history message in the OpenAI chat shape."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": call.type or "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
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
