"""OpenAI chat completions (``POST /v1/chat/completions``), byte for byte what
the official SDK expects, streaming or not.

Client tools: the request's function ``tools`` are the caller's tools for the
turn. A turn that ends waiting for their results answers with the calls as
``tool_calls`` and ``finish_reason: "tool_calls"``; the next request's
trailing ``tool`` messages are the results. With ``X-Session-Id`` they answer
the session's pause; without it the conversation before them (ending in the
assistant's ``tool_calls``) seeds a session that waits for those calls.

Approvals and questions (interrupts) have no shape in this API. The answer
says what is asked as its text (the agent's, else the interrupts' messages)
and lists them in ``message.interrupts`` (an extension beside
``tool_calls``); a request's ``resume`` (an extension:
``[{"interrupt_id", "status", "payload"}]``, TurnRequest's names) with the
session's ``X-Session-Id`` answers them. A session left waiting on one is kept
even without ``X-Session-Id`` (its id is in the ``X-Session-Id`` response
header), and any other request on it is 409 ``awaiting_client``.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from google.api import httpbody_pb2
from google.protobuf import json_format
from pydantic import BaseModel, ConfigDict, Field, ValidationError

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
    ToolCall,
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
    tools: list[ToolParam] | None = Field(default=None, max_length=pauses.MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    # Accepted: the agent decides how many calls it makes at once.
    parallel_tool_calls: bool | None = None
    resume: list[ResumeParam] | None = Field(default=None, max_length=pauses.MAX_ANSWERS)


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


def _resume(entries: list[ResumeParam]) -> list[message_pb2.ResumeEntry]:
    return [
        resume_entry(f"resume[{n}].payload", entry.interrupt_id, entry.status, entry.payload)
        for n, entry in enumerate(entries)
    ]


def _answer_span(messages: list[ChatMessage]) -> range:
    """Where the trailing tool messages are: the last ones, or those just
    before a last user message."""
    end = len(messages) - 1 if messages[-1].role == "user" else len(messages)
    start = end
    while start > 0 and messages[start - 1].role == "tool":
        start -= 1
    return range(start, end)


def _tool_results(messages: list[ChatMessage], span: range) -> list[message_pb2.ToolResult]:
    results = []
    for index in span:
        message = messages[index]
        if not message.tool_call_id:
            raise invalid(f"messages[{index}].tool_call_id", "required")
        content = message.text_only(f"messages[{index}]")
        results.append(message_pb2.ToolResult(tool_call_id=message.tool_call_id, content=content))
    return results


class ClientCalls:
    """The turn's calls of the caller's tools, in the order they started
    (their ``index`` in a streamed answer's ``tool_calls``)."""

    def __init__(self, names: set[str]) -> None:
        self._names = names
        self._calls: dict[str, tuple[int, str, list[str]]] = {}

    def feed(self, event: event_pb2.Event) -> dict[str, Any] | None:
        """The streamed ``tool_calls`` entry for this event, if it is part of
        such a call: the first names it, the next carry its arguments."""
        if event.type == event_pb2.TOOL_CALL_START and event.tool_call_name in self._names:
            if event.tool_call_id in self._calls:
                return None
            index = len(self._calls)
            self._calls[event.tool_call_id] = (index, event.tool_call_name, [])
            # The SDK's stream helper needs `type` first and `function` always.
            function = {"name": event.tool_call_name, "arguments": ""}
            return {
                "index": index,
                "id": event.tool_call_id,
                "type": "function",
                "function": function,
            }
        if event.type == event_pb2.TOOL_CALL_ARGS and event.tool_call_id in self._calls:
            index, _, arguments = self._calls[event.tool_call_id]
            arguments.append(event.delta)
            return {"index": index, "function": {"arguments": event.delta}}
        return None

    def pending(self, outcome: event_pb2.RunOutcome) -> list[dict[str, Any]]:
        """The calls the client must run: the message's ``tool_calls``."""
        waiting = set(outcome.pending_tool_call_ids)
        return [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": "".join(arguments)},
            }
            for call_id, (_, name, arguments) in self._calls.items()
            if call_id in waiting
        ]


