"""A2A messages in and out.

In: a client's ``Message`` as a turn's parts: its text parts joined (one
paragraph each) are the user's message, ``raw`` parts are the turn's files
(the mesh's own types and limits, checked by ``files``), ``data`` parts and the message's metadata
are the turn's metadata (``a2a_data``: the data parts' values in order), and
its ``message_id`` is the turn's idempotency key. A file by ``url`` is not
fetched: ContentTypeNotSupported.

Out: a session's messages of a task as A2A messages: the user's (``ROLE_USER``,
its own message id), the agent's text and its tool activity (``ROLE_AGENT``;
a tool call is a data part ``{"toolCall": {"id", "name", "arguments"}}``, its
result ``{"toolResult": {"toolCallId", "content", "error"}}``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from a2a.types import a2a_pb2
from google.protobuf import json_format, struct_pb2

from turnmesh.runtime.errors import ContentTypeNotSupported, FieldViolation, InvalidParams
from turnmesh.server.compat._common import tool_definition
from turnmesh.server.compat.a2a.files import check_all, raw_file
from turnmesh.server.sessions.validation import MAX_IDEMPOTENCY_KEY_CHARS
from turnmesh.v1 import message_pb2

# Metadata keys the surface adds to a turn (the agent sees them too).
MESSAGE_ID_KEY = "a2a_message_id"
DATA_KEY = "a2a_data"
# A message's parts, at most (files have limits of their own).
MAX_PARTS = 64
TOOLS_KEY = "tools"
MAX_TOOLS = 64


def invalid_params(field_name: str, description: str) -> InvalidParams:
    return InvalidParams([FieldViolation(field_name, description)])


@dataclass
class Incoming:
    """A client's message as a turn takes it."""

    message_id: str
    context_id: str
    task_id: str
    text: str
    files: list[message_pb2.File] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    # The data parts' values, in order (answers to a task's input: ``answering``).
    data: list[Any] = field(default_factory=list)
    # The client's own tools, from a data part ``{"tools": [{"name",
    # "description", "parameters"}]}``: a call of one ends the task
    # INPUT_REQUIRED until the client sends its result.
    tools: list[message_pb2.ToolDefinition] = field(default_factory=list)


def incoming(message: a2a_pb2.Message, request_metadata: struct_pb2.Struct) -> Incoming:
    if not message.message_id:
        raise invalid_params("message.message_id", "is required")
    if len(message.message_id) > MAX_IDEMPOTENCY_KEY_CHARS:
        raise invalid_params(
            "message.message_id", f"must be at most {MAX_IDEMPOTENCY_KEY_CHARS} characters"
        )
    if message.role != a2a_pb2.ROLE_USER:
        raise invalid_params("message.role", "must be ROLE_USER")
    if not message.parts:
        raise invalid_params("message.parts", "must hold at least one part")
    if len(message.parts) > MAX_PARTS:
        raise invalid_params("message.parts", f"must hold at most {MAX_PARTS} parts")
    texts: list[str] = []
    files: list[message_pb2.File] = []
    data: list[Any] = []
    for index, part in enumerate(message.parts):
        kind = part.WhichOneof("content")
        where = f"message.parts[{index}]"
        if kind == "text":
            texts.append(part.text)
        elif kind == "raw":
            files.append(raw_file(part, where))
        elif kind == "data":
            data.append(json_format.MessageToDict(part.data))
        elif kind == "url":
            raise ContentTypeNotSupported(
                [FieldViolation(f"{where}.url", "files by URL are not fetched; send them raw")]
            )
        else:
            raise invalid_params(where, "has no content (text, raw, url or data)")
    check_all(files)
    metadata = {
        **json_format.MessageToDict(request_metadata),
        **json_format.MessageToDict(message.metadata),
        MESSAGE_ID_KEY: message.message_id,
    }
    if data:
        metadata[DATA_KEY] = data
    tools = [
        tool
        for index, value in enumerate(data)
        if isinstance(value, dict) and TOOLS_KEY in value
        for tool in _tools(value[TOOLS_KEY], f"message.parts[{index}].data.{TOOLS_KEY}")
    ]
    return Incoming(
        message_id=message.message_id,
        context_id=message.context_id,
        task_id=message.task_id,
        text="\n\n".join(texts),
        files=files,
        metadata=metadata,
        data=data,
        tools=tools,
    )


