"""The chat completion request: its messages, the caller's tools and the
ones ``tool_choice`` leaves the agent."""

from __future__ import annotations

import re
from typing import Any, Literal

from google.api import httpbody_pb2
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from turnmesh.runtime.errors import (
    FieldViolation,
    InvalidArgument,
)
from turnmesh.server.compat._common import (
    ContentPart,
    ToolCall,
    from_pydantic,
    invalid,
    parse_json_body,
    resume_entry,
    tool_definition,
)
from turnmesh.server.compat._files import Inline, from_data_url, from_inline, unsupported
from turnmesh.server.sessions import answers, validation
from turnmesh.v1 import message_pb2


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

    def text_only(self, field: str) -> str:
        """The text of a message that may hold text parts only (a tool's result)."""
        if isinstance(self.content, list):
            for index, part in enumerate(self.content):
                if part.type not in ("text", "input_text"):
                    raise invalid(f"{field}.content[{index}].type", "must be text")
        return self.text()

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


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    # Accepted; the agent is not told (a ToolDefinition has no such field).
    strict: bool | None = None


class ToolParam(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    function: FunctionDefinition | None = None


class ResumeParam(BaseModel):
    """An answer to an interrupt (an extension: TurnRequest's ResumeEntry)."""

    model_config = ConfigDict(extra="allow")
    interrupt_id: str = Field(min_length=1, max_length=128)
    status: Literal["resolved", "cancelled"]
    # Any JSON value; absent or null: no payload.
    payload: Any = None


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
    tools: list[ToolParam] | None = Field(default=None, max_length=validation.MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    # Accepted: the agent decides how many calls it makes at once.
    parallel_tool_calls: bool | None = None
    resume: list[ResumeParam] | None = Field(default=None, max_length=answers.MAX_ANSWERS)


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


def client_tools(request: ChatCompletionRequest) -> list[message_pb2.ToolDefinition]:
    """The request's function tools, as ``tool_choice`` lets the agent see
    them ("none": none; a named function: that one)."""
    declared: list[message_pb2.ToolDefinition] = []
    for n, tool in enumerate(request.tools or ()):
        if tool.type != "function":
            raise invalid(
                f"tools[{n}].type", f"{tool.type!r} tools are not supported: only function tools"
            )
        if tool.function is None:
            raise invalid(f"tools[{n}].function", "required")
        function = tool.function
        declared.append(
            tool_definition(
                function.name,
                function.description,
                function.parameters,
                f"tools[{n}].function.parameters",
            )
        )
    violations = validation.tool_violations(declared)
    if violations:
        # The mesh names ToolDefinition's fields; OpenAI's are in `function`.
        raise InvalidArgument(
            [
                FieldViolation(_TOOL_FIELD.sub(r"\1.function.\2", v.field), v.description)
                for v in violations
            ]
        )
    chosen = _chosen(request.tool_choice, {t.name for t in declared})
    return [t for t in declared if chosen is None or t.name in chosen]


_TOOL_FIELD = re.compile(r"^(tools\[\d+\])\.(\w+)$")


def _chosen(choice: str | dict[str, Any] | None, declared: set[str]) -> set[str] | None:
    """The tools ``tool_choice`` allows, or None for all of them. "required"
    passes them all: whether a tool is called is the agent's to decide."""
    if choice is None or choice in ("auto", "required"):
        return None
    if choice == "none":
        return set()
    assert isinstance(choice, dict)
    kind = choice.get("type")
    named: list[tuple[str, Any]]
    if kind == "function":
        named = [("tool_choice.function", choice.get("function"))]
    elif kind == "allowed_tools":
        allowed = choice.get("allowed_tools")
        tools = allowed.get("tools") if isinstance(allowed, dict) else None
        if not isinstance(tools, list):
            raise invalid("tool_choice.allowed_tools.tools", "required: a list of function tools")
        named = []
        for n, tool in enumerate(tools):
            where = f"tool_choice.allowed_tools.tools[{n}]"
            if not isinstance(tool, dict) or tool.get("type") != "function":
                raise invalid(f"{where}.type", "must be function (only function tools are served)")
            named.append((f"{where}.function", tool.get("function")))
    else:
        raise invalid(
            "tool_choice.type",
            "must be function or allowed_tools (only function tools are served)",
        )
    chosen: set[str] = set()
    for where, function in named:
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise invalid(f"{where}.name", "required")
        if name not in declared:
            raise invalid(f"{where}.name", f"no function named {name!r} in tools")
        chosen.add(name)
    return chosen


def resume_entries(entries: list[ResumeParam]) -> list[message_pb2.ResumeEntry]:
    return [
        resume_entry(f"resume[{n}].payload", entry.interrupt_id, entry.status, entry.payload)
        for n, entry in enumerate(entries)
    ]


async def parse(body: httpbody_pb2.HttpBody) -> ChatCompletionRequest:
    data = await parse_json_body(body)
    try:
        request = ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise from_pydantic(exc, data) from exc
    extra = request.model_extra or {}
    for legacy in ("functions", "function_call"):
        if extra.get(legacy) is not None:
            raise invalid(legacy, "deprecated by OpenAI and not served: use tools and tool_choice")
    return request
