"""The Responses request: its models, its input items, and the tools
``tool_choice`` leaves the agent."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from google.api import httpbody_pb2
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from turnmesh.runtime.errors import InvalidArgument
from turnmesh.server.compat._common import (
    ContentPart,
    check_message,
    from_pydantic,
    invalid,
    parse_json_body,
    resume_entry,
    tool_definition,
)
from turnmesh.server.compat._files import Inline, from_data_url, from_inline, unsupported
from turnmesh.server.sessions import answers, validation
from turnmesh.v1 import message_pb2

# Ids a caller sends back (call ids, approval request ids): bounded.
MAX_ID_CHARS = 256


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
    """An approval request sent back with the rest of an earlier output
    (its name and arguments are the stored ones: ``approvals``)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["mcp_approval_request"]
    id: str | None = Field(default=None, max_length=512)


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
    tools: Annotated[list[dict[str, Any]], Field(max_length=validation.MAX_TOOLS)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    # Accepted: the agent decides how many calls it makes at once.
    parallel_tool_calls: bool | None = None
    resume: Annotated[list[ResumeParam], Field(max_length=answers.MAX_ANSWERS)] | None = None
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


def _approver(request: ResponseRequest, raw: dict[str, Any], index: int) -> None:
    """An ``mcp`` tool naming the agent (its ``server_label``): the client
    answers the agent's approval requests, which it asks anyway (what the
    agent SDKs declare to take them: openai-agents' HostedMCPTool, the
    Vercel AI SDK's openai.tools.mcp). Nothing else of it is read: the mesh
    never connects to its ``server_url`` nor keeps its ``headers`` or
    ``authorization``."""
    label = raw.get("server_label")
    if label != request.model:
        raise invalid(
            f"tools[{index}].server_label",
            f"an mcp tool names the agent whose approval requests the client answers:"
            f" must be {request.model!r} (the model); other MCP servers are not supported",
        )


def _function_tools(request: ResponseRequest) -> list[FunctionTool]:
    """The request's tools: function tools (named as the native API names a
    caller's tools), and ``mcp`` tools that name the agent (``_approver``);
    the others are OpenAI's own, hosted ones."""
    tools = []
    for index, raw in enumerate(request.tools or ()):
        kind = raw.get("type")
        if kind == "mcp":
            _approver(request, raw, index)
            continue
        if kind != "function":
            raise invalid(
                f"tools[{index}].type",
                f"{str(kind)[:64]!r} tools are not supported: function tools, and mcp tools"
                " that name the agent (to answer its approval requests), are",
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


class TurnAnswers:
    """A request's answers as the turn takes them, with the caller's name
    for each (``input[3]``, ``resume[0]``) to name it in errors."""

    def __init__(
        self, request: ResponseRequest, interrupt_ids: dict[str, str] | None = None
    ) -> None:
        # Approval item ids (what the output showed) as the interrupts they name.
        interrupt_ids = interrupt_ids or {}
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
                interrupt_id = interrupt_ids.get(item.approval_request_id, item.approval_request_id)
                self.resume.append(resume_entry(where, interrupt_id, "resolved", payload))
                self.resume_fields.append(where)
        for index, entry in enumerate(request.resume or ()):
            self.resume.append(
                resume_entry(
                    f"resume[{index}].payload", entry.interrupt_id, entry.status, entry.payload
                )
            )
            self.resume_fields.append(f"resume[{index}]")

    def names(self) -> answers.Names:
        """The request's names for a TurnRequest's answers: the input item
        or resume entry each came from, an input item's fields by its own
        names (``call_id``, ``output``, ``approval_request_id``)."""
        return answers.Names(
            results=self.result_fields,
            resume=self.resume_fields,
            results_field="input",
            resume_field="input",
            keys={"input": INPUT_KEYS},
        )


# A TurnRequest's answer fields as input items name them.
INPUT_KEYS = {"tool_call_id": "call_id", "interrupt_id": "approval_request_id", "content": "output"}
