"""``kind: a2a``: a remote A2A agent behind the mesh. Each turn is sent to it
with the pinned a2a-sdk client, and its stream comes back as turnmesh events,
so any A2A agent gets the mesh's sessions, history, resume, tenancy, webhooks
and every surface (gRPC, REST/SSE, OpenAI, AG-UI, /v1/chat).

Where the remote's ids live, across turns and workers:

- **context_id** is derived from the session id (a UUIDv5 of it), so every
  worker sends the same one for a session, with nothing to store. Each
  turn's ``RUN_FINISHED.result`` (kept on the history's final assistant
  message) names the context the remote used; a turn whose history holds no
  such mark for the session's context (a seeded or forked session, or a
  remote that chose its own context id) sends the history first, as a
  transcript, so the remote has the conversation either way.
- **task_id** matters only while the remote waits for input: then it is in
  the pause's checkpoint (``AgentResponse.checkpoint``, kept with the pause
  in the session store), and the answering turn continues that task, on
  whichever worker runs it. A finished task is never continued: the next
  turn is a new task in the same context.

The stream: artifact text is the answer, streamed as deltas (a new
artifact starts a new paragraph; data parts as JSON text); a final status
message is the answer when no artifact said anything; working-status
messages are progress, kept in the result's ``a2a.progress``. INPUT_REQUIRED
(or AUTH_REQUIRED) ends the turn with a question whose answer goes back on
the same task. A cancelled turn cancels the remote task (CancelTask). A
remote that fails, refuses, times out or cannot be reached ends the turn
with a clean ``RUN_ERROR`` (``remote_*`` codes); its own words stay in the
worker's log, except a refusal's reason, which is meant for the user.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, cast

from a2a.types.a2a_pb2 import (
    Artifact,
    CancelTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    TaskState,
    TaskStatus,
)
from google.protobuf import json_format, struct_pb2

from turnmesh.agent._contract import (
    AgentError,
    AgentRequest,
    AgentResponse,
    EventEmitter,
    Interrupt,
)
from turnmesh.agent._prompt import file_context
from turnmesh.agent.a2a_link import Link, remote_error
from turnmesh.agent.a2a_settings import RemoteSettings

__all__ = ["A2AAgent", "context_for", "history_transcript", "remote_knows"]

log = logging.getLogger(__name__)

# The checkpoint's layout; a checkpoint of another version is not resumed.
_FORMAT = "turnmesh-a2a-1"
# Session ids map to context ids in this namespace (a fixed, random UUID).
_NAMESPACE = uuid.UUID("1b7c3a52-0d4e-4c55-9a8f-5d0c6f0e2a41")
# Bounds: the answer a remote may stream in one turn, one delta, the
# transcript sent for a history the remote has not seen, what the result
# keeps of progress and file parts, and a question's text.
MAX_ANSWER_CHARS = 8_000_000
MAX_DELTA_CHARS = 64 * 1024
MAX_TRANSCRIPT_CHARS = 200_000
MAX_PROGRESS = 16
MAX_NOTE_CHARS = 1000
MAX_QUESTION_CHARS = 8000
MAX_QUESTION_DATA_BYTES = 32 * 1024

_WAITING = {
    TaskState.TASK_STATE_INPUT_REQUIRED: "question",
    TaskState.TASK_STATE_AUTH_REQUIRED: "auth_required",
}


def context_for(session_id: str) -> str:
    """The remote context of a session: the same on every worker, and
    naming neither the session nor its principal."""
    return str(uuid.uuid5(_NAMESPACE, session_id))


def remote_knows(history: list[dict[str, Any]], context_id: str) -> bool:
    """Whether a turn of this session already ran in ``context_id`` (so the
    remote holds the conversation): a final assistant message marks it."""
    for message in reversed(history):
        metadata = message.get("metadata")
        if message.get("role") == "assistant" and isinstance(metadata, dict):
            a2a = metadata.get("a2a")
            if isinstance(a2a, dict) and a2a.get("context_id") == context_id:
                return True
    return False


def history_transcript(history: list[dict[str, Any]], limit: int = MAX_TRANSCRIPT_CHARS) -> str:
    """The conversation so far as text (the latest part of it, within
    ``limit`` characters), for a remote that has not seen it."""
    lines: list[str] = []
    size = 0
    for message in reversed(history):
        content = str(message.get("content") or "").strip()
        if not content:
            continue
        line = f"{message.get('role', 'user')}: {content}"
        if size + len(line) > limit:
            lines.append("[earlier messages left out]")
            break
        lines.append(line)
        size += len(line) + 1
    if not lines:
        return ""
    return "The conversation so far:\n" + "\n".join(reversed(lines))


def _note(text: str) -> str:
    """The remote's words, bounded and on one line, for a log or a result."""
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_NOTE_CHARS else flat[: MAX_NOTE_CHARS - 1] + "…"