class Turn:
    """One chat completion's turn: which session, what it answers, and how it ends."""

    def __init__(self, session_id: str, throwaway: bool) -> None:
        self.session_id = session_id
        self.throwaway = throwaway
        # This request made the session: a turn refused before it started
        # deletes it again, as it does a throwaway one.
        self.made = False
        self.seeded = 0
        self.metadata: dict[str, str] = {}
        self.on_disconnect: spb.DisconnectPolicy.ValueType = spb.DISCONNECT_POLICY_CANCEL
        self.id = ""
        self.created = int(time.time())
        self.answer = Answer()
        self.files: list[message_pb2.File] = []
        self.tools: list[message_pb2.ToolDefinition] = []
        self.tool_results: list[message_pb2.ToolResult] = []
        self.resume: list[message_pb2.ResumeEntry] = []
        # The request's messages that are the tool results, and its last one
        # (errors name them, not TurnRequest's fields).
        self.results_at = range(0)
        self.last = 0
        self.calls = ClientCalls(set())
        # RUN_FINISHED's: what the turn left the client to do (empty: nothing).
        self.outcome = event_pb2.RunOutcome()

    @property
    def usage(self) -> dict[str, int]:
        usage = self.answer.usage
        return {
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.total_tokens,
        }

    def message(self) -> tuple[dict[str, Any], str]:
        """The answer's assistant message and its finish reason."""
        text = self.answer.text
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        calls = self.calls.pending(self.outcome)
        if calls:
            message["content"] = text or None  # OpenAI's, for a message of calls only
            message["tool_calls"] = calls
        if self.outcome.interrupts:
            message["content"] = text or _asked(self.outcome) or None
            message["interrupts"] = _interrupts(self.outcome)
        return message, "tool_calls" if calls else "stop"


def _asked(outcome: event_pb2.RunOutcome) -> str:
    return "\n".join(i.message for i in outcome.interrupts if i.message)


def _interrupts(outcome: event_pb2.RunOutcome) -> list[dict[str, Any]]:
    """The approvals and questions the turn waits for (each answered by a
    ``resume`` entry with its ``id``), with TurnRequest's field names."""
    return [
        json_format.MessageToDict(interrupt, preserving_proto_field_name=True)
        for interrupt in outcome.interrupts
    ]


async def open_turn(
    mesh: Mesh,
    request: ChatCompletionRequest,
    session_header: str | None,
    on_disconnect: spb.DisconnectPolicy.ValueType,
) -> tuple[Turn, str]:
    """The session for this request, and the new user message ("" for a
    turn that only answers the session's pause)."""
    turn, message = await _open(mesh, request, session_header)
    turn.metadata = dict(request.metadata or {})
    turn.on_disconnect = on_disconnect
    return turn, message


async def _existing(mesh: Mesh, session_id: str | None) -> spb.Session | None:
    if not session_id:
        return None
    try:
        return await mesh.get_session(session_id)
    except (NotFound, InvalidArgument):
        return None  # an invalid id cannot exist either