def _tools(value: Any, where: str) -> list[message_pb2.ToolDefinition]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise invalid_params(where, "must be a list of objects")
    if len(value) > MAX_TOOLS:
        raise invalid_params(where, f"at most {MAX_TOOLS}")
    out = []
    for n, tool in enumerate(value):
        name, description = tool.get("name"), tool.get("description")
        parameters = tool.get("parameters")
        if not isinstance(name, str) or not isinstance(description, str | None):
            raise invalid_params(f"{where}[{n}]", "needs a name (and a description) as strings")
        if parameters is not None and not isinstance(parameters, dict):
            raise invalid_params(f"{where}[{n}].parameters", "must be a JSON schema object")
        out.append(tool_definition(name, description, parameters, f"{where}[{n}].parameters"))
    return out


def user_message(incoming: Incoming, context_id: str, task_id: str) -> a2a_pb2.Message:
    """The client's message as the task's history shows it (its files by name)."""
    message = a2a_pb2.Message(
        message_id=incoming.message_id,
        context_id=context_id,
        task_id=task_id,
        role=a2a_pb2.ROLE_USER,
    )
    if incoming.text:
        message.parts.add(text=incoming.text)
    for file in incoming.files:
        message.parts.add(text="", filename=file.filename, media_type=file.mime_type)
    return message


def history(
    messages: list[message_pb2.Message], context_id: str, task_id: str, turn_id: str
) -> list[a2a_pb2.Message]:
    """The task's messages (those of its turn) as A2A messages; system
    messages are the agent's instructions, not the conversation."""
    out: list[a2a_pb2.Message] = []
    for index, message in enumerate(messages):
        converted = _converted(message, f"{turn_id}-{index}")
        if converted is None:
            continue
        converted.context_id = context_id
        converted.task_id = task_id
        out.append(converted)
    return out


def _converted(message: message_pb2.Message, fallback_id: str) -> a2a_pb2.Message | None:
    if message.role == "user":
        metadata = json_format.MessageToDict(message.metadata)
        message_id = metadata.pop(MESSAGE_ID_KEY, None)
        metadata.pop(DATA_KEY, None)
        out = a2a_pb2.Message(
            message_id=message_id if isinstance(message_id, str) else fallback_id,
            role=a2a_pb2.ROLE_USER,
        )
        if metadata:
            out.metadata.update(metadata)
        if message.content:
            out.parts.add(text=message.content)
        for ref in message.files:
            out.parts.add(text="", filename=ref.filename, media_type=ref.mime_type)
        return out if out.parts else None
    out = a2a_pb2.Message(message_id=fallback_id, role=a2a_pb2.ROLE_AGENT)
    if message.role == "assistant":
        if message.content:
            out.parts.add(text=message.content)
        for call in message.tool_calls:
            out.parts.append(
                data_part(
                    {
                        "toolCall": {
                            "id": call.id,
                            "name": call.function.name,
                            "arguments": call.function.arguments,
                        }
                    }
                )
            )
    elif message.role == "tool":
        result: dict[str, Any] = {"toolCallId": message.tool_call_id, "content": message.content}
        if message.error:
            result["error"] = message.error
        out.parts.append(data_part({"toolResult": result}))
    return out if out.parts else None


def data_part(value: dict[str, Any]) -> a2a_pb2.Part:
    part = a2a_pb2.Part()
    json_format.ParseDict(value, part.data)
    return part
