"""A task's state, status and answer, from its turn's events as they come
(``TaskView``) or from what the mesh kept of it (``state_of``, ``status_message``).

States: a queued turn is SUBMITTED, a running one WORKING; FINISHED is
COMPLETED, or INPUT_REQUIRED while the session waits on that turn's pause;
a failed turn is FAILED
(REJECTED when it was refused for a pause it queued behind), a cancelled one
CANCELED. The answer is one artifact (``<turn>-answer``) of text, streamed
as the agent writes it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from a2a.types import a2a_pb2
from google.protobuf import json_format, timestamp_pb2

from turnmesh.runtime.turn_errors import STOPPED_CODES, TurnError
from turnmesh.server.compat.a2a.ids import task_id
from turnmesh.server.compat.a2a.messages import data_part
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb

S = a2a_pb2.TaskState
TERMINAL = frozenset(
    {S.TASK_STATE_COMPLETED, S.TASK_STATE_FAILED, S.TASK_STATE_CANCELED, S.TASK_STATE_REJECTED}
)


def answer_artifact_id(turn_id: str) -> str:
    return f"{turn_id}-answer"


def waits(outcome: event_pb2.RunOutcome) -> bool:
    return bool(outcome.interrupts or outcome.pending_tool_call_ids)


def _ended_state(code: str) -> a2a_pb2.TaskState:
    if code in STOPPED_CODES:
        return S.TASK_STATE_CANCELED
    if code == TurnError.AWAITING_CLIENT.code:
        return S.TASK_STATE_REJECTED
    return S.TASK_STATE_FAILED


def state_of(turn: spb.Turn, session: spb.Session) -> a2a_pb2.TaskState:
    if turn.state == spb.TURN_STATE_QUEUED:
        return S.TASK_STATE_SUBMITTED
    if turn.state == spb.TURN_STATE_RUNNING:
        return S.TASK_STATE_WORKING
    if turn.state == spb.TURN_STATE_CANCELLED:
        return S.TASK_STATE_CANCELED
    if turn.state == spb.TURN_STATE_FAILED:
        return _ended_state(turn.error_code)
    # The session shows a pause only while it waits (not answered, expired
    # or cancelled).
    if session.HasField("pause") and session.pause.turn_id == turn.turn_id:
        return S.TASK_STATE_INPUT_REQUIRED
    return S.TASK_STATE_COMPLETED


def agent_message(
    context_id: str, task: str, key: str, text: str = "", parts: Iterable[a2a_pb2.Part] = ()
) -> a2a_pb2.Message:
    message = a2a_pb2.Message(
        message_id=f"{task}-{key}", context_id=context_id, task_id=task, role=a2a_pb2.ROLE_AGENT
    )
    if text:
        message.parts.add(text=text)
    message.parts.extend(parts)
    return message


def waiting_message(context_id: str, task: str, outcome: event_pb2.RunOutcome) -> a2a_pb2.Message:
    """What an INPUT_REQUIRED task asks: the interrupts' text, and all of it
    as a data part ``{"interrupts": [...], "pendingToolCallIds": [...]}``."""
    value = json_format.MessageToDict(outcome)
    value.pop("type", None)
    text = "\n".join(i.message for i in outcome.interrupts if i.message)
    return agent_message(context_id, task, "input-required", text, [data_part(value)])


def error_text(message: str, detail: str) -> str:
    text = message or "the task failed"
    return f"{text}: {detail}" if detail and detail != text else text


def status_message(
    turn: spb.Turn, state: a2a_pb2.TaskState, context_id: str, task: str
) -> a2a_pb2.Message | None:
    if state == S.TASK_STATE_INPUT_REQUIRED:
        return waiting_message(context_id, task, turn.outcome)
    if state in (S.TASK_STATE_FAILED, S.TASK_STATE_REJECTED, S.TASK_STATE_CANCELED) and (
        turn.error_message or turn.problem.detail
    ):
        text = error_text(turn.error_message, turn.problem.detail)
        return agent_message(context_id, task, "status", text)
    return None


def answer(messages: Iterable[message_pb2.Message]) -> str:
    """The turn's answer: all the text its agent wrote."""
    return "".join(m.content for m in messages if m.role == "assistant")