async def _open(
    mesh: Mesh, request: ChatCompletionRequest, session_header: str | None
) -> tuple[Turn, str]:
    messages = request.messages
    last = len(messages) - 1
    user = messages[last] if messages[last].role == "user" else None
    # Only a request that answers a pause may end without the user's message.
    if user is None and messages[last].role != "tool" and not request.resume:
        raise invalid(
            f"messages[{last}].role",
            "the last message must be the user's, or tool messages answering the tool_calls"
            " of the assistant message before them",
        )
    message = user.text() if user is not None else ""
    if user is not None:
        check_message(message, f"messages[{last}].content")
    tools = client_tools(request)
    resume = _resume(request.resume or [])
    span = _answer_span(messages)
    session = await _existing(mesh, session_header)
    if session is not None and session_header:
        turn = Turn(session_header, throwaway=False)
        if user is not None:
            turn.files = await decode(user.files(f"messages[{last}]"))
            if not session.pause.tool_calls:
                # Tool messages before the user's answered an earlier pause
                # (the client resends the conversation): a plain message.
                span = range(0)
        results = _tool_results(messages, span)
    else:
        if request.resume:
            raise invalid(
                "resume",
                "answers the interrupts of a session that waits for them: send it with that"
                " session's X-Session-Id",
            )
        seed_end = _seed_end(messages, span)
        if seed_end is None:
            if user is None:
                raise invalid(
                    f"messages[{span.start}].role",
                    "a tool message must follow the assistant message whose tool_calls it answers",
                )
            span, seed_end = range(0), last
            before = messages[last - 1] if last else None
            if before is not None and before.role == "assistant" and before.tool_calls:
                # OpenAI's own rule; a session seeded so would wait for them.
                raise invalid(
                    f"messages[{last - 1}].tool_calls",
                    "each call needs a tool message answering it before the user's next message",
                )
        history = to_history(messages[:seed_end])
        results = _tool_results(messages, span)
        if results:
            _check_seeded(history[-1], results, span, last)
        # A new session: files anywhere in the conversation go with this
        # turn (the history it is seeded with holds text only).
        files = await decode(
            [
                file
                for index, m in enumerate(messages)
                if m.role == "user"
                for file in m.files(f"messages[{index}]")
            ]
        )
        session_id = await mesh.create_session(
            session_header or None, request.model, history, param="model"
        )
        turn = Turn(session_id, throwaway=not session_header)
        turn.made = True
        turn.seeded = len(history)
        turn.files = files
    turn.tools = tools
    turn.calls = ClientCalls({t.name for t in tools})
    turn.tool_results = results
    turn.results_at = span
    turn.resume = resume
    turn.last = last
    return turn, message


def _seed_end(messages: list[ChatMessage], span: range) -> int | None:
    """For a new session whose trailing tool messages answer the assistant
    message just before them: where its seeded history ends (after that
    message, so the session waits for its calls)."""
    if not span or span.start == 0:
        return None
    before = messages[span.start - 1]
    return span.start if before.role == "assistant" and before.tool_calls else None


def _check_seeded(
    calls: message_pb2.Message, results: list[message_pb2.ToolResult], span: range, last: int
) -> None:
    """The tool messages must answer the seeded calls exactly: checked before
    any session is made (a refused request leaves none behind)."""
    waits = message_pb2.Pause(tool_calls=calls.tool_calls)
    waits.expire_time.FromSeconds(2**37)  # never expires: only the ids are compared here
    try:
        pauses.check_answers("", waits, pauses.Answers(results))
    except InvalidArgument as exc:
        raise _renamed(exc, span, last) from None


def _caller_field(field: str, span: range, last: int) -> str:
    """A TurnRequest field as this request names it: a tool result is its
    tool message, the message is the last message's content."""
    head, dot, rest = field.partition(".")
    if head.startswith("tool_results["):
        n = int(head[len("tool_results[") : -1])
        where = f"messages[{span[n]}]" if n < len(span) else "messages"
        return f"{where}{dot}{rest}"
    if head == "tool_results":
        return "messages"
    if head == "message":
        return f"messages[{last}].content"
    return field


def _renamed(exc: InvalidArgument, span: range, last: int) -> InvalidArgument:
    return InvalidArgument(
        [FieldViolation(_caller_field(v.field, span, last), v.description) for v in exc.violations]
    )


def _awaiting(turn: Turn, exc: AwaitingClient) -> AwaitingClient:
    """The mesh's 409 for a plain message to a waiting session, saying how
    this API answers it."""
    calls = exc.metadata.get("tool_call_ids", "")
    interrupts = exc.metadata.get("interrupt_ids", "")
    todo = []
    if calls:
        todo.append(f'end messages with a role "tool" message for each of tool calls {calls}')
    if interrupts:
        todo.append(
            f"answer interrupts {interrupts} with the body's resume entries"
            ' ([{"interrupt_id", "status": "resolved" or "cancelled", "payload"}])'
        )
    since = exc.metadata.get("turn_id") or ""
    detail = f"session {turn.session_id!r} waits for the client: {' and '.join(todo)}"
    if since:  # a seeded pause has no turn to cancel
        detail += f"; or cancel its turn (POST /v1/sessions/{turn.session_id}/turns/{since}:cancel)"
    return AwaitingClient(detail, metadata={**exc.metadata, "param": f"messages[{turn.last}]"})


