"""OpenAI Responses (``POST /v1/responses``, ``GET /v1/responses/{id}``).

A response id names its session and turn (``resp_<turn>.<session, base64url>``),
so any server can continue or read it without a shared index.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from google.api import httpbody_pb2
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from turnmesh.runtime.errors import FieldViolation, InvalidArgument, NotFound
from turnmesh.runtime.events import Answer
from turnmesh.server.compat._common import (
    ContentPart,
    Mesh,
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


class ItemReference(BaseModel):
    """An earlier output item named by its id (what the Vercel AI SDK sends
    for the assistant's turns of a stored conversation)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["item_reference"]
    id: str = Field(min_length=1, max_length=512)


InputItem = InputMessage | ItemReference
# The sessions one request's item references may read (each a history read).
MAX_REFERENCED_SESSIONS = 8
# And at most this much of their text (a seeded history may hold 64 MiB; a
# conversation's earlier answers are far less).
MAX_REFERENCED_CHARS = 8_000_000


class ResponseRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1, max_length=128)
    input: str | Annotated[list[dict[str, Any]], Field(max_length=1000)]
    instructions: str | None = None
    stream: bool = False
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    _items: list[InputItem] = PrivateAttr(default_factory=list)

    def items(self) -> list[InputItem]:
        return self._items

    def field(self, index: int) -> str:
        """The caller's name for an input item."""
        return "input" if isinstance(self.input, str) else f"input[{index}]"


def _input_items(value: str | list[dict[str, Any]]) -> list[InputItem]:
    """The input, each item checked under its own name (``input[2].role``),
    not under pydantic's union branches."""
    if isinstance(value, str):
        return [InputMessage(role="user", content=value)]
    items: list[InputItem] = []
    for index, raw in enumerate(value):
        kind = raw.get("type", "message")
        model: type[InputMessage] | type[ItemReference]
        if kind == "message":
            model = InputMessage
        elif kind == "item_reference":
            model = ItemReference
        else:
            raise invalid(
                f"input[{index}].type",
                f"{str(kind)[:64]!r} items are not supported: message and item_reference are",
            )
        try:
            items.append(model.model_validate(raw))
        except ValidationError as exc:
            raise from_pydantic(exc, raw, prefix=f"input[{index}]") from exc
    return items


def _encoded(session_id: str, turn_id: str) -> str:
    encoded = base64.urlsafe_b64encode(session_id.encode()).decode().rstrip("=")
    return f"{turn_id}.{encoded}"


def _decoded(value: str) -> tuple[str, str]:
    """(session, turn) of ``<turn>.<session, base64url>``; ValueError if not."""
    turn_id, encoded = value.split(".", 1)
    try:
        session_id = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise ValueError(value) from exc
    if not turn_id or not session_id:
        raise ValueError(value)
    return session_id, turn_id


def response_id(session_id: str, turn_id: str) -> str:
    return f"resp_{_encoded(session_id, turn_id)}"


def item_id(session_id: str, turn_id: str) -> str:
    """An output message's id names its session too, so an item reference
    to it resolves on any server, in a request with no previous response."""
    return f"msg_{_encoded(session_id, turn_id)}"


def parse_response_id(value: str, field: str) -> tuple[str, str]:
    if not value.startswith("resp_"):
        raise invalid(field, "not a response id from this service")
    try:
        return _decoded(value.removeprefix("resp_"))
    except ValueError:
        raise invalid(field, "not a response id from this service") from None


async def parse(body: httpbody_pb2.HttpBody) -> ResponseRequest:
    data = await parse_json_body(body)
    try:
        request = ResponseRequest.model_validate(data)
    except ValidationError as exc:
        raise from_pydantic(exc, data) from exc
    request._items = _input_items(request.input)
    items = request.items()
    last = items[-1] if items else None
    if not isinstance(last, InputMessage) or last.role != "user":
        raise invalid("input", "must end with a user message")
    where = request.field(len(items) - 1)
    check_message(last.text(), where if where == "input" else f"{where}.content")
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
        self.item_id = item_id(self.session_id, turn_id)

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
    last = items[-1]
    assert isinstance(last, InputMessage)  # parse() checked
    if request.previous_response_id:
        session_id = await _continued(mesh, request.previous_response_id)
        response = Response(request, session_id)
        response.files = await decode(last.files(request.field(len(items) - 1)))
        return response, last.text()
    messages = await _resolved(mesh, request)
    history = []
    if request.instructions:
        history.append(message_pb2.Message(role="system", content=request.instructions))
    for item in messages[:-1]:
        role = "system" if item.role == "developer" else item.role
        history.append(message_pb2.Message(role=role, content=item.text()))
    # A new session: files anywhere in the input go with this turn (the
    # history it is seeded with holds text only).
    files = await decode(
        [
            file
            for index, item in enumerate(messages)
            if item.role == "user"
            for file in item.files(request.field(index))
        ]
    )
    try:
        session_id = await mesh.create_session(None, request.model, history, param="model")
    except InvalidArgument as exc:
        raise _as_input(exc, offset=1 if request.instructions else 0) from None
    response = Response(request, session_id)
    response.files = files
    return response, last.text()