def _json(value: struct_pb2.Value) -> Any:
    """A data part as the JSON the remote sent: protobuf holds every number
    as a double, so 1 comes back 1.0 unless made whole again."""

    def plain(item: Any) -> Any:
        if isinstance(item, float) and item.is_integer() and abs(item) < 2**53:
            return int(item)
        if isinstance(item, list):
            return [plain(x) for x in item]
        if isinstance(item, dict):
            return {k: plain(v) for k, v in item.items()}
        return item

    return plain(json_format.MessageToDict(value))


def _text(parts: Any) -> str:
    return "".join(part.text for part in parts if part.WhichOneof("content") == "text")


def _checkpoint(task_id: str, context_id: str) -> bytes:
    return json.dumps({"format": _FORMAT, "task_id": task_id, "context_id": context_id}).encode()


def _resumed(checkpoint: bytes) -> tuple[str, str]:
    """(task_id, context_id) of the task the pause waits on."""
    try:
        saved = json.loads(checkpoint)
        if saved.get("format") == _FORMAT and saved["task_id"] and saved["context_id"]:
            return str(saved["task_id"]), str(saved["context_id"])
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    raise AgentError(
        "Cannot answer the remote agent",
        "the paused turn left no remote task to answer",
        code="no_checkpoint",
        status=409,
    )


def _answer_part(payload: Any) -> Part | None:
    """The client's answer as the remote reads it: text, or JSON data."""
    if payload is None:
        return None
    if isinstance(payload, str):
        return Part(text=payload)
    value = struct_pb2.Value()
    json_format.ParseDict(payload, value)
    return Part(data=value)


