"""OpenAI Responses (``POST /v1/responses``, ``GET /v1/responses/{id}``).

A response id names its session and turn (``resp_<turn>.<session, base64url>``),
so any server can continue or read it without a shared index.

Function tools: the request's ``function`` tools are the caller's tools for
the turn. A turn that ends waiting for their results lists each call as a
``function_call`` output item (after the message item, if the agent said
anything); the next request's trailing ``function_call_output`` items are the
results. With ``previous_response_id`` they answer that response's calls;
without it (a caller that resends the whole input) the input before them,
ending in the ``function_call`` items, seeds a session that waits for those
calls.

Approvals are OpenAI's own shape for a tool call that waits for a person: an
``mcp_approval_request`` output item (``server_label``: the agent), answered
by an ``mcp_approval_response`` input item with ``previous_response_id``.
Other interrupts (questions) have no shape in this API: such a response is
``incomplete`` (``incomplete_details.reason: "interrupt"``), and every
interrupt is listed in ``interrupts`` (an extension: the native
``Interrupt``'s fields); a request's ``resume`` (an extension,
``[{"interrupt_id", "status", "payload"}]``) with ``previous_response_id``
answers them. Any other request on a response that waits is 409
``awaiting_client``, naming what it waits for.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Annotated, Any, Literal

from google.api import httpbody_pb2
from google.protobuf import json_format
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from turnmesh.runtime.errors import (
    AwaitingClient,
    FieldViolation,
    InvalidArgument,
    NotFound,
    NotWaiting,
    TurnmeshError,
)
from turnmesh.runtime.events import Answer
from turnmesh.server.compat._common import (
    ContentPart,
    Mesh,
    TurnArgs,
    check_message,
    from_pydantic,
    invalid,
    json_body,
    parse_json_body,
    resume_entry,
    sse_body,
    tool_definition,
    turn_error,
)
from turnmesh.server.compat._files import Inline, decode, from_data_url, from_inline, unsupported
from turnmesh.server.sessions import pauses, validation
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb

# Ids a caller sends back (call ids, approval request ids): bounded.
MAX_ID_CHARS = 256
APPROVAL = "tool_approval"


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


class FunctionCall(BaseModel):
    """A function call the model made, sent back (a caller that resends the
    whole input: openai-agents does by default)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    name: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    arguments: str


class FunctionCallOutput(BaseModel):
    """A function call's result. (``call_id`` is optional in the SDK's
    types; here it is required.)"""

    model_config = ConfigDict(extra="allow")
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    output: str | list[ContentPart]

    def text(self, field: str) -> str:
        """The output's text; an image or a file is no tool result the mesh
        can carry (a result is text)."""
        if isinstance(self.output, str):
            return self.output
        for index, part in enumerate(self.output):
            if part.type not in ("input_text", "output_text", "text"):
                raise invalid(f"{field}.output[{index}].type", "must be input_text")
        return "".join(p.text or "" for p in self.output)


class ApprovalRequest(BaseModel):
    """An approval request sent back with the rest of an earlier output."""

    model_config = ConfigDict(extra="allow")
    type: Literal["mcp_approval_request"]