class TaskView:
    """A task followed through its turn's events: each event as the A2A
    stream responses it makes, and the task as it stands."""

    def __init__(self, session_id: str, turn_id: str, task: str = "") -> None:
        self.context_id = session_id
        self.turn_id = turn_id
        # A task's later turns (answers to its input) keep its first's id.
        self.id = task or task_id(session_id, turn_id)
        self.state: a2a_pb2.TaskState = S.TASK_STATE_SUBMITTED
        self.message: a2a_pb2.Message | None = None
        self.history: list[a2a_pb2.Message] = []
        self.text: list[str] = []
        # The latest delta, sent once the next one (or the end) says whether it is the last.
        self._held: str | None = None
        self._chunks = 0
        self._calls: dict[str, list[str]] = {}

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL or self.state == S.TASK_STATE_INPUT_REQUIRED

    def task(self) -> a2a_pb2.Task:
        """The task as it stands, for a stream's first response: its answer
        so far, but the delta held back, which the next update appends."""
        task = a2a_pb2.Task(id=self.id, context_id=self.context_id, history=self.history)
        task.status.CopyFrom(self.status())
        sent = self.text[:-1] if self._held is not None else self.text
        if sent:
            task.artifacts.add(
                artifact_id=answer_artifact_id(self.turn_id),
                name="answer",
                parts=[a2a_pb2.Part(text="".join(sent))],
            )
            self._chunks = max(self._chunks, 1)
        return task

    def status(self, message: a2a_pb2.Message | None = None) -> a2a_pb2.TaskStatus:
        status = a2a_pb2.TaskStatus(state=self.state, timestamp=_now())
        if message is not None:
            status.message.CopyFrom(message)
        elif self.message is not None:
            status.message.CopyFrom(self.message)
        return status

    def _status_update(self, message: a2a_pb2.Message | None = None) -> a2a_pb2.StreamResponse:
        update = a2a_pb2.TaskStatusUpdateEvent(
            task_id=self.id, context_id=self.context_id, status=self.status(message)
        )
        return a2a_pb2.StreamResponse(status_update=update)

    def _chunk(self, text: str, last: bool) -> a2a_pb2.StreamResponse:
        update = a2a_pb2.TaskArtifactUpdateEvent(
            task_id=self.id,
            context_id=self.context_id,
            append=self._chunks > 0,
            last_chunk=last,
        )
        update.artifact.artifact_id = answer_artifact_id(self.turn_id)
        update.artifact.name = "answer"
        update.artifact.parts.add(text=text)
        self._chunks += 1
        return a2a_pb2.StreamResponse(artifact_update=update)

    def feed(self, event: event_pb2.Event) -> list[a2a_pb2.StreamResponse]:
        """The stream responses an event makes (none for most)."""
        kind = event.type
        if kind == event_pb2.RUN_STARTED:
            self.state = S.TASK_STATE_WORKING
            return [self._status_update()]
        if kind == event_pb2.TEXT_MESSAGE_CONTENT:
            if not event.delta:
                return []
            self.text.append(event.delta)
            held, self._held = self._held, event.delta
            return [] if held is None else [self._chunk(held, last=False)]
        if kind == event_pb2.TOOL_CALL_START:
            self._calls[event.tool_call_id] = [event.tool_call_name, ""]
        elif kind == event_pb2.TOOL_CALL_ARGS and event.tool_call_id in self._calls:
            self._calls[event.tool_call_id][1] += event.delta
        elif kind == event_pb2.TOOL_CALL_END and event.tool_call_id in self._calls:
            name, arguments = self._calls.pop(event.tool_call_id)
            call = {"toolCall": {"id": event.tool_call_id, "name": name, "arguments": arguments}}
            return [self._working(event.tool_call_id, call)]
        elif kind == event_pb2.TOOL_CALL_RESULT:
            result = {"toolResult": {"toolCallId": event.tool_call_id, "content": event.content}}
            return [self._working(f"{event.tool_call_id}-result", result)]
        elif kind == event_pb2.CUSTOM and event.name == "keepalive":
            return [self._status_update()]  # the same state again: the stream lives
        elif kind == event_pb2.RUN_FINISHED:
            out = self._flush()
            if waits(event.outcome):
                self.state = S.TASK_STATE_INPUT_REQUIRED
                self.message = waiting_message(self.context_id, self.id, event.outcome)
            else:
                self.state = S.TASK_STATE_COMPLETED
            return [*out, self._status_update()]
        elif kind == event_pb2.RUN_ERROR:
            self.state = _ended_state(event.code)
            text = error_text(event.message, event.problem.detail)
            self.message = agent_message(self.context_id, self.id, "status", text)
            return [self._status_update()]
        return []

    def _working(self, key: str, value: dict[str, Any]) -> a2a_pb2.StreamResponse:
        message = agent_message(self.context_id, self.id, key, parts=[data_part(value)])
        return self._status_update(message)

    def _flush(self) -> list[a2a_pb2.StreamResponse]:
        held, self._held = self._held, None
        return [] if held is None else [self._chunk(held, last=True)]


def _now() -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.GetCurrentTime()
    return stamp