def _not_waiting(turn: Turn, exc: NotWaiting) -> NotWaiting:
    """The mesh's 409 for answers to a session that waits for none, naming
    the request's answers."""
    param = f"messages[{turn.results_at.start}]" if turn.tool_results else "resume"
    return NotWaiting(
        f"{exc.detail}; a request that ends with tool messages (or has resume) answers a"
        " session's pause: end it with a user message instead",
        metadata={**exc.metadata, "param": param},
    )


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


async def events(mesh: Mesh, turn: Turn, message: str) -> AsyncIterator[event_pb2.Event]:
    """The turn's events, each folded into ``turn.answer`` first."""
    started = ended = False
    refusal: TurnmeshError | None = None
    try:
        async with mesh.turn(
            turn.session_id,
            message,
            files=turn.files,
            metadata=turn.metadata,
            on_disconnect=turn.on_disconnect,
            tools=turn.tools,
            tool_results=turn.tool_results,
            resume=turn.resume,
        ) as stream:
            async for event in stream:
                if not turn.id:
                    turn.id = f"chatcmpl-{event.run_id}"
                turn.answer.feed(event)
                started = True
                ended = event.type in (event_pb2.RUN_FINISHED, event_pb2.RUN_ERROR)
                if event.type == event_pb2.RUN_FINISHED:
                    turn.outcome.CopyFrom(event.outcome)
                yield event
    except TurnmeshError as exc:
        refusal = None if started else exc
        if isinstance(exc, InvalidArgument):
            raise _renamed(exc, turn.results_at, turn.last) from None
        if isinstance(exc, AwaitingClient):
            raise _awaiting(turn, exc) from None
        if isinstance(exc, NotWaiting):
            raise _not_waiting(turn, exc) from None
        raise
    finally:
        # A client that left asking to continue may come back for the turn
        # (SubscribeTurn, GetHistory): its session stays until the TTL. So
        # does one that waits on an interrupt, which only it can answer (a
        # pause for tool calls is seeded again from the next conversation).
        left_to_run = started and not ended and turn.on_disconnect == spb.DISCONNECT_POLICY_CONTINUE
        waits = bool(turn.outcome.interrupts)
        if turn.throwaway and not left_to_run and not waits:
            with contextlib.suppress(TurnmeshError):  # it would expire anyway
                await mesh.delete_session(turn.session_id)
        elif turn.made and refusal is not None:
            await mesh.drop_session(turn.session_id, refusal, turn.seeded)


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
        turn.calls.feed(event)
        if event.type == event_pb2.RUN_ERROR:
            raise turn_error(event)
    answer, finish = turn.message()
    return json_body(
        {
            "id": turn.id,
            "object": "chat.completion",
            "created": turn.created,
            "model": request.model,
            "choices": [{"index": 0, "message": answer, "logprobs": None, "finish_reason": finish}],
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

    said = False
    async for event in events(mesh, turn, message):
        if event.type == event_pb2.RUN_STARTED:
            yield chunk({"role": "assistant", "content": "", "refusal": None})
        elif event.type == event_pb2.TEXT_MESSAGE_CONTENT:
            said = True
            yield chunk({"content": event.delta})
        elif turn.calls.feed(event) is not None:
            # Kept until the end: an agent's own tool may share a declared
            # tool's name, and only RUN_FINISHED says which calls the client
            # must run (the agent ran the others itself).
            pass
        elif event.type == event_pb2.RUN_FINISHED:
            _, finish = turn.message()
            for index, call in enumerate(turn.calls.pending(turn.outcome)):
                # As OpenAI streams a call: `type`, id and name first (the SDK's
                # stream helper needs `function` in every delta), then arguments.
                head = {**call, "index": index, "function": {**call["function"], "arguments": ""}}
                yield chunk({"tool_calls": [head]})
                arguments = call["function"]["arguments"]
                yield chunk(
                    {"tool_calls": [{"index": index, "function": {"arguments": arguments}}]}
                )
            last: dict[str, Any] = {}
            if turn.outcome.interrupts:
                asked = _asked(turn.outcome)
                if asked and not said:
                    yield chunk({"content": asked})
                last["interrupts"] = _interrupts(turn.outcome)
            yield chunk(last, finish)
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
