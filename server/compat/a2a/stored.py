"""Tasks read back (GetTask), cancelled (CancelTask) and followed again
(SubscribeToTask), from their id alone: the task's record (``records``: its
chain of turns), its latest turn's durable record, its session's pause and
the messages its turns added to the history.

A task's state is its latest turn's (``task.state_of``), made to stay true:
cancelled while it waited for input, it is CANCELED; a pause that ended
without an answer on the task (it expired, or another API answered or
cancelled it) leaves it FAILED; and the first read that sees it end keeps
that status in its record, which every later read shows.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from a2a.types import a2a_pb2
from google.protobuf import timestamp_pb2

from turnmesh.runtime.errors import (
    InvalidArgument,
    NotFound,
    TaskNotCancelable,
    TurnmeshError,
    UnsupportedOperation,
)
from turnmesh.server.compat._common import Mesh
from turnmesh.server.compat.a2a import messages, records
from turnmesh.server.compat.a2a.ids import not_found, parse_task_id, task_id
from turnmesh.server.compat.a2a.task import (
    TERMINAL,
    TaskView,
    agent_message,
    answer,
    answer_artifact_id,
    state_of,
    status_message,
    waits,
)
from turnmesh.v1 import message_pb2
from turnmesh.v1 import session_service_pb2 as spb

S = a2a_pb2.TaskState
UNANSWERED = (
    "the task's input was not given on it before its pause ended (it expired, or was"
    " answered or cancelled on another API)"
)
# An answer being started that long ago (its server stopped midway) no
# longer makes its task read as working.
ANSWERING_SECONDS = 60.0


@dataclass
class Read:
    """A task as a read finds it."""

    record: records.TaskRecord
    session: spb.Session
    turn: spb.Turn | None  # its latest; None once its record holds its end
    state: a2a_pb2.TaskState
    history: list[message_pb2.Message]


async def read(mesh: Mesh, session_id: str, first_turn: str, agent: str) -> Read:
    """The task; TaskNotFound if it is not the caller's (another principal's
    session is not found either), or it is another agent's."""
    shown = task_id(session_id, first_turn)
    missing = not_found(shown)
    try:
        # The history before the session: a turn's messages and its pause are
        # committed together, so messages of a waiting turn without its pause
        # mean the pause ended (never that it is still to land). Read first,
        # it also finds another principal's session (or none) not found before
        # the task record is asked of an owner the session does not have.
        committed = await mesh.history(session_id)
        record = await records.get(mesh, session_id, shown)
        session = await mesh.get_session(session_id)
    except (NotFound, InvalidArgument):
        raise missing from None
    if agent and session.agent_name != agent:
        raise missing
    if record is None:  # a task of before records: one turn
        record = records.TaskRecord(shown, session.agent_name, session_id, [first_turn], 0.0)
    chain = set(record.turns)
    history = [m for m in committed if m.turn_id in chain]
    if record.final:
        return Read(record, session, None, record.final["state"], history)
    try:
        turn = await mesh.get_turn(session_id, record.latest)
    except (NotFound, InvalidArgument):
        raise missing from None
    state = state_of(turn, session)
    if record.ended == records.CANCELLED:
        state = S.TASK_STATE_CANCELED
    elif state == S.TASK_STATE_COMPLETED and waits(turn.outcome):
        if time.time() - record.answering < ANSWERING_SECONDS:
            state = S.TASK_STATE_WORKING  # its answer's turn is being started
        elif session.running_turn_id == turn.turn_id or not any(
            m.turn_id == turn.turn_id for m in history
        ):
            # Its pause lands with its messages, a moment after its last
            # event, and shows once the turn lets its session go.
            state = S.TASK_STATE_INPUT_REQUIRED
        else:
            state = S.TASK_STATE_FAILED
    elif state == S.TASK_STATE_COMPLETED and not any(m.turn_id == turn.turn_id for m in history):
        # It finished after the history was read (a turn's messages are
        # committed before it reads finished): read again for its answer.
        history = [m for m in await _committed(mesh, session_id, missing) if m.turn_id in chain]
    found = Read(record, session, turn, state, history)
    if state in TERMINAL and record.created:
        await _keep_end(mesh, found)
    return found


async def _committed(
    mesh: Mesh, session_id: str, missing: TurnmeshError
) -> list[message_pb2.Message]:
    try:
        return await mesh.history(session_id)
    except (NotFound, InvalidArgument):
        raise missing from None


async def _keep_end(mesh: Mesh, found: Read) -> None:
    """Keep the status the task ended with in its record: later reads show
    it as it was, after its turns' records and its session's pause are gone."""
    ended = status(found)
    text = "".join(p.text for p in ended.message.parts)
    found.record.final = {"state": ended.state, "time": ended.timestamp.ToJsonString()}
    if text:
        found.record.final["text"] = text
    # Only kept for later: a read never fails for it (its session may have
    # gone meanwhile, or its owner be away; the next read keeps it).
    with contextlib.suppress(TurnmeshError):
        await records.put(mesh, found.record.context, found.record)


def kept_status(record: records.TaskRecord) -> a2a_pb2.TaskStatus:
    """The status a task's record keeps of its end."""
    status = a2a_pb2.TaskStatus(state=record.final["state"])
    status.timestamp.FromJsonString(record.final["time"])
    if text := record.final.get("text"):
        status.message.CopyFrom(agent_message(record.context, record.id, "status", text))
    return status