@dataclass
class _Stream:
    """One exchange with the remote, as the events it becomes."""

    emitter: EventEmitter
    task_id: str = ""
    context_id: str = ""
    state: int = TaskState.TASK_STATE_UNSPECIFIED
    ended: bool = False
    answered: int = 0  # characters of answer streamed
    artifact: str | None = None  # the artifact the last text was in
    seen: set[str] = field(default_factory=set)
    progress: list[str] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)
    question: Interrupt | None = None

    async def take(self, event: StreamResponse) -> None:
        kind = event.WhichOneof("payload")
        if kind == "message":  # a stateless answer: the whole turn
            self._ids(event.message.task_id, event.message.context_id)
            await self._say(event.message.parts)
            self.ended = True
        elif kind == "task":
            self._ids(event.task.id, event.task.context_id)
            for artifact in event.task.artifacts:
                if artifact.artifact_id not in self.seen:
                    await self._artifact(artifact)
            await self._status(event.task.status)
        elif kind == "artifact_update":
            chunk = event.artifact_update
            self._ids(chunk.task_id, chunk.context_id)
            await self._artifact(chunk.artifact)
        elif kind == "status_update":
            update = event.status_update
            self._ids(update.task_id, update.context_id)
            await self._status(update.status)

    def _ids(self, task_id: str, context_id: str) -> None:
        self.task_id = task_id or self.task_id
        self.context_id = context_id or self.context_id

    async def _artifact(self, artifact: Artifact) -> None:
        if self.artifact is not None and artifact.artifact_id != self.artifact and self.answered:
            await self._delta("\n\n")  # another artifact: another paragraph
        self.artifact = artifact.artifact_id
        self.seen.add(artifact.artifact_id)
        await self._say(artifact.parts)

    async def _say(self, parts: Any) -> None:
        for part in parts:
            content = part.WhichOneof("content")
            if content == "text":
                await self._delta(part.text)
            elif content == "data":
                data = json.dumps(_json(part.data), ensure_ascii=False, separators=(",", ":"))
                await self._delta(data)
            elif content in ("raw", "url") and len(self.files) < MAX_PROGRESS:
                entry: dict[str, Any] = {"filename": part.filename, "media_type": part.media_type}
                if content == "url" and len(part.url) <= MAX_NOTE_CHARS:
                    entry["url"] = part.url
                else:
                    entry["bytes"] = len(part.raw)
                self.files.append(entry)

    async def _delta(self, text: str) -> None:
        self.answered += len(text)
        if self.answered > MAX_ANSWER_CHARS:
            raise AgentError(
                "Remote answer too long",
                f"the remote A2A agent said more than {MAX_ANSWER_CHARS} characters in one turn",
                code="remote_too_long",
            )
        for start in range(0, len(text), MAX_DELTA_CHARS):
            await self.emitter.emit_delta(text[start : start + MAX_DELTA_CHARS])

    async def _status(self, status: TaskStatus) -> None:
        state = status.state
        if state == TaskState.TASK_STATE_UNSPECIFIED:
            return
        self.state = state
        said = _text(status.message.parts)
        if state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING):
            if said and len(self.progress) < MAX_PROGRESS:
                self.progress.append(_note(said))
            return
        self.ended = True
        if state == TaskState.TASK_STATE_COMPLETED:
            if not self.answered:  # the status message is the answer
                await self._say(status.message.parts)
        elif state in _WAITING:
            await self._ask(_WAITING[state], status.message)
        elif state == TaskState.TASK_STATE_REJECTED:
            raise AgentError(
                "Remote agent refused the task",
                _note(said) or "the remote A2A agent refused the task",
                code="remote_rejected",
                status=422,
            )
        else:
            if said:
                log.warning("remote task %s ended %s: %s", self.task_id, state, _note(said))
            cancelled = state == TaskState.TASK_STATE_CANCELED
            raise AgentError(
                "Remote agent cancelled the task" if cancelled else "Remote agent failed",
                "the remote A2A agent's task ended "
                + ("cancelled by the remote" if cancelled else "failed"),
                code="remote_cancelled" if cancelled else "remote_failed",
            )

    async def _ask(self, reason: str, message: Message) -> None:
        said = _text(message.parts)
        await self._say([part for part in message.parts if part.WhichOneof("content") == "text"])
        metadata: dict[str, Any] = {"a2a_state": TaskState.Name(self.state)}
        data = [_json(part.data) for part in message.parts if part.WhichOneof("content") == "data"]
        if data and len(json.dumps(data)) <= MAX_QUESTION_DATA_BYTES:
            metadata["data"] = data
        question = said if len(said) <= MAX_QUESTION_CHARS else said[: MAX_QUESTION_CHARS - 1] + "…"
        self.question = Interrupt(reason=reason, message=question, metadata=metadata)

    def result(self) -> dict[str, Any]:
        """The turn's RUN_FINISHED.result: the mark of the context it ran in."""
        a2a: dict[str, Any] = {
            "context_id": self.context_id,
            "task_id": self.task_id,
            "state": TaskState.Name(self.state) if self.state else "",
        }
        if self.progress:
            a2a["progress"] = self.progress
        if self.files:
            a2a["files"] = self.files
        return {"a2a": a2a}


