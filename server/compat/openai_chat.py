"""OpenAI chat completions (``POST /v1/chat/completions``), byte for byte what
the official SDK expects, streaming or not."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from google.api import httpbody_pb2
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from turnmesh.runtime.errors import TurnmeshError
from turnmesh.runtime.events import Answer
from turnmesh.server.compat._common import (
    ContentPart,
    Mesh,
    ToolCall,
    check_message,
    from_pydantic,
    invalid,
    json_body,
    parse_json_body,
    sse_body,
    turn_error,
)
from turnmesh.server.compat._files import Inline, decode, from_data_url, from_inline, unsupported
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content if p.type in ("text", "input_text"))

    def files(self, field: str) -> list[Inline]:
        """``image_url`` (a data: URL) and ``file`` (``file_data``) parts."""
        if not isinstance(self.content, list):
            return []
        files = []
        for index, part in enumerate(self.content):
            where = f"{field}.content[{index}]"
            extra = part.model_extra or {}
            if part.type == "image_url":
                image = extra.get("image_url")
                url = image.get("url") if isinstance(image, dict) else image
                if not isinstance(url, str):
                    raise invalid(f"{where}.image_url.url", "required")
                files.append(from_data_url(url, f"{where}.image_url.url"))
            elif part.type == "file":
                file = extra.get("file")
                if not isinstance(file, dict):
                    raise invalid(f"{where}.file", "required")
                if file.get("file_id"):
                    raise unsupported(f"{where}.file.file_id", "file ids")
                data, filename = file.get("file_data"), file.get("filename") or ""
                if not isinstance(data, str) or not data:
                    raise invalid(f"{where}.file.file_data", "required")
                files.append(from_inline(data, str(filename), f"{where}.file.file_data"))
            elif part.type not in ("text", "input_text"):
                raise invalid(f"{where}.type", f"{part.type!r} parts are not supported")
        return files


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    # Sampling options and the like are accepted and left to the agent.
    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1, max_length=128)
    messages: list[ChatMessage] = Field(min_length=1, max_length=1000)
    stream: bool = False
    stream_options: _StreamOptions | None = None
    # OpenAI's stored-completion tags; here they reach the agent as the
    # turn's metadata, as on Responses.
    metadata: dict[str, str] | None = Field(default=None, max_length=16)


def to_history(messages: list[ChatMessage]) -> list[message_pb2.Message]:
    history = []
    for m in messages:
        role = "system" if m.role == "developer" else m.role
        message = message_pb2.Message(
            role=role, content=m.text(), tool_call_id=m.tool_call_id or ""
        )
        for call in m.tool_calls or ():
            call.add_to(message)
        history.append(message)
    return history


class Turn:
    """One chat completion's turn: which session, and how it ends."""

    def __init__(self, session_id: str, throwaway: bool) -> None:
        self.session_id = session_id
        self.throwaway = throwaway
        self.metadata: dict[str, str] = {}
        self.on_disconnect: spb.DisconnectPolicy.ValueType = spb.DISCONNECT_POLICY_CANCEL
        self.id = ""
        self.created = int(time.time())
        self.answer = Answer()
        self.files: list[message_pb2.File] = []

    @property
    def usage(self) -> dict[str, int]:
        usage = self.answer.usage
        return {
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.total_tokens,
        }


async def open_turn(
    mesh: Mesh,
    request: ChatCompletionRequest,
    session_header: str | None,
    on_disconnect: spb.DisconnectPolicy.ValueType,
) -> tuple[Turn, str]:
    """The session for this request, and the new user message."""
    turn, message = await _open(mesh, request, session_header)
    turn.metadata = dict(request.metadata or {})
    turn.on_disconnect = on_disconnect
    return turn, message