def status(found: Read) -> a2a_pb2.TaskStatus:
    record, turn, state = found.record, found.turn, found.state
    status = a2a_pb2.TaskStatus(state=state)
    if turn is None:
        return kept_status(record)
    when = next(
        (t for t in (turn.end_time, turn.start_time, turn.create_time) if t.seconds or t.nanos),
        None,
    )
    status.timestamp.CopyFrom(when or _now())
    if record.ended == records.CANCELLED:
        return status
    message: a2a_pb2.Message | None = (
        agent_message(record.context, record.id, "status", UNANSWERED)
        if state == S.TASK_STATE_FAILED and turn.state == spb.TURN_STATE_FINISHED
        else status_message(turn, state, record.context, record.id)
    )
    if message is not None:
        status.message.CopyFrom(message)
    return status


def _now() -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.GetCurrentTime()
    return stamp


def as_task(found: Read, history_length: int | None) -> a2a_pb2.Task:
    record = found.record
    task = a2a_pb2.Task(id=record.id, context_id=record.context)
    task.status.CopyFrom(status(found))
    history = messages.history(found.history, record.context, record.id, record.turns[0])
    if history_length is not None:
        history = history[len(history) - history_length :] if history_length > 0 else []
    task.history.extend(history)
    for turn_id in record.turns:
        text = answer(m for m in found.history if m.turn_id == turn_id)
        if text:
            task.artifacts.add(
                artifact_id=answer_artifact_id(turn_id),
                name="answer",
                parts=[a2a_pb2.Part(text=text)],
            )
    return task


async def task(
    mesh: Mesh, session_id: str, turn_id: str, agent: str, history_length: int | None
) -> a2a_pb2.Task:
    return as_task(await read(mesh, session_id, turn_id, agent), history_length)


def _history_length(request: a2a_pb2.GetTaskRequest) -> int | None:
    length = request.history_length if request.HasField("history_length") else None
    if length is not None and length < 0:
        raise messages.invalid_params("history_length", "must not be negative")
    return length


async def get(mesh: Mesh, request: a2a_pb2.GetTaskRequest, agent: str) -> a2a_pb2.Task:
    session_id, turn_id = parse_task_id(request.id)
    return await task(mesh, session_id, turn_id, agent, _history_length(request))


async def cancel(mesh: Mesh, request: a2a_pb2.CancelTaskRequest, agent: str) -> a2a_pb2.Task:
    """Cancel a task that is submitted, working or waiting for input (its
    pause: the record says so first, so every server reads it CANCELED from
    then on); one that ended is TaskNotCancelable."""
    session_id, first_turn = parse_task_id(request.id)
    found = await read(mesh, session_id, first_turn, agent)
    state = found.state
    if state in TERMINAL:
        raise TaskNotCancelable(f"task {request.id!r} is {a2a_pb2.TaskState.Name(state)}")
    waiting = state == S.TASK_STATE_INPUT_REQUIRED
    if waiting:
        found.record.ended = records.CANCELLED
        if not found.record.created:
            found.record.created = time.time()
        await records.put(mesh, session_id, found.record)
    cancelled = False
    with contextlib.suppress(NotFound):  # it ended meanwhile
        after = await mesh.cancel_turn(session_id, found.record.latest)
        # A waiting task's turn finished; cancelling cancels its pause.
        cancelled = after == spb.TURN_STATE_CANCELLED or waiting
    task = as_task(await read(mesh, session_id, first_turn, agent), None)
    if cancelled and task.status.state not in TERMINAL:
        task.status.state = S.TASK_STATE_CANCELED  # its end is on its way
        task.status.ClearField("message")
    return task


async def subscribe(
    mesh: Mesh, request: a2a_pb2.SubscribeToTaskRequest, agent: str
) -> AsyncIterator[a2a_pb2.StreamResponse]:
    """The task as it stands (with the answer so far), then its updates to
    its end, from its latest turn's event log. A task that ended has nothing
    more to stream: UnsupportedOperation, as the spec says; one that waits
    for input is sent as it stands."""
    session_id, first_turn = parse_task_id(request.id)
    found = await read(mesh, session_id, first_turn, agent)
    state = found.state
    if state in TERMINAL:
        raise UnsupportedOperation(
            f"task {request.id!r} is {a2a_pb2.TaskState.Name(state)}: it has nothing more to stream"
        )
    if state == S.TASK_STATE_INPUT_REQUIRED or found.turn is None:
        yield a2a_pb2.StreamResponse(task=as_task(found, None))
        return
    turn = found.turn
    view = TaskView(session_id, turn.turn_id, found.record.id)
    view.state = state
    # Events up to the turn's last one when it was read rebuild the task as it
    # stood; it is sent once they are in, and every later event as an update.
    caught_up = turn.last_seq
    if caught_up == 0:
        yield a2a_pb2.StreamResponse(task=view.task())
    async with mesh.subscribe_turn(session_id, turn.turn_id) as events:
        async for event in events:
            updates = view.feed(event)
            if event.seq < caught_up:
                continue
            if event.seq == caught_up:
                yield a2a_pb2.StreamResponse(task=view.task())
                continue
            for update in updates:
                yield update