class ApprovalResponse(BaseModel):
    """A person's answer to an ``mcp_approval_request`` (an approval interrupt)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["mcp_approval_response"]
    approval_request_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    approve: bool
    reason: str | None = Field(default=None, max_length=10_000)


InputItem = (
    InputMessage
    | ItemReference
    | FunctionCall
    | FunctionCallOutput
    | ApprovalRequest
    | ApprovalResponse
)
AnswerItem = FunctionCallOutput | ApprovalResponse
_ITEMS: dict[str, type[InputItem]] = {
    "message": InputMessage,
    "item_reference": ItemReference,
    "function_call": FunctionCall,
    "function_call_output": FunctionCallOutput,
    "mcp_approval_request": ApprovalRequest,
    "mcp_approval_response": ApprovalResponse,
}
# The sessions one request's item references may read (each a history read).
MAX_REFERENCED_SESSIONS = 8
# And at most this much of their text (a seeded history may hold 64 MiB; a
# conversation's earlier answers are far less).
MAX_REFERENCED_CHARS = 8_000_000


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    # Accepted and left to the agent, as sampling options are.
    strict: bool | None = None

    def shown(self) -> dict[str, Any]:
        """As the response object lists it."""
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "strict": self.strict,
        }


class ResumeParam(BaseModel):
    """An answer to an interrupt (an extension: TurnRequest's ResumeEntry)."""

    model_config = ConfigDict(extra="allow")
    interrupt_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    status: Literal["resolved", "cancelled"]
    # Any JSON value; absent or null: no payload.
    payload: Any = None


class ResponseRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1, max_length=128)
    input: str | Annotated[list[dict[str, Any]], Field(max_length=1000)] = Field(
        default_factory=list
    )
    instructions: str | None = None
    stream: bool = False
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    tools: Annotated[list[dict[str, Any]], Field(max_length=pauses.MAX_TOOLS)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    # Accepted: the agent decides how many calls it makes at once.
    parallel_tool_calls: bool | None = None
    resume: Annotated[list[ResumeParam], Field(max_length=pauses.MAX_ANSWERS)] | None = None
    # Run with nobody waiting: answered at once ("queued"), polled with
    # GET /v1/responses/{id}, cancelled with POST .../cancel.
    background: bool = False
    _items: list[InputItem] = PrivateAttr(default_factory=list)
    _tools: list[FunctionTool] = PrivateAttr(default_factory=list)
    _turn_tools: list[FunctionTool] = PrivateAttr(default_factory=list)
    # Where the answers at the input's end start, and its last user message.
    _answers_at: int = PrivateAttr(default=0)
    _message_at: int | None = PrivateAttr(default=None)

    def items(self) -> list[InputItem]:
        return self._items

    def field(self, index: int) -> str:
        """The caller's name for an input item."""
        return "input" if isinstance(self.input, str) else f"input[{index}]"

    @property
    def answers_at(self) -> int:
        """Where the input's answers start: what a new session is seeded
        with ends there."""
        return self._answers_at

    def answer_items(self) -> list[tuple[int, AnswerItem]]:
        """The input's trailing answers, each with its index."""
        end = len(self._items) if self._message_at is None else self._message_at
        return [
            (index, item)
            for index, item in enumerate(self._items[:end])
            if index >= self._answers_at and isinstance(item, AnswerItem)
        ]

    def message(self) -> InputMessage | None:
        """The new user message (a turn that only answers has none)."""
        if self._message_at is None:
            return None
        item = self._items[self._message_at]
        assert isinstance(item, InputMessage)
        return item

    def shown_tools(self) -> list[dict[str, Any]]:
        return [tool.shown() for tool in self._tools]

    def turn_tools(self) -> list[message_pb2.ToolDefinition]:
        """The caller's tools for the turn, as ``tool_choice`` leaves them."""
        return [tool_definition(t.name, t.description, t.parameters) for t in self._turn_tools]


def _input_items(value: str | list[dict[str, Any]]) -> list[InputItem]:
    """The input, each item checked under its own name (``input[2].role``),
    not under pydantic's union branches."""
    if isinstance(value, str):
        return [InputMessage(role="user", content=value)]
    items: list[InputItem] = []
    for index, raw in enumerate(value):
        kind = raw.get("type", "message")
        model = _ITEMS.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise invalid(
                f"input[{index}].type",
                f"{str(kind)[:64]!r} items are not supported: " + ", ".join(_ITEMS) + " are",
            )
        try:
            items.append(model.model_validate(raw))
        except ValidationError as exc:
            raise from_pydantic(exc, raw, prefix=f"input[{index}]") from exc
    return items


def _function_tools(request: ResponseRequest) -> list[FunctionTool]:
    """The request's tools: function tools only (the others are OpenAI's own,
    hosted ones), named as the native API names a caller's tools."""
    tools = []
    for index, raw in enumerate(request.tools or ()):
        kind = raw.get("type")
        if kind != "function":
            raise invalid(
                f"tools[{index}].type",
                f"{str(kind)[:64]!r} tools are not supported: function tools are",
            )
        try:
            tools.append(FunctionTool.model_validate(raw))
        except ValidationError as exc:
            raise from_pydantic(exc, raw, prefix=f"tools[{index}]") from exc
    definitions = [
        tool_definition(t.name, t.description, t.parameters, f"tools[{index}].parameters")
        for index, t in enumerate(tools)
    ]
    violations = validation.tool_violations(definitions, "tools")
    if violations:
        raise InvalidArgument(violations)
    return tools


def _chosen(request: ResponseRequest, tools: list[FunctionTool]) -> list[FunctionTool]:
    """The tools ``tool_choice`` leaves the agent: all of them ("auto",
    "required"), none ("none"), the one named, or the allowed ones. Which
    one it calls, if any, is the agent's choice: nothing here forces a call."""
    choice = request.tool_choice
    if choice is None or choice in ("auto", "required"):
        if choice == "required" and not tools:
            raise invalid("tool_choice", "required needs function tools")
        return tools
    if choice == "none":
        return []
    names = {tool.name: tool for tool in tools}
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = choice.get("name")
        if not isinstance(name, str) or name not in names:
            raise invalid("tool_choice.name", "must name a function tool of the request")
        return [names[name]]
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        allowed = choice.get("tools")
        if not isinstance(allowed, list):
            raise invalid("tool_choice.tools", "required")
        chosen = []
        for index, entry in enumerate(allowed):
            is_function = isinstance(entry, dict) and entry.get("type") == "function"
            name = entry.get("name") if is_function else None
            if not isinstance(name, str) or name not in names:
                raise invalid(
                    f"tool_choice.tools[{index}]", "must name a function tool of the request"
                )
            chosen.append(names[name])
        return chosen
    raise invalid(
        "tool_choice",
        'must be "auto", "none", "required", {"type": "function", "name": ...}'
        ' or {"type": "allowed_tools", ...}',
    )


def _split(request: ResponseRequest) -> None:
    """Where the input's answers start (function_call_output and
    mcp_approval_response items at its end) and its user message (the last
    item, or none when the request only answers)."""
    items = request.items()
    end = len(items)
    last = items[-1] if items else None
    if isinstance(last, InputMessage) and last.role == "user":
        request._message_at = end - 1
        end -= 1
    start = end
    while start > 0 and isinstance(items[start - 1], AnswerItem):
        start -= 1
    request._answers_at = start
    if not items and not request.resume:
        raise invalid("input", "required")
    if items and request._message_at is None and start == end:
        raise invalid(
            "input",
            "must end with a user message, or with function_call_output or"
            " mcp_approval_response items",
        )


async def parse(body: httpbody_pb2.HttpBody) -> ResponseRequest:
    data = await parse_json_body(body)
    try:
        request = ResponseRequest.model_validate(data)
    except ValidationError as exc:
        raise from_pydantic(exc, data) from exc
    request._items = _input_items(request.input)
    _split(request)
    message = request.message()
    if message is not None:
        where = request.field(len(request.items()) - 1)
        check_message(message.text(), where if where == "input" else f"{where}.content")
    request._tools = _function_tools(request)
    request._turn_tools = _chosen(request, request._tools)
    if request.resume and not request.previous_response_id:
        raise invalid("resume", "answers a stored response's interrupts: send previous_response_id")
    if request.background and request.stream:
        raise invalid(
            "stream",
            "a background response is not streamed here: poll GET /v1/responses/{id} instead",
        )
    return request


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


def call_item_id(session_id: str, turn_id: str, index: int) -> str:
    """A function_call item's id: its turn's and its place among the calls
    (the caller's handle on the call is its ``call_id``)."""
    return f"fc_{index}_{_encoded(session_id, turn_id)}"


def parse_response_id(value: str, field: str) -> tuple[str, str]:
    if not value.startswith("resp_"):
        raise invalid(field, "not a response id from this service")
    try:
        return _decoded(value.removeprefix("resp_"))
    except ValueError:
        raise invalid(field, "not a response id from this service") from None


class Response:
    """The response object, as it grows."""

    def __init__(self, request: ResponseRequest, session_id: str) -> None:
        self.request = request
        self.session_id = session_id
        self.id = ""
        self.turn_id = ""
        self.item_id = ""
        self.created_at = int(time.time())
        self.answer = Answer()
        # Streamed: every delta sent (a content part's text is its deltas).
        self.streamed: list[str] | None = None
        self.status = "in_progress"
        self.error: dict[str, str] | None = None
        self.files: list[message_pb2.File] = []
        self.on_disconnect: spb.DisconnectPolicy.ValueType = spb.DISCONNECT_POLICY_CANCEL
        # The turn's request beyond its files.
        self.message = ""
        self.answers: _Answers | None = None
        # This request made the session (seeded or forked): a refused turn
        # deletes it again. How many messages it was seeded with, if known.
        self.made = False
        self.seeded: int | None = None
        # The turn's tool calls (id: [name, arguments]) and what it waits for.
        self.calls: dict[str, list[str]] = {}
        self.pending: list[str] = []
        self.interrupts: list[event_pb2.Interrupt] = []

    def started(self, turn_id: str) -> None:
        self.turn_id = turn_id
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

    def has_message(self) -> bool:
        """Whether the output has a message item: the agent said something,
        or there is nothing else to show."""
        said = bool(self.streamed) if self.streamed is not None else bool(self.text)
        return said or not (self.pending or self.approvals())

    def function_call(self, index: int, status: str = "completed") -> dict[str, Any]:
        call_id = self.pending[index]
        name, arguments = self.calls.get(call_id, ["", ""])
        return {
            "id": call_item_id(self.session_id, self.turn_id, index),
            "type": "function_call",
            "status": status,
            "call_id": call_id,
            "name": name,
            "arguments": arguments if status == "completed" else "",
        }

    def approvals(self) -> list[dict[str, Any]]:
        """Approval interrupts as OpenAI's approval requests: the gated call's
        name and arguments, the agent as the server that asks."""
        items = []
        for interrupt in self.interrupts:
            if _is_approval(interrupt):
                name, arguments = self.calls.get(interrupt.tool_call_id, ["", ""])
                items.append(
                    {
                        "id": interrupt.id,
                        "type": "mcp_approval_request",
                        "name": name,
                        "arguments": arguments,
                        "server_label": self.request.model,
                    }
                )
        return items

    def output(self) -> list[dict[str, Any]]:
        if self.status not in ("completed", "incomplete"):
            return []
        items = [self.item("completed")] if self.has_message() else []
        items += [self.function_call(index) for index in range(len(self.pending))]
        return items + self.approvals()

    def body(self) -> dict[str, Any]:
        body = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "model": self.request.model,
            "output": self.output(),
            "usage": {
                **self.usage,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
            "instructions": self.request.instructions,
            "metadata": self.request.metadata or {},
            "previous_response_id": self.request.previous_response_id,
            "error": self.error,
            "incomplete_details": (
                {"reason": "interrupt"} if self.status == "incomplete" else None
            ),
            "parallel_tool_calls": self.request.parallel_tool_calls is not False,
            "tool_choice": self.request.tool_choice or "auto",
            "tools": self.request.shown_tools(),
            "temperature": None,
            "top_p": None,
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "store": True,
            "background": self.request.background,
        }
        if self.interrupts:
            body["interrupts"] = [
                json_format.MessageToDict(i, preserving_proto_field_name=True)
                for i in self.interrupts
            ]
        return body

    def feed(self, event: event_pb2.Event) -> None:
        self.answer.feed(event)
        if event.type == event_pb2.RUN_STARTED:
            self.started(event.run_id)
        elif event.type == event_pb2.TOOL_CALL_START:
            self.calls[event.tool_call_id] = [event.tool_call_name, ""]
        elif event.type == event_pb2.TOOL_CALL_ARGS:
            if event.tool_call_id in self.calls:
                self.calls[event.tool_call_id][1] += event.delta
        elif event.type == event_pb2.RUN_FINISHED:
            self.pending = list(event.outcome.pending_tool_call_ids)
            self.interrupts = list(event.outcome.interrupts)
            # A question has no shape in this API: the response must not
            # look done.
            asks = any(not _is_approval(i) for i in self.interrupts)
            self.status = "incomplete" if asks else "completed"


def _is_approval(interrupt: event_pb2.Interrupt) -> bool:
    return interrupt.reason == APPROVAL and bool(interrupt.tool_call_id)


async def open_response(mesh: Mesh, request: ResponseRequest) -> Response:
    """The session this request continues or starts, and the turn it sends
    there: its user message, tools and answers."""
    message = request.message()
    answers = _Answers(request)
    if request.previous_response_id:
        # Decoded first: a request refused for its files makes no fork.
        files = []
        if message is not None:
            where = request.field(len(request.items()) - 1)
            files = await decode(message.files(where))
        session_id, forked = await _continued(mesh, request.previous_response_id)
        response = Response(request, session_id)
        response.made = forked
        response.files = files
    else:
        resolved = await _resolved(mesh, request)
        history, origins = _history(request, resolved[: request.answers_at])
        _check_answers(request, history)
        # A new session: files anywhere in the input go with this turn (the
        # history it is seeded with holds text only).
        files = await decode(
            [
                file
                for index, item in enumerate(resolved)
                if isinstance(item, InputMessage) and item.role == "user"
                for file in item.files(request.field(index))
            ]
        )
        try:
            session_id = await mesh.create_session(None, request.model, history, param="model")
        except InvalidArgument as exc:
            raise _as_input(exc, origins) from None
        response = Response(request, session_id)
        response.made = True
        response.seeded = len(history)
        response.files = files
    response.message = message.text() if message is not None else ""
    response.answers = answers
    return response


class _Answers:
    """A request's answers as the turn takes them, with the caller's name
    for each (``input[3]``, ``resume[0]``) to name it in errors."""

    def __init__(self, request: ResponseRequest) -> None:
        self.tool_results: list[message_pb2.ToolResult] = []
        self.resume: list[message_pb2.ResumeEntry] = []
        self.result_fields: list[str] = []
        self.resume_fields: list[str] = []
        for index, item in request.answer_items():
            where = request.field(index)
            if isinstance(item, FunctionCallOutput):
                self.tool_results.append(
                    message_pb2.ToolResult(tool_call_id=item.call_id, content=item.text(where))
                )
                self.result_fields.append(where)
            else:
                payload: dict[str, Any] = {"approved": item.approve}
                if item.reason:
                    payload["reason"] = item.reason
                self.resume.append(
                    resume_entry(where, item.approval_request_id, "resolved", payload)
                )
                self.resume_fields.append(where)
        for index, entry in enumerate(request.resume or ()):
            self.resume.append(
                resume_entry(
                    f"resume[{index}].payload", entry.interrupt_id, entry.status, entry.payload
                )
            )
            self.resume_fields.append(f"resume[{index}]")


Origin = tuple[str, str]  # (the input item's name, what a message's content is called there)


def _history(
    request: ResponseRequest, items: Sequence[InputItem]
) -> tuple[list[message_pb2.Message], list[Origin]]:
    """The history a new session is seeded with, and where each message came
    from. Function calls become the assistant's ``tool_calls`` (the calls
    after an assistant message, or after each other, are one message's, as
    one response's output), their outputs ``tool`` messages; approval items
    add nothing (what the tool said after them is in the messages)."""
    history: list[message_pb2.Message] = []
    origins: list[Origin] = []
    if request.instructions:
        history.append(message_pb2.Message(role="system", content=request.instructions))
        origins.append(("instructions", ""))
    joins = False  # whether a function call joins the message before it
    for index, item in enumerate(items):
        where = request.field(index)
        if isinstance(item, InputMessage):
            role = "system" if item.role == "developer" else item.role
            history.append(message_pb2.Message(role=role, content=item.text()))
            origins.append((where, ".content"))
            joins = item.role == "assistant"
        elif isinstance(item, FunctionCall):
            if not joins:
                history.append(message_pb2.Message(role="assistant"))
                origins.append((where, ".content"))
            call = history[-1].tool_calls.add(id=item.call_id, type="function")
            call.function.name = item.name
            call.function.arguments = item.arguments
            joins = True
        elif isinstance(item, FunctionCallOutput):
            content = item.text(where)
            history.append(
                message_pb2.Message(role="tool", tool_call_id=item.call_id, content=content)
            )
            origins.append((where, ".output"))
            joins = False
        else:
            joins = False
    return history, origins


def _check_answers(request: ResponseRequest, history: list[message_pb2.Message]) -> None:
    """A request with no previous response answers the function calls its
    own input ends with, exactly (checked before any session is made)."""
    last = history[-1] if history else None
    waiting = (
        [c.id for c in last.tool_calls] if last is not None and last.role == "assistant" else []
    )
    seen: set[str] = set()
    for index, item in request.answer_items():
        where = request.field(index)
        if isinstance(item, ApprovalResponse):
            raise invalid(
                where,
                "an mcp_approval_response answers a stored response's approval request:"
                " send it with previous_response_id",
            )
        if item.call_id not in waiting:
            expected = ", ".join(waiting) or "none"
            raise invalid(
                f"{where}.call_id",
                "answers no function_call the input before it ends with"
                f" (calls waiting: {expected})",
            )
        if item.call_id in seen:
            raise invalid(f"{where}.call_id", f"answers call {item.call_id!r} twice")
        seen.add(item.call_id)
    missing = [call_id for call_id in waiting if call_id not in seen]
    if missing:
        raise invalid(
            "input",
            f"no function_call_output for call {', '.join(missing)}: send one after the"
            " function_call items, for each call",
        )


async def _continued(mesh: Mesh, previous: str) -> tuple[str, bool]:
    """The session a turn after ``previous`` runs in: the response's own,
    or, if later turns followed it there, a fork at it (a branch: the
    conversation goes on from that response, and the later ones stay as
    they were); and whether it is a new fork."""
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
        return session_id, False
    if last == len(history) - 1 and not session.turn_running:
        return session_id, False  # the newest response: continue it in place
    # Later turns followed it, or one is running now (another continuation
    # of the same response, racing this one): a branch.
    try:
        return await mesh.fork_session(session_id, turn_id), True
    except InvalidArgument as exc:
        raise invalid(
            "previous_response_id",
            f"the conversation up to that response cannot start a branch: {exc.detail}",
        ) from None


def _as_input(exc: InvalidArgument, origins: list[Origin]) -> InvalidArgument:
    """A seeded history's violations (``messages[k]...``) under the input
    item they came from (``input[j]...``; a tool message's content is its
    item's ``output``)."""
    renamed = []
    for violation in exc.violations:
        field = violation.field
        if field.startswith("messages["):
            index, _, rest = field.removeprefix("messages[").partition("]")
            if index.isdigit() and int(index) < len(origins):
                where, content = origins[int(index)]
                if rest.startswith(".content") and content:
                    rest = content + rest.removeprefix(".content")
                field = where if where == "instructions" else where + rest
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


async def _resolved(mesh: Mesh, request: ResponseRequest) -> list[InputItem]:
    """The input with each item reference replaced by the assistant message
    it names (read from its session's history: the caller's own only)."""
    # Per conversation read: each turn's assistant text, in order.
    answers: dict[str, dict[str, str]] = {}
    resolved_chars = 0
    items: list[InputItem] = []
    for index, item in enumerate(request.items()):
        if not isinstance(item, ItemReference):
            items.append(item)
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
        items.append(InputMessage(role="assistant", content=said))
    return items


async def _events(mesh: Mesh, response: Response) -> AsyncIterator[event_pb2.Event]:
    started = False
    try:
        async with mesh.turn(response.session_id, response.message, **_turn_args(response)) as (
            stream
        ):
            async for event in stream:
                started = True
                response.feed(event)
                yield event
    except TurnmeshError as exc:
        if started:
            raise
        raise await _refused(mesh, response, exc) from None


async def _start_background(mesh: Mesh, response: Response) -> Response:
    """The response's turn started in the background (StartTurn): the
    response as it was accepted, queued or in progress."""
    try:
        turn = await mesh.start_turn(response.session_id, response.message, **_turn_args(response))
    except TurnmeshError as exc:
        raise await _refused(mesh, response, exc) from None
    response.started(turn.turn_id)
    response.status = _STATUSES.get(turn.state, "in_progress")
    return response


def _turn_args(response: Response) -> TurnArgs:
    metadata: dict[str, Any] = dict(response.request.metadata or {})
    if response.request.instructions and response.request.previous_response_id:
        metadata["instructions"] = response.request.instructions
    answers = response.answers
    return {
        "metadata": metadata,
        "files": response.files,
        "on_disconnect": response.on_disconnect,
        # One response per request: never coalesced with another's turn.
        "policy": spb.TURN_POLICY_ENQUEUE,
        "tools": response.request.turn_tools(),
        "tool_results": answers.tool_results if answers else (),
        "resume": answers.resume if answers else (),
    }


async def _refused(mesh: Mesh, response: Response, exc: TurnmeshError) -> TurnmeshError:
    """A turn refused before it started, in this API's words and names; a
    session the request made for it goes again."""
    if isinstance(exc, AwaitingClient):
        exc = await _awaiting(mesh, response, exc)
    elif isinstance(exc, NotWaiting):
        exc = _not_waiting(response, exc)
    elif isinstance(exc, InvalidArgument):
        exc = _answers_as_input(exc, response)
    if response.made:
        await mesh.drop_session(response.session_id, exc, response.seeded)
    return exc


async def _awaiting(mesh: Mesh, response: Response, exc: AwaitingClient) -> AwaitingClient:
    """What the conversation waits for, as this API sends it."""
    try:
        pause = (await mesh.get_session(response.session_id)).pause
    except (NotFound, InvalidArgument):
        return AwaitingClient(exc.detail, metadata={**exc.metadata, "param": "input"})
    # A fork at an earlier response waits since its seeded history.
    since = (
        response_id(response.session_id, pause.turn_id)
        if pause.turn_id
        else response.request.previous_response_id
    )
    wanted = []
    if pause.tool_calls:
        ids = ", ".join(c.id for c in pause.tool_calls)
        wanted.append(f"a function_call_output item for each call ({ids})")
    approvals = [i.id for i in pause.interrupts if _is_approval(i)]
    if approvals:
        wanted.append(
            f"an mcp_approval_response item for each approval request ({', '.join(approvals)})"
        )
    others = [i.id for i in pause.interrupts if not _is_approval(i)]
    if others:
        wanted.append(
            'a "resume" entry ({"interrupt_id", "status", "payload"}) for each interrupt'
            f" ({', '.join(others)})"
        )
    if not wanted or not since:
        return AwaitingClient(exc.detail, metadata={**exc.metadata, "param": "input"})
    detail = (
        f"response {since!r} waits for the client: send "
        + " and ".join(wanted)
        + f", with previous_response_id {since!r}"
    )
    return AwaitingClient(detail, metadata={**exc.metadata, "param": "input"})


def _not_waiting(response: Response, exc: NotWaiting) -> NotWaiting:
    why = exc.metadata.get("why")
    if why:
        what = "its wait was cancelled" if why == "cancelled" else "its wait expired"
        detail = f"the previous response waits for no answers any more ({what}): send a message"
    else:
        detail = (
            "the previous response waits for no function_call_output, mcp_approval_response"
            " or resume answers (it made no such call or request, or it was answered already)"
        )
    return NotWaiting(detail, metadata={**exc.metadata, "param": "input"})


def _answers_as_input(exc: InvalidArgument, response: Response) -> InvalidArgument:
    """The turn's violations of its answers (``tool_results[n]...``,
    ``resume[n]...``) under the input item or resume entry each came from."""
    answers = response.answers
    if answers is None:
        return exc
    renamed = []
    for violation in exc.violations:
        field = violation.field
        for name, fields, key, ours in (
            ("tool_results", answers.result_fields, ".tool_call_id", ".call_id"),
            ("resume", answers.resume_fields, ".interrupt_id", ".approval_request_id"),
        ):
            if field == name:
                field = "input"
            elif field.startswith(f"{name}["):
                index, _, rest = field.removeprefix(f"{name}[").partition("]")
                if index.isdigit() and int(index) < len(fields):
                    where = fields[int(index)]
                    if rest == key:
                        rest = ours if where.startswith("input") else rest
                    elif rest == ".content":
                        rest = ".output"
                    field = where + rest
        renamed.append(FieldViolation(field, violation.description))
    return InvalidArgument(renamed)


async def create(
    mesh: Mesh, request: ResponseRequest, on_disconnect: spb.DisconnectPolicy.ValueType
) -> httpbody_pb2.HttpBody:
    response = await open_response(mesh, request)
    response.on_disconnect = on_disconnect
    if request.background:
        return json_body((await _start_background(mesh, response)).body())
    async for event in _events(mesh, response):
        if event.type == event_pb2.RUN_ERROR:
            error = turn_error(event)
            if isinstance(error, AwaitingClient):  # queued behind a turn that then paused
                error = await _awaiting(mesh, response, error)
            raise error
    return json_body(response.body())


async def stream(
    mesh: Mesh, request: ResponseRequest, on_disconnect: spb.DisconnectPolicy.ValueType
) -> AsyncIterator[httpbody_pb2.HttpBody]:
    response = await open_response(mesh, request)
    response.on_disconnect = on_disconnect
    response.streamed = []
    sequence = 0

    def emit(kind: str, **fields: Any) -> httpbody_pb2.HttpBody:
        nonlocal sequence
        frame = sse_body({"type": kind, "sequence_number": sequence, **fields}, event=kind)
        sequence += 1
        return frame

    where = {"output_index": 0, "content_index": 0}
    opened = False

    def open_message() -> list[httpbody_pb2.HttpBody]:
        nonlocal opened
        opened = True
        return [
            emit("response.output_item.added", output_index=0, item=response.item("in_progress")),
            emit(
                "response.content_part.added",
                item_id=response.item_id,
                part={"type": "output_text", "text": "", "annotations": []},
                **where,
            ),
        ]

    async for event in _events(mesh, response):
        if event.type == event_pb2.RUN_STARTED:
            yield emit("response.created", response=response.body())
            yield emit("response.in_progress", response=response.body())
        elif event.type == event_pb2.TEXT_MESSAGE_CONTENT:
            # The message item opens with its first text: a turn that only
            # calls the caller's tools has none.
            if not opened:
                for frame in open_message():
                    yield frame
            response.streamed.append(event.delta)
            yield emit(
                "response.output_text.delta",
                item_id=response.item_id,
                delta=event.delta,
                logprobs=[],
                **where,
            )
        elif event.type == event_pb2.RUN_FINISHED:
            for frame in _finished(response, emit, opened, open_message):
                yield frame
        elif event.type == event_pb2.RUN_ERROR:
            response.status = "failed"
            response.error = {"code": event.code or "server_error", "message": event.message}
            yield emit("response.failed", response=response.body())


Emit = Callable[..., httpbody_pb2.HttpBody]


def _finished(
    response: Response,
    emit: Emit,
    opened: bool,
    open_message: Callable[[], list[httpbody_pb2.HttpBody]],
) -> list[httpbody_pb2.HttpBody]:
    """The frames that close a streamed response: its message item, then an
    item per function call (its arguments in one delta) and per approval
    request, then the response."""
    frames: list[httpbody_pb2.HttpBody] = []
    where = {"output_index": 0, "content_index": 0}
    index = 0
    if response.has_message():
        if not opened:
            frames += open_message()
        frames.append(
            emit(
                "response.output_text.done",
                item_id=response.item_id,
                text=response.text,
                logprobs=[],
                **where,
            )
        )
        frames.append(
            emit(
                "response.content_part.done",
                item_id=response.item_id,
                part=response.part(),
                **where,
            )
        )
        frames.append(
            emit("response.output_item.done", output_index=0, item=response.item("completed"))
        )
        index = 1
    for n in range(len(response.pending)):
        item = response.function_call(n)
        frames.append(
            emit(
                "response.output_item.added",
                output_index=index,
                item=response.function_call(n, "in_progress"),
            )
        )
        frames.append(
            emit(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=index,
                delta=item["arguments"],
            )
        )
        frames.append(
            emit(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=item["arguments"],
            )
        )
        frames.append(emit("response.output_item.done", output_index=index, item=item))
        index += 1
    for item in response.approvals():
        frames.append(emit("response.output_item.added", output_index=index, item=item))
        frames.append(emit("response.output_item.done", output_index=index, item=item))
        index += 1
    kind = "response.incomplete" if response.status == "incomplete" else "response.completed"
    frames.append(emit(kind, response=response.body()))
    return frames


# A turn's state as a response's status (FINISHED: what it answered says).
_STATUSES = {
    spb.TURN_STATE_QUEUED: "queued",
    spb.TURN_STATE_RUNNING: "in_progress",
    spb.TURN_STATE_FAILED: "failed",
    spb.TURN_STATE_CANCELLED: "cancelled",
}


async def get(mesh: Mesh, response_id_value: str) -> httpbody_pb2.HttpBody:
    return json_body((await _stored(mesh, response_id_value)).body())


async def _stored(mesh: Mesh, response_id_value: str) -> Response:
    """A response as the store keeps it: its answer from the history, or,
    before it has one (a background response queued or running, or one
    that failed), its turn's state."""
    session_id, turn_id = parse_response_id(response_id_value, "response_id")
    missing = NotFound(f"response {response_id_value!r} not found")
    # The turn first: one that says it finished committed before, so the
    # history read next holds its answer.
    turn = await _turn(mesh, session_id, turn_id)
    try:
        session = await mesh.get_session(session_id)
        history = await mesh.history(session_id)
    except NotFound as exc:
        raise missing from exc
    # The model a response was made with is the session's agent.
    request = ResponseRequest(model=session.agent_name, input="")
    response = Response(request, session_id)
    response.started(turn_id)
    request.background = turn is not None and turn.background
    messages = [m for m in history if m.turn_id == turn_id]
    if not messages or messages[-1].role != "assistant":
        if turn is None or turn.state not in _STATUSES:
            raise missing
        response.status = _STATUSES[turn.state]
        response.created_at = turn.create_time.seconds
        if turn.state == spb.TURN_STATE_FAILED:
            response.error = {
                "code": turn.error_code or "server_error",
                "message": turn.error_message or "the response failed",
            }
        return response
    final = messages[-1]
    response.created_at = final.created_at.seconds
    # The stored answer, folded as the live one was.
    response.feed(event_pb2.Event(type=event_pb2.TEXT_MESSAGE_CONTENT, delta=final.content))
    for message in messages:
        for call in message.tool_calls:
            response.calls[call.id] = [call.function.name, call.function.arguments]
    # What it waits for, while it waits (once answered, its output is its text).
    outcome = event_pb2.RunOutcome()
    if session.HasField("pause") and session.pause.turn_id == turn_id:
        outcome.pending_tool_call_ids.extend(c.id for c in session.pause.tool_calls)
        outcome.interrupts.extend(session.pause.interrupts)
    response.feed(
        event_pb2.Event(type=event_pb2.RUN_FINISHED, usage=[final.usage], outcome=outcome)
    )
    return response


async def _turn(mesh: Mesh, session_id: str, turn_id: str) -> spb.Turn | None:
    """The turn, if the server still knows it (a background one: for days)."""
    try:
        return await mesh.get_turn(session_id, turn_id)
    except (NotFound, InvalidArgument):
        return None


async def cancel(mesh: Mesh, response_id_value: str) -> httpbody_pb2.HttpBody:
    """Cancel a background response (OpenAI's rule: only those); a response
    that ended already is answered as it ended."""
    session_id, turn_id = parse_response_id(response_id_value, "response_id")
    turn = await _turn(mesh, session_id, turn_id)
    if turn is None:
        raise NotFound(f"response {response_id_value!r} not found")
    if not turn.background:
        raise invalid("response_id", "only a background response can be cancelled")
    cancelled = False
    if turn.state in (spb.TURN_STATE_QUEUED, spb.TURN_STATE_RUNNING):
        with contextlib.suppress(NotFound):  # it ended meanwhile
            state = await mesh.cancel_turn(session_id, turn_id)
            cancelled = state == spb.TURN_STATE_CANCELLED
    response = await _stored(mesh, response_id_value)
    if cancelled and response.status in ("queued", "in_progress"):
        response.status = "cancelled"  # its end (RUN_ERROR) is on its way
    return json_body(response.body())