class A2AAgent:
    """A remote A2A agent (``kind: a2a``; ``remote:`` in the agent file)."""

    def __init__(self, settings: RemoteSettings, *, name: str = "a2a") -> None:
        self.name = name
        self.settings = settings
        self.link = Link(settings)
        self._warned = False

    async def close(self) -> None:
        await self.link.close()

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        context_id = context_for(request.session_id)
        parts: list[Part] = []
        task_id = ""
        if request.resume:
            task_id, context_id = _resumed(request.checkpoint)
            answer = next((e for e in request.resume if e.status == "resolved"), None)
            if answer is None:  # cancelled or expired: so is the remote's task
                await self._cancel(task_id)
                task_id, context_id = "", context_for(request.session_id)
            elif (part := _answer_part(answer.payload)) is not None:
                parts.append(part)
        elif request.history and not remote_knows(request.history, context_id):
            if transcript := history_transcript(request.history):
                parts.append(Part(text=transcript, metadata=_struct({"turnmesh": "history"})))
        if request.messages:
            text = request.message
            if request.files and (files := file_context(request.files)):
                text = f"{text}\n\n{files}"
            parts.append(Part(text=text))
        stream = _Stream(emitter, task_id=task_id, context_id=context_id)
        if not parts:
            if task_id:  # an answer with nothing in it: still an answer
                parts.append(Part(data=struct_pb2.Value(null_value=struct_pb2.NULL_VALUE)))
            else:  # only cancelled answers: nothing to send
                return AgentResponse(metadata=stream.result())
        message = Message(
            message_id=uuid.uuid4().hex,
            role=Role.ROLE_USER,
            context_id=context_id,
            task_id=task_id,
            parts=parts,
        )
        await self._exchange(message, stream)
        if stream.context_id != context_for(request.session_id) and not self._warned:
            self._warned = True
            log.warning(
                "the remote A2A agent chose its own context id: each turn sends it the history"
            )
        response = AgentResponse(metadata=stream.result())
        if stream.question is not None:
            response.interrupts = [stream.question]
            response.checkpoint = _checkpoint(stream.task_id, stream.context_id)
        return response

    async def _exchange(self, message: Message, stream: _Stream) -> None:
        try:
            client = await self.link.client()
            # An async generator, typed as the iterator it is used as.
            events = cast(
                AsyncGenerator[StreamResponse, None],
                client.send_message(SendMessageRequest(message=message)),
            )
            async with contextlib.aclosing(events):
                while not stream.ended:
                    # Silence past the timeout fails the turn on every binding
                    # (httpx's read timeout covers only the HTTP ones).
                    async with asyncio.timeout(self.settings.timeout_seconds):
                        event = await anext(events, None)
                    if event is None:
                        break
                    await stream.take(event)
        except (asyncio.CancelledError, AgentError):
            # The turn ends here (cancelled, or an answer too long): so does
            # the remote's task, if it still runs.
            if stream.task_id and not stream.ended:
                await self._cancel(stream.task_id)
            raise
        except Exception as exc:
            error = remote_error(exc)
            if error is None:
                raise
            log.warning("the remote A2A agent failed: %s (%s)", error.title, type(exc).__name__)
            if stream.task_id and not stream.ended:  # a timeout: it may still run
                await self._cancel(stream.task_id)
            if error.code in ("remote_unreachable", "remote_card", "remote_not_allowed"):
                await self.link.forget()  # the next turn reads the card again
            raise error from exc
        if not stream.ended:
            if stream.task_id:
                await self._cancel(stream.task_id)
            raise AgentError(
                "Remote agent stopped answering",
                "the remote A2A agent's stream ended before its task did",
                code="remote_incomplete",
            )

    async def _cancel(self, task_id: str) -> None:
        """CancelTask on the remote, best effort and bounded: the turn ends
        either way."""
        try:
            client = await self.link.client()
            await asyncio.wait_for(
                client.cancel_task(CancelTaskRequest(id=task_id)),
                self.settings.cancel_timeout_seconds,
            )
        except Exception as exc:  # whatever went wrong, the turn ends as it would
            log.warning("cancelling remote task %s failed (%s)", task_id, type(exc).__name__)


def _struct(value: dict[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(value)
    return struct