async def _open(
    mesh: Mesh, request: ChatCompletionRequest, session_header: str | None
) -> tuple[Turn, str]:
    last = request.messages[-1]
    if last.role != "user":
        raise invalid(
            f"messages[{len(request.messages) - 1}].role", "the last message must be the user's"
        )
    last_index = len(request.messages) - 1
    check_message(last.text(), f"messages[{last_index}].content")
    if session_header and await mesh.session_exists(session_header):
        turn = Turn(session_header, throwaway=False)
        turn.files = await decode(last.files(f"messages[{last_index}]"))
        return turn, last.text()
    # A new session: files anywhere in the conversation go with this turn
    # (the history it is seeded with holds text only).
    files = await decode(
        [
            file
            for index, m in enumerate(request.messages)
            if m.role == "user"
            for file in m.files(f"messages[{index}]")
        ]
    )
    history = to_history(request.messages[:-1])
    session_id = await mesh.create_session(
        session_header or None, request.model, history, param="model"
    )
    turn = Turn(session_id, throwaway=not session_header)
    turn.files = files
    return turn, last.text()


async def parse(body: httpbody_pb2.HttpBody) -> ChatCompletionRequest:
    data = await parse_json_body(body)
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise from_pydantic(exc, data) from exc


async def events(mesh: Mesh, turn: Turn, message: str) -> AsyncIterator[event_pb2.Event]:
    """The turn's events, each folded into ``turn.answer`` first."""
    started = ended = False
    try:
        async with mesh.turn(
            turn.session_id,
            message,
            files=turn.files,
            metadata=turn.metadata,
            on_disconnect=turn.on_disconnect,
        ) as stream:
            async for event in stream:
                if not turn.id:
                    turn.id = f"chatcmpl-{event.run_id}"
                turn.answer.feed(event)
                started = True
                ended = event.type in (event_pb2.RUN_FINISHED, event_pb2.RUN_ERROR)
                yield event
    finally:
        # A client that left asking to continue may come back for the turn
        # (SubscribeTurn, GetHistory): its session stays until the TTL.
        left_to_run = started and not ended and turn.on_disconnect == spb.DISCONNECT_POLICY_CONTINUE
        if turn.throwaway and not left_to_run:
            with contextlib.suppress(TurnmeshError):  # it would expire anyway
                await mesh.delete_session(turn.session_id)


def error_payload(event: event_pb2.Event) -> dict[str, Any]:
    return {
        "error": {
            "message": event.message or "the turn failed",
            "type": "server_error",
            "param": None,
            "code": event.code or None,
        }
    }


async def complete(
    mesh: Mesh, request: ChatCompletionRequest, turn: Turn, message: str
) -> httpbody_pb2.HttpBody:
    async for event in events(mesh, turn, message):
        if event.type == event_pb2.RUN_ERROR:
            raise turn_error(event)
    return json_body(
        {
            "id": turn.id,
            "object": "chat.completion",
            "created": turn.created,
            "model": request.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": turn.answer.text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": turn.usage,
            "system_fingerprint": None,
        }
    )


async def stream(
    mesh: Mesh, request: ChatCompletionRequest, turn: Turn, message: str
) -> AsyncIterator[httpbody_pb2.HttpBody]:
    include_usage = bool(request.stream_options and request.stream_options.include_usage)

    def chunk(delta: dict[str, Any], finish: str | None = None) -> httpbody_pb2.HttpBody:
        payload: dict[str, Any] = {
            "id": turn.id,
            "object": "chat.completion.chunk",
            "created": turn.created,
            "model": request.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            payload["usage"] = None
        return sse_body(payload)

    async for event in events(mesh, turn, message):
        if event.type == event_pb2.RUN_STARTED:
            yield chunk({"role": "assistant", "content": "", "refusal": None})
        elif event.type == event_pb2.TEXT_MESSAGE_CONTENT:
            yield chunk({"content": event.delta})
        elif event.type == event_pb2.RUN_FINISHED:
            yield chunk({}, "stop")
            if include_usage:
                usage_chunk = {
                    "id": turn.id,
                    "object": "chat.completion.chunk",
                    "created": turn.created,
                    "model": request.model,
                    "system_fingerprint": None,
                    "choices": [],
                    "usage": turn.usage,
                }
                yield sse_body(usage_chunk)
        elif event.type == event_pb2.RUN_ERROR:
            # After the first chunk an HTTP status can no longer change: the
            # SDK raises an APIError for an `error` frame.
            yield sse_body(error_payload(event))
            break
    yield sse_body("[DONE]")
