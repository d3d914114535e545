"""OpenAI Responses (``POST /v1/responses``, ``GET /v1/responses/{id}``).

A response id names its session and turn (``resp_<turn>.<session, base64url>``),
so any server can continue or read it without a shared index.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from google.api import httpbody_pb2
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from turnmesh.runtime.errors import NotFound
from turnmesh.runtime.events import Answer
from turnmesh.server.compat._common import (
    ContentPart,
    Mesh,
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


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content)

    def files(self, field: str) -> list[Inline]:
        """``input_image`` (a data: URL) and ``input_file`` (``file_data``) parts."""
        if isinstance(self.content, str):
            return []
        files = []
        for index, part in enumerate(self.content):
            where = f"{field}.content[{index}]"
            extra = part.model_extra or {}
            if extra.get("file_id"):
                raise unsupported(f"{where}.file_id", "file ids")
            if part.type == "input_image":
                url = extra.get("image_url")
                if not isinstance(url, str):
                    raise invalid(f"{where}.image_url", "required")
                files.append(from_data_url(url, f"{where}.image_url"))
            elif part.type == "input_file":
                if extra.get("file_url"):
                    raise unsupported(f"{where}.file_url", "file URLs")
                data, filename = extra.get("file_data"), extra.get("filename") or ""
                if not isinstance(data, str) or not data:
                    raise invalid(f"{where}.file_data", "required")
                files.append(from_inline(data, str(filename), f"{where}.file_data"))
            elif part.type not in ("input_text", "output_text", "text"):
                raise invalid(f"{where}.type", f"{part.type!r} parts are not supported")
        return files


class ResponseRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1, max_length=128)
    input: str | list[InputMessage]
    instructions: str | None = None
    stream: bool = False
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None

    def items(self) -> list[InputMessage]:
        if isinstance(self.input, str):
            return [InputMessage(role="user", content=self.input)]
        return self.input


def response_id(session_id: str, turn_id: str) -> str:
    encoded = base64.urlsafe_b64encode(session_id.encode()).decode().rstrip("=")
    return f"resp_{turn_id}.{encoded}"


def parse_response_id(value: str, field: str) -> tuple[str, str]:
    try:
        turn_id, encoded = value.removeprefix("resp_").split(".", 1)
        session_id = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise invalid(field, "not a response id from this service") from exc
    if not value.startswith("resp_") or not turn_id or not session_id:
        raise invalid(field, "not a response id from this service")
    return session_id, turn_id


async def parse(body: httpbody_pb2.HttpBody) -> ResponseRequest:
    data = await parse_json_body(body)
    try:
        request = ResponseRequest.model_validate(data)
    except ValidationError as exc:
        raise from_pydantic(exc) from exc
    items = request.items()
    if not items or items[-1].role != "user":
        raise invalid("input", "must end with a user message")
    return request


class Response:
    """The response object, as it grows."""

    def __init__(self, request: ResponseRequest, session_id: str) -> None:
        self.request = request
        self.session_id = session_id
        self.id = ""
        self.item_id = ""
        self.created_at = int(time.time())
        self.answer = Answer()
        # Streamed: every delta sent (a content part's text is its deltas).
        self.streamed: list[str] | None = None
        self.status = "in_progress"
        self.error: dict[str, str] | None = None
        self.files: list[message_pb2.File] = []
        self.on_disconnect: spb.DisconnectPolicy.ValueType = spb.DISCONNECT_POLICY_CANCEL

    def started(self, turn_id: str) -> None:
        self.id = response_id(self.session_id, turn_id)
        self.item_id = f"msg_{turn_id}"

    @property
    def text(self) -> str:
        return "".join(self.streamed) if self.streamed is not None else self.answer.text

    @property
    def usage(self) -> dict[str, int]:
        usage = self.answer.usage
        return {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "total_tokens": usage.total_tokens,
        }

    def part(self) -> dict[str, Any]:
        return {"type": "output_text", "text": self.text, "annotations": []}

    def item(self, status: str) -> dict[str, Any]:
        content = [self.part()] if status == "completed" else []
        return {
            "id": self.item_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def body(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "model": self.request.model,
            "output": [self.item("completed")] if self.status == "completed" else [],
            "usage": {
                **self.usage,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
            "instructions": self.request.instructions,
            "metadata": self.request.metadata or {},
            "previous_response_id": self.request.previous_response_id,
            "error": self.error,
            "incomplete_details": None,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "temperature": None,
            "top_p": None,
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "store": True,
        }

    def feed(self, event: event_pb2.Event) -> None:
        self.answer.feed(event)
        if event.type == event_pb2.RUN_STARTED:
            self.started(event.run_id)
        elif event.type == event_pb2.RUN_FINISHED:
            self.status = "completed"


async def open_response(mesh: Mesh, request: ResponseRequest) -> tuple[Response, str]:
    """The session this request continues or starts, and the new user message."""
    items = request.items()
    message = items[-1].text()
    if request.previous_response_id:
        session_id, _ = parse_response_id(request.previous_response_id, "previous_response_id")
        if not await mesh.session_exists(session_id):
            raise NotFound(
                f"previous response {request.previous_response_id!r} not found",
                reason="PREVIOUS_RESPONSE_NOT_FOUND",
                metadata={"param": "previous_response_id"},
            )
        response = Response(request, session_id)
        response.files = await decode(items[-1].files(_field(request, len(items) - 1)))
        return response, message
    history = []
    if request.instructions:
        history.append(message_pb2.Message(role="system", content=request.instructions))
    for item in items[:-1]:
        role = "system" if item.role == "developer" else item.role
        history.append(message_pb2.Message(role=role, content=item.text()))
    # A new session: files anywhere in the input go with this turn (the
    # history it is seeded with holds text only).
    files = await decode(
        [
            file
            for index, item in enumerate(items)
            if item.role == "user"
            for file in item.files(_field(request, index))
        ]
    )
    session_id = await mesh.create_session(None, request.model, history, param="model")
    response = Response(request, session_id)
    response.files = files
    return response, message


def _field(request: ResponseRequest, index: int) -> str:
    return "input" if isinstance(request.input, str) else f"input[{index}]"


async def _events(mesh: Mesh, response: Response, message: str) -> AsyncIterator[event_pb2.Event]:
    metadata: dict[str, Any] = dict(response.request.metadata or {})
    if response.request.instructions and response.request.previous_response_id:
        metadata["instructions"] = response.request.instructions
    async with mesh.turn(
        response.session_id,
        message,
        metadata=metadata,
        files=response.files,
        on_disconnect=response.on_disconnect,
    ) as stream:
        async for event in stream:
            response.feed(event)
            yield event


async def create(
    mesh: Mesh, request: ResponseRequest, on_disconnect: spb.DisconnectPolicy.ValueType
) -> httpbody_pb2.HttpBody:
    response, message = await open_response(mesh, request)
    response.on_disconnect = on_disconnect
    async for event in _events(mesh, response, message):
        if event.type == event_pb2.RUN_ERROR:
            raise turn_error(event)
    return json_body(response.body())


async def stream(
    mesh: Mesh, request: ResponseRequest, on_disconnect: spb.DisconnectPolicy.ValueType
) -> AsyncIterator[httpbody_pb2.HttpBody]:
    response, message = await open_response(mesh, request)
    response.on_disconnect = on_disconnect
    response.streamed = []
    sequence = 0

    def emit(kind: str, **fields: Any) -> httpbody_pb2.HttpBody:
        nonlocal sequence
        frame = sse_body({"type": kind, "sequence_number": sequence, **fields}, event=kind)
        sequence += 1
        return frame

    where = {"output_index": 0, "content_index": 0}
    async for event in _events(mesh, response, message):
        if event.type == event_pb2.RUN_STARTED:
            yield emit("response.created", response=response.body())
            yield emit("response.in_progress", response=response.body())
            yield emit(
                "response.output_item.added", output_index=0, item=response.item("in_progress")
            )
            yield emit(
                "response.content_part.added",
                item_id=response.item_id,
                part={"type": "output_text", "text": "", "annotations": []},
                **where,
            )
        elif event.type == event_pb2.TEXT_MESSAGE_CONTENT:
            response.streamed.append(event.delta)
            yield emit(
                "response.output_text.delta",
                item_id=response.item_id,
                delta=event.delta,
                logprobs=[],
                **where,
            )
        elif event.type == event_pb2.RUN_FINISHED:
            yield emit(
                "response.output_text.done",
                item_id=response.item_id,
                text=response.text,
                logprobs=[],
                **where,
            )
            yield emit(
                "response.content_part.done",
                item_id=response.item_id,
                part=response.part(),
                **where,
            )
            yield emit("response.output_item.done", output_index=0, item=response.item("completed"))
            yield emit("response.completed", response=response.body())
        elif event.type == event_pb2.RUN_ERROR:
            response.status = "failed"
            response.error = {"code": event.code or "server_error", "message": event.message}
            yield emit("response.failed", response=response.body())


async def get(mesh: Mesh, response_id_value: str) -> httpbody_pb2.HttpBody:
    session_id, turn_id = parse_response_id(response_id_value, "response_id")
    try:
        session = await mesh.get_session(session_id)
        history = await mesh.history(session_id)
    except NotFound as exc:
        raise NotFound(f"response {response_id_value!r} not found") from exc
    messages = [m for m in history if m.turn_id == turn_id]
    if not messages or messages[-1].role != "assistant":
        raise NotFound(f"response {response_id_value!r} not found")
    final = messages[-1]
    # The model a response was made with is the session's agent.
    request = ResponseRequest(model=session.agent_name, input="")
    response = Response(request, session_id)
    response.started(turn_id)
    response.created_at = final.created_at.seconds
    # The stored answer, folded as the live one was.
    response.feed(event_pb2.Event(type=event_pb2.TEXT_MESSAGE_CONTENT, delta=final.content))
    response.feed(event_pb2.Event(type=event_pb2.RUN_FINISHED, usage=[final.usage]))
    return json_body(response.body())
