"""Building a turn's tools and the answers to a pause, without protobuf
plumbing: ``send(sid, msg, tools=[tool("get_weather", ...)])``, then
``send(sid, "", tool_results=[tool_result(call_id, "sunny")])`` or
``send(sid, "", resume=[approve(interrupt.id)])``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format

from turnmesh.v1 import message_pb2


def tool(
    name: str, description: str = "", parameters: Mapping[str, Any] | None = None
) -> message_pb2.ToolDefinition:
    """One of your own tools for a turn (``parameters``: its JSON Schema)."""
    definition = message_pb2.ToolDefinition(name=name, description=description)
    if parameters:
        json_format.ParseDict(dict(parameters), definition.parameters)
    return definition


def tool_result(tool_call_id: str, content: str = "", *, error: str = "") -> message_pb2.ToolResult:
    """What your tool returned for a call the session waits for (or ``error``)."""
    return message_pb2.ToolResult(tool_call_id=tool_call_id, content=content, error=error)


def resume(
    interrupt_id: str, payload: Any = None, *, status: str = "resolved"
) -> message_pb2.ResumeEntry:
    """The answer to an interrupt: ``payload`` any JSON value (a question's
    answer); ``status="cancelled"`` abandons it."""
    entry = message_pb2.ResumeEntry(interrupt_id=interrupt_id, status=status)
    if payload is not None:
        json_format.ParseDict(payload, entry.payload)
    return entry


def approve(interrupt_id: str, approved: bool = True) -> message_pb2.ResumeEntry:
    """Grant (or deny) the tool call a ``tool_approval`` interrupt gates."""
    return resume(interrupt_id, {"approved": approved})
