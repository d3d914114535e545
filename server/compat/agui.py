"""AG-UI (``POST /v1/agui``): a RunAgentInput in, AG-UI events out over SSE.

The events carry only the fields AG-UI defines for each type (with AG-UI's
value types), so the real client validates them without a warning.

The thread is the session. A run's ``tools`` are the caller's (frontend)
tools for that turn; a run that ends waiting for the client says so in
RUN_FINISHED's ``outcome``: ``{"type": "success", "pendingToolCallIds"}``
for calls of those tools, ``{"type": "interrupt", "interrupts"}`` for
approvals and questions. The next run answers: its ``messages`` end with the
``tool`` messages for the calls (a user message may follow them), its
``resume`` holds an entry per interrupt. A new thread whose history ends in
an assistant's calls and their tool messages is seeded up to the calls, and
the tool messages answer them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import UTC
from typing import Any, Literal

from google.api import httpbody_pb2
from google.protobuf import json_format
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from turnmesh.runtime.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    NotWaiting,
    TurnmeshError,
)
from turnmesh.server.compat._common import (
    POLICIES,
    Mesh,
    ToolCall,
    from_pydantic,
    invalid,
    parse_json_body,
    resume_entry,
    sse_body,
    tool_definition,
)
from turnmesh.server.compat._files import Inline, decode, unsupported
from turnmesh.server.sessions import answers, validation
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb


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
    error: str | None = None

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


class AguiTool(BaseModel):
    """A frontend tool (AG-UI's Tool); ``description`` may be left out."""

    model_config = ConfigDict(extra="allow")
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class AguiResume(BaseModel):
    """An answer to an interrupt (AG-UI's ResumeEntry)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    interrupt_id: str = Field(alias="interruptId", min_length=1)
    status: Literal["resolved", "cancelled"]
    payload: Any = None


class RunAgentInput(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    thread_id: str = Field(alias="threadId", min_length=1, max_length=128)
    run_id: str = Field(default="", alias="runId")
    # Empty only in a run that carries resume entries (the thread holds the rest).
    messages: list[AguiMessage] = Field(max_length=1000)
    state: Any = None
    tools: list[AguiTool] = Field(default_factory=list)
    context: list[Any] = Field(default_factory=list)
    forwarded_props: dict[str, Any] = Field(default_factory=dict, alias="forwardedProps")
    resume: list[AguiResume] = Field(default_factory=list)


async def parse(body: httpbody_pb2.HttpBody) -> RunAgentInput:
    data = await parse_json_body(body)
    try:
        run = RunAgentInput.model_validate(data)
    except ValidationError as exc:
        raise from_pydantic(exc, data) from exc
    last = len(run.messages) - 1
    if not run.messages and not run.resume:
        raise invalid("messages", "at least 1 (or the run must carry resume)")
    # A run that answers a pause ends with tool messages, or carries resume
    # entries after the assistant's message: only then may the user's be absent.
    if run.messages and run.messages[last].role not in ("user", "tool") and not run.resume:
        raise invalid(
            f"messages[{last}].role",
            "the last message must be the user's or a tool result (or the run must carry resume)",
        )
    for index in _answer_indices(run.messages):
        if not run.messages[index].tool_call_id:
            raise invalid(f"messages[{index}].toolCallId", "required")
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
            error=m.error or "",
        )
        for call in m.tool_calls:
            call.add_to(message)
        history.append(message)
    return history


def _answer_indices(messages: list[AguiMessage]) -> range:
    """Where the trailing tool messages are: the last ones, or those just
    before a last user message."""
    end = len(messages) - 1 if messages and messages[-1].role == "user" else len(messages)
    start = end
    while start > 0 and messages[start - 1].role == "tool":
        start -= 1
    return range(start, end)


def _tool_results(
    messages: list[AguiMessage], indices: Sequence[int]
) -> list[message_pb2.ToolResult]:
    return [
        message_pb2.ToolResult(
            tool_call_id=messages[i].tool_call_id or "",
            content=messages[i].text(),
            error=messages[i].error or "",
        )
        for i in indices
    ]


def _resume(entries: list[AguiResume]) -> list[message_pb2.ResumeEntry]:
    # AG-UI leaves ``payload`` out rather than send null: both are "no payload".
    return [
        resume_entry(f"resume[{n}].payload", entry.interrupt_id, entry.status, entry.payload)
        for n, entry in enumerate(entries)
    ]


def _names(indices: Sequence[int], last: int) -> answers.Names:
    """The RunAgentInput's names for a TurnRequest's fields: a tool result
    is its tool message, the message is the last user message's content."""
    return answers.Names(
        results=[f"messages[{i}]" for i in indices],
        results_field="messages",
        message=f"messages[{last}].content",
        keys={
            "messages": {"tool_call_id": "toolCallId"},
            "resume": {"interrupt_id": "interruptId"},
        },
    )


def _outcome(outcome: event_pb2.RunOutcome) -> dict[str, Any] | None:
    """RUN_FINISHED's outcome in AG-UI 1.0's shape, or None for a plain
    success (AG-UI reads an absent outcome as success). AG-UI's interrupt
    outcome has no pending calls: any are in the stream's TOOL_CALL events
    and the next run must answer them too."""
    if outcome.type == "interrupt" and outcome.interrupts:
        return {"type": "interrupt", "interrupts": [_interrupt(i) for i in outcome.interrupts]}
    if outcome.type == "success" and outcome.pending_tool_call_ids:
        return {"type": "success", "pendingToolCallIds": list(outcome.pending_tool_call_ids)}
    if outcome.type == "cancelled":
        return {"type": "cancelled"}
    return None


def _interrupt(interrupt: event_pb2.Interrupt) -> dict[str, Any]:
    out: dict[str, Any] = {"id": interrupt.id, "reason": interrupt.reason}
    if interrupt.message:
        out["message"] = interrupt.message
    if interrupt.tool_call_id:
        out["toolCallId"] = interrupt.tool_call_id
    if interrupt.HasField("response_schema"):
        out["responseSchema"] = json_format.MessageToDict(interrupt.response_schema)
    if interrupt.HasField("expires_at"):
        # ISO 8601 in milliseconds, as JavaScript's Date prints it (the client
        # compares it with ``new Date(expiresAt)``).
        at = interrupt.expires_at.ToDatetime(tzinfo=UTC)
        out["expiresAt"] = at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if interrupt.HasField("metadata"):
        out["metadata"] = json_format.MessageToDict(interrupt.metadata)
    return out


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
        if t == event_pb2.RUN_FINISHED and (outcome := _outcome(event.outcome)) is not None:
            out["outcome"] = outcome
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


async def _session(mesh: Mesh, thread: str) -> spb.Session | None:
    try:
        return await mesh.get_session(thread)
    except (NotFound, InvalidArgument):
        return None  # an invalid id cannot exist either


def _answers_to(pause: message_pb2.Pause, messages: list[AguiMessage], indices: range) -> list[int]:
    """The trailing tool messages that answer the thread's pause. The client
    keeps the results of the agent's own calls (made in the paused message
    beside the client's) among them: those are history already, not
    answers. An id no message of the run calls stays, to be refused."""
    waited = {call.id for call in pause.tool_calls}
    called = {call.id for m in messages if m.role == "assistant" for call in m.tool_calls}
    return [
        i
        for i in indices
        if messages[i].tool_call_id in waited or messages[i].tool_call_id not in called
    ]


def _seed_until(messages: list[AguiMessage], indices: range) -> int | None:
    """For a new thread whose trailing tool messages answer the assistant
    message just before them: where the seeded history ends (after that
    message, so the new session waits for its calls)."""
    if not indices or indices.start == 0:
        return None
    before = messages[indices.start - 1]
    return indices.start if before.role == "assistant" and before.tool_calls else None


def _check_seeded(seed: list[message_pb2.Message], given: answers.Answers) -> None:
    """The tool messages must answer the seeded calls exactly, checked
    before the thread is made (a refused run leaves no session behind)."""
    answers.check_resent(seed[-1].tool_calls, given)


async def run(
    mesh: Mesh, request: RunAgentInput, on_disconnect: spb.DisconnectPolicy.ValueType
) -> AsyncIterator[httpbody_pb2.HttpBody]:
    """The run's AG-UI events; a client that leaves (``abortRun()``) cancels
    it unless ``on_disconnect`` says continue."""
    thread = request.thread_id
    messages = request.messages
    last = len(messages) - 1
    trailing = _answer_indices(messages)
    indices: Sequence[int] = trailing
    user = messages[last] if messages and messages[last].role == "user" else None
    message = user.text() if user is not None else ""
    files = await decode(user.files(f"messages[{last}]")) if user is not None else []
    resume = _resume(request.resume)
    tools = [
        tool_definition(t.name, t.description, t.parameters, f"tools[{n}].parameters")
        for n, t in enumerate(request.tools)
    ]
    if violations := validation.tool_violations(tools):
        raise InvalidArgument(violations)  # before a new thread is made
    session = await _session(mesh, thread)
    made = False  # this run made the thread: a refused run deletes it again
    seed: list[message_pb2.Message] = []
    if session is None:
        seed_end = _seed_until(messages, trailing)
        if resume:
            raise NotWaiting(f"thread {thread!r} is new: it waits for no resume entries")
        if seed_end is None and user is None:
            raise invalid(
                f"messages[{trailing.start}]",
                "a new thread's tool messages must follow the assistant message with their calls",
            )
        if seed_end is None:
            indices = range(0)
            seed = _history(messages[:last])
        else:
            seed = _history(messages[:seed_end])
            try:
                _check_seeded(seed, answers.Answers(_tool_results(messages, indices)))
            except InvalidArgument as exc:
                raise _names(indices, last).rename(exc) from None
        agent = request.forwarded_props.get("agent")
        # A concurrent first run on the same thread may have created it.
        with contextlib.suppress(AlreadyExists):
            await mesh.create_session(thread, agent if isinstance(agent, str) else None, seed)
            made = True
    elif (
        user is not None
        and resume
        and not session.HasField("pause")
        and answers.withdraws(answers.Answers(resume=resume))
    ):
        # The client withdraws interrupts the thread waits for no more
        # (expired, cancelled, or answered by another run): its client
        # insists on that before anything else. The message runs.
        resume = []
        indices = range(0)
    elif user is not None and not session.pause.tool_calls:
        # Tool messages before a user message answered an earlier pause (or
        # one that expired, which the server answers): a plain message.
        indices = range(0)
    elif session.HasField("pause"):
        indices = _answers_to(session.pause, messages, trailing)
    run_id = request.run_id
    policy = POLICIES[request.forwarded_props.get("policy", "collect")]
    try:
        async with mesh.turn(
            thread,
            message,
            policy=policy,
            on_disconnect=on_disconnect,
            files=files,
            tools=tools,
            tool_results=_tool_results(messages, indices),
            resume=resume,
        ) as stream:
            async for event in stream:
                made = False  # it started: the thread holds the run
                run_id = run_id or event.run_id
                payload = to_agui(event, thread, run_id)
                if payload is not None:
                    yield sse_body(payload)
    except TurnmeshError as exc:
        if made:
            await mesh.drop_session(thread, exc, len(seed))
        if isinstance(exc, InvalidArgument):
            raise _names(indices, last).rename(exc) from None
        raise
