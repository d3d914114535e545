"""AG-UI (``POST /v1/agui``): a RunAgentInput in, AG-UI events out over SSE.

The events carry only the fields AG-UI defines for each type (with AG-UI's
value types), so the real client validates them without a warning.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, Literal

from google.api import httpbody_pb2
from google.protobuf import json_format
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from turnmesh.runtime.errors import AlreadyExists
from turnmesh.server.compat._common import (
    POLICIES,
    Mesh,
    ToolCall,
    from_pydantic,
    invalid,
    parse_json_body,
    sse_body,
)
from turnmesh.server.compat._files import Inline, decode, unsupported
from turnmesh.v1 import event_pb2, message_pb2


class _Part(BaseModel):
    """A content part (AG-UI 1.0): text, or media with a ``source``."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None
    source: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


class AguiMessage(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    id: str = ""
    role: Literal["developer", "system", "assistant", "user", "tool"]
    content: str | list[_Part] | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list, alias="toolCalls")
    tool_call_id: str | None = Field(default=None, alias="toolCallId")

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(p.text or "" for p in self.content if p.type == "text")

    def files(self, field: str) -> list[Inline]:
        """``image`` and ``document`` parts whose source is inline data."""
        if not isinstance(self.content, list):
            return []
        files = []
        for index, part in enumerate(self.content):
            where = f"{field}.content[{index}]"
            if part.type == "text":
                continue
            if part.type not in ("image", "document"):
                raise invalid(f"{where}.type", f"{part.type!r} parts are not supported")
            source = part.source or {}
            if source.get("type") != "data":
                raise unsupported(f"{where}.source", "url and file sources")
            value, mime_type = source.get("value"), source.get("mimeType")
            if not isinstance(value, str) or not isinstance(mime_type, str):
                raise invalid(f"{where}.source", "needs value (base64) and mimeType")
            filename = (part.metadata or {}).get("filename")
            name = filename if isinstance(filename, str) else ""
            files.append(Inline(value, mime_type, name, f"{where}.source.value"))
        return files


class RunAgentInput(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    thread_id: str = Field(alias="threadId", min_length=1, max_length=128)
    run_id: str = Field(default="", alias="runId")
    messages: list[AguiMessage] = Field(min_length=1, max_length=1000)
    state: Any = None
    tools: list[Any] = Field(default_factory=list)
    context: list[Any] = Field(default_factory=list)
    forwarded_props: dict[str, Any] = Field(default_factory=dict, alias="forwardedProps")


async def parse(body: httpbody_pb2.HttpBody) -> RunAgentInput:
    data = await parse_json_body(body)
    try:
        run = RunAgentInput.model_validate(data)
    except ValidationError as exc:
        raise from_pydantic(exc, data) from exc
    if run.messages[-1].role != "user":
        raise invalid(
            f"messages[{len(run.messages) - 1}].role", "the last message must be the user's"
        )
    policy = run.forwarded_props.get("policy", "collect")
    if not isinstance(policy, str) or policy not in POLICIES:
        raise invalid("forwardedProps.policy", f"one of {', '.join(sorted(POLICIES))}")
    return run


def _history(messages: list[AguiMessage]) -> list[message_pb2.Message]:
    history = []
    for m in messages:
        message = message_pb2.Message(
            role="system" if m.role == "developer" else m.role,
            content=m.text(),
            tool_call_id=m.tool_call_id or "",
        )
        for call in m.tool_calls:
            call.add_to(message)
        history.append(message)
    return history


def to_agui(event: event_pb2.Event, thread_id: str, run_id: str) -> dict[str, Any] | None:
    """Our event as AG-UI's, with exactly AG-UI's fields."""
    t = event.type
    out: dict[str, Any] = {"type": event_pb2.EventType.Name(t)}
    if event.timestamp:
        out["timestamp"] = int(event.timestamp)
    if t in (event_pb2.RUN_STARTED, event_pb2.RUN_FINISHED):
        out.update(threadId=thread_id, runId=run_id)
        if t == event_pb2.RUN_FINISHED and event.HasField("result"):
            out["result"] = json_format.MessageToDict(event.result)
    elif t == event_pb2.RUN_ERROR:
        out.update(message=event.message or "the run failed", code=event.code or "error")
    elif t == event_pb2.TEXT_MESSAGE_START:
        out.update(messageId=event.message_id, role="assistant")
    elif t == event_pb2.TEXT_MESSAGE_CONTENT:
        out.update(messageId=event.message_id, delta=event.delta)
    elif t == event_pb2.TEXT_MESSAGE_END:
        out.update(messageId=event.message_id)
    elif t == event_pb2.TOOL_CALL_START:
        out.update(toolCallId=event.tool_call_id, toolCallName=event.tool_call_name)
        if event.parent_message_id:
            out["parentMessageId"] = event.parent_message_id
    elif t == event_pb2.TOOL_CALL_ARGS:
        out.update(toolCallId=event.tool_call_id, delta=event.delta)
    elif t == event_pb2.TOOL_CALL_END:
        out.update(toolCallId=event.tool_call_id)
    elif t == event_pb2.TOOL_CALL_RESULT:
        out.update(
            messageId=event.message_id,
            toolCallId=event.tool_call_id,
            content=event.content,
            role="tool",
        )
    elif t == event_pb2.CUSTOM:
        out.update(
            name=event.name,
            value=json_format.MessageToDict(event.value) if event.HasField("value") else None,
        )
    else:
        return None
    return out


async def run(mesh: Mesh, request: RunAgentInput) -> AsyncIterator[httpbody_pb2.HttpBody]:
    thread = request.thread_id
    last = len(request.messages) - 1
    message = request.messages[last].text()
    files = await decode(request.messages[last].files(f"messages[{last}]"))
    if not await mesh.session_exists(thread):
        agent = request.forwarded_props.get("agent")
        # A concurrent first run on the same thread may have created it.
        with contextlib.suppress(AlreadyExists):
            await mesh.create_session(
                thread, agent if isinstance(agent, str) else None, _history(request.messages[:-1])
            )
    run_id = request.run_id
    policy = POLICIES[request.forwarded_props.get("policy", "collect")]
    async with mesh.turn(thread, message, policy=policy, files=files) as stream:
        async for event in stream:
            run_id = run_id or event.run_id
            payload = to_agui(event, thread, run_id)
            if payload is not None:
                yield sse_body(payload)
