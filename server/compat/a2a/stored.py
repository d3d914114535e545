"""Tasks read back (GetTask), cancelled (CancelTask) and followed again
(SubscribeToTask), from their id alone: its turn's durable record (every
A2A task is a background turn), its session's pause and the messages its
turn added to the history."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from a2a.types import a2a_pb2

from turnmesh.runtime.errors import (
    InvalidArgument,
    NotFound,
    TaskNotCancelable,
    UnsupportedOperation,
)
from turnmesh.server.compat._common import Mesh
from turnmesh.server.compat.a2a import messages
from turnmesh.server.compat.a2a.ids import not_found, parse_task_id, task_id
from turnmesh.server.compat.a2a.task import (
    TERMINAL,
    TaskView,
    answer,
    answer_artifact_id,
    state_of,
    status_message,
)
from turnmesh.v1 import session_service_pb2 as spb


async def _found(
    mesh: Mesh, session_id: str, turn_id: str, agent: str
) -> tuple[spb.Turn, spb.Session]:
    """The task's turn and session; TaskNotFound if either is not the
    caller's (another principal's session is not found either), or the
    task is another agent's."""
    missing = not_found(task_id(session_id, turn_id))
    try:
        turn = await mesh.get_turn(session_id, turn_id)
        session = await mesh.get_session(session_id)
    except (NotFound, InvalidArgument):
        raise missing from None
    if agent and session.agent_name != agent:
        raise missing
    return turn, session


def _task(
    turn: spb.Turn, session: spb.Session, history: list[a2a_pb2.Message], text: str
) -> a2a_pb2.Task:
    task = a2a_pb2.Task(
        id=task_id(turn.session_id, turn.turn_id), context_id=turn.session_id, history=history
    )
    state = state_of(turn, session)
    task.status.state = state
    when = next(
        (t for t in (turn.end_time, turn.start_time, turn.create_time) if t.seconds or t.nanos),
        None,
    )
    if when is not None:
        task.status.timestamp.CopyFrom(when)
    if (message := status_message(turn, state, task.context_id, task.id)) is not None:
        task.status.message.CopyFrom(message)
    if text:
        task.artifacts.add(
            artifact_id=answer_artifact_id(turn.turn_id),
            name="answer",
            parts=[a2a_pb2.Part(text=text)],
        )
    return task


async def task(
    mesh: Mesh, session_id: str, turn_id: str, agent: str, history_length: int | None
) -> a2a_pb2.Task:
    turn, session = await _found(mesh, session_id, turn_id, agent)
    turn_messages = []
    if turn.state == spb.TURN_STATE_FINISHED:
        # A finished turn's messages are in the history (committed with its end).
        turn_messages = [m for m in await mesh.history(session_id) if m.turn_id == turn_id]
    history = messages.history(
        turn_messages, session.session_id, task_id(session_id, turn_id), turn_id
    )
    if history_length is not None:
        history = history[len(history) - history_length :] if history_length > 0 else []
    return _task(turn, session, history, answer(turn_messages))


async def get(mesh: Mesh, request: a2a_pb2.GetTaskRequest, agent: str) -> a2a_pb2.Task:
    session_id, turn_id = parse_task_id(request.id)
    length = request.history_length if request.HasField("history_length") else None
    if length is not None and length < 0:
        raise messages.invalid_params("history_length", "must not be negative")
    return await task(mesh, session_id, turn_id, agent, length)


async def cancel(mesh: Mesh, request: a2a_pb2.CancelTaskRequest, agent: str) -> a2a_pb2.Task:
    """Cancel a task that is submitted, working or waiting for input (its
    pause); one that ended is TaskNotCancelable."""
    session_id, turn_id = parse_task_id(request.id)
    turn, session = await _found(mesh, session_id, turn_id, agent)
    state = state_of(turn, session)
    if state in TERMINAL:
        raise TaskNotCancelable(f"task {request.id!r} is {a2a_pb2.TaskState.Name(state)}")
    cancelled = False
    with contextlib.suppress(NotFound):  # it ended meanwhile
        after = await mesh.cancel_turn(session_id, turn_id)
        # A waiting task's turn finished; cancelling cancels its pause.
        cancelled = after == spb.TURN_STATE_CANCELLED or (
            state == a2a_pb2.TASK_STATE_INPUT_REQUIRED and after == spb.TURN_STATE_FINISHED
        )
    found = await task(mesh, session_id, turn_id, agent, history_length=None)
    if cancelled and (
        found.status.state not in TERMINAL or state == a2a_pb2.TASK_STATE_INPUT_REQUIRED
    ):
        found.status.state = a2a_pb2.TASK_STATE_CANCELED  # its end is on its way
        found.status.ClearField("message")
    return found


async def subscribe(
    mesh: Mesh, request: a2a_pb2.SubscribeToTaskRequest, agent: str
) -> AsyncIterator[a2a_pb2.StreamResponse]:
    """The task as it stands (with the answer so far), then its updates to
    its end, from the turn's event log. A task that ended has nothing more
    to stream: UnsupportedOperation, as the spec says; one that waits for
    input is sent as it stands."""
    session_id, turn_id = parse_task_id(request.id)
    turn, session = await _found(mesh, session_id, turn_id, agent)
    state = state_of(turn, session)
    if state in TERMINAL:
        raise UnsupportedOperation(
            f"task {request.id!r} is {a2a_pb2.TaskState.Name(state)}: it has nothing more to stream"
        )
    if state == a2a_pb2.TASK_STATE_INPUT_REQUIRED:
        yield a2a_pb2.StreamResponse(task=await task(mesh, session_id, turn_id, agent, None))
        return
    view = TaskView(session_id, turn_id)
    view.state = state
    # Events up to the turn's last one when it was read rebuild the task as it
    # stood; it is sent once they are in, and every later event as an update.
    caught_up = turn.last_seq
    if caught_up == 0:
        yield a2a_pb2.StreamResponse(task=view.task())
    async with mesh.subscribe_turn(session_id, turn_id) as events:
        async for event in events:
            updates = view.feed(event)
            if event.seq < caught_up:
                continue
            if event.seq == caught_up:
                yield a2a_pb2.StreamResponse(task=view.task())
                continue
            for update in updates:
                yield update