async def _continued(mesh: Mesh, previous: str) -> str:
    """The session a turn after ``previous`` runs in: the response's own,
    or, if later turns followed it there, a fork at it (a branch: the
    conversation goes on from that response, and the later ones stay as
    they were)."""
    session_id, turn_id = parse_response_id(previous, "previous_response_id")
    try:
        session = await mesh.get_session(session_id)
        history = await mesh.history(session_id)
    except (NotFound, InvalidArgument):
        raise NotFound(
            f"previous response {previous!r} not found",
            reason="PREVIOUS_RESPONSE_NOT_FOUND",
            metadata={"param": "previous_response_id"},
        ) from None
    last = max((i for i, m in enumerate(history) if m.turn_id == turn_id), default=None)
    if last is None:
        # A response that saved nothing (still running: this turn queues
        # behind it; cancelled, failed): the conversation goes on as it is.
        return session_id
    if last == len(history) - 1 and not session.turn_running:
        return session_id  # the newest response: continue it in place
    # Later turns followed it, or one is running now (another continuation
    # of the same response, racing this one): a branch.
    try:
        return await mesh.fork_session(session_id, turn_id)
    except InvalidArgument as exc:
        raise invalid(
            "previous_response_id",
            f"the conversation up to that response cannot start a branch: {exc.detail}",
        ) from None


def _as_input(exc: InvalidArgument, offset: int) -> InvalidArgument:
    """A seeded history's violations (``messages[k]...``) under the input
    item they came from (``input[k - offset]...``)."""
    renamed = []
    for violation in exc.violations:
        field = violation.field
        if field.startswith("messages["):
            index, _, rest = field.removeprefix("messages[").partition("]")
            if index.isdigit() and int(index) >= offset:
                field = f"input[{int(index) - offset}]{rest}"
            else:
                field = "instructions"
        elif field == "messages":
            field = "input"
        renamed.append(FieldViolation(field, violation.description))
    return InvalidArgument(renamed)


def _answers(history: list[message_pb2.Message]) -> dict[str, str]:
    """Each turn's output text: its assistant messages' content in order
    (the text before and after its tool calls), as its output item showed."""
    parts: dict[str, list[str]] = {}
    for message in history:
        if message.role == "assistant" and message.turn_id:
            parts.setdefault(message.turn_id, []).append(message.content)
    return {turn: "".join(texts) for turn, texts in parts.items()}


async def _resolved(mesh: Mesh, request: ResponseRequest) -> list[InputMessage]:
    """The input with each item reference replaced by the assistant message
    it names (read from its session's history: the caller's own only)."""
    # Per conversation read: each turn's assistant text, in order.
    answers: dict[str, dict[str, str]] = {}
    resolved_chars = 0
    messages = []
    for index, item in enumerate(request.items()):
        if isinstance(item, InputMessage):
            messages.append(item)
            continue
        where = f"{request.field(index)}.id"
        not_found = NotFound(
            f"item {item.id[:128]!r} not found", reason="ITEM_NOT_FOUND", metadata={"param": where}
        )
        if not item.id.startswith("msg_"):
            raise not_found
        try:
            session_id, turn_id = _decoded(item.id.removeprefix("msg_"))
        except ValueError:
            raise not_found from None
        if session_id not in answers:
            if len(answers) == MAX_REFERENCED_SESSIONS:
                raise invalid(
                    where, f"items of at most {MAX_REFERENCED_SESSIONS} conversations per request"
                )
            try:
                answers[session_id] = _answers(await mesh.history(session_id))
            except (NotFound, InvalidArgument):
                raise not_found from None
        said = answers[session_id].get(turn_id)
        if said is None:
            raise not_found
        # Bounded: a small body must not reference its way to a huge history.
        resolved_chars += len(said)
        if resolved_chars > MAX_REFERENCED_CHARS:
            raise invalid(
                where, f"the items referenced hold more than {MAX_REFERENCED_CHARS:,} characters"
            )
        messages.append(InputMessage(role="assistant", content=said))
    return messages


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
        # One response per request: never coalesced with another's turn.
        policy=spb.TURN_POLICY_ENQUEUE,
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
