"""SendMessage and SendStreamingMessage: a message starts a task, a
background turn (StartTurn, ENQUEUE) on its context's session, so it has a
durable record and runs on whether or not its caller stays; the blocking
call and the stream follow its events (SubscribeTurn), from any server."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

from a2a.types import a2a_pb2

from turnmesh.runtime.errors import (
    AlreadyExists,
    NotFound,
    NotWaiting,
    TurnmeshError,
    UnsupportedOperation,
)
from turnmesh.server.compat._common import Mesh
from turnmesh.server.compat.a2a import answering, messages, records, stored
from turnmesh.server.compat.a2a.ids import parse_task_id
from turnmesh.server.compat.a2a.messages import Incoming, incoming, invalid_params, user_message
from turnmesh.server.compat.a2a.push import PushNotifications
from turnmesh.server.compat.a2a.task import TERMINAL, TaskView
from turnmesh.v1 import session_service_pb2 as spb

# Where a message's push config is, for its errors.
PUSH_CONFIG = "configuration.task_push_notification_config."


async def _made(mesh: Mesh, context_id: str | None, agent: str) -> tuple[str, bool, str]:
    session_id = await mesh.create_session(context_id, agent, param="tenant")
    # The tenant is its agent; without one, the mesh's default is.
    return session_id, True, agent or (await mesh.get_session(session_id)).agent_name


async def _context(mesh: Mesh, context_id: str, agent: str) -> tuple[str, bool, str]:
    """The session a message goes to, whether this call made it, and its
    agent: its context's (a client-chosen id is made on first use), or a new one."""
    if context_id:
        try:
            session = await mesh.get_session(context_id)
        except NotFound:
            try:
                return await _made(mesh, context_id, agent)
            except AlreadyExists:  # made meanwhile by another message
                session = await mesh.get_session(context_id)
        if agent and session.agent_name != agent:
            raise invalid_params("message.context_id", "is a context of another agent")
        return session.session_id, False, session.agent_name
    return await _made(mesh, None, agent)


async def _answer(mesh: Mesh, message: Incoming, agent: str) -> tuple[TaskView, spb.Turn]:
    """A message naming a task: the answer to its input if it waits for one
    (``answering``), its turn the task's next; refused otherwise, as A2A
    says (UnsupportedOperation: a task that ended or runs takes no message)."""
    session_id, first_turn = parse_task_id(message.task_id)
    found = await stored.read(mesh, session_id, first_turn, agent)
    record = found.record
    if message.context_id and message.context_id != record.context:
        raise invalid_params("message.context_id", "is not the task's context")
    state = a2a_pb2.TaskState.Name(found.state)
    if found.state in TERMINAL:
        raise UnsupportedOperation(
            f"task {message.task_id!r} is {state}: send the message without task_id to start "
            "a new task in its context"
        )
    if found.state != a2a_pb2.TASK_STATE_INPUT_REQUIRED or found.turn is None:
        raise UnsupportedOperation(
            f"task {message.task_id!r} is {state}: it waits for no input (it was given already)"
        )
    if len(record.turns) >= records.MAX_TURNS:
        raise UnsupportedOperation(
            f"task {message.task_id!r} has its maximum of {records.MAX_TURNS} turns:"
            " send the message without task_id to start a new task in its context"
        )
    given = answering.answers(message, found.turn.outcome)
    record.answering = time.time()
    if not record.created:  # a task of before records gets one now
        record.created = record.answering
    await records.put(mesh, session_id, record)
    try:
        turn = await mesh.start_turn(
            session_id,
            given.text,
            files=message.files,
            metadata=message.metadata,
            tools=message.tools,
            tool_results=given.tool_results,
            resume=given.resume,
            policy=spb.TURN_POLICY_ENQUEUE,
            idempotency_key=message.message_id,
        )
    except TurnmeshError as exc:
        record.answering = 0.0
        with contextlib.suppress(TurnmeshError):  # it lapses on its own
            await records.put(mesh, session_id, record)
        if isinstance(exc, NotWaiting):  # another answer came first
            raise UnsupportedOperation(
                f"task {message.task_id!r} waits for no input (it was given already)"
            ) from exc
        raise
    record.answering = 0.0
    if turn.turn_id not in record.turns:
        record.turns.append(turn.turn_id)
    await records.put(mesh, session_id, record)
    view = TaskView(session_id, turn.turn_id, record.id)
    if turn.state == spb.TURN_STATE_RUNNING:
        view.state = a2a_pb2.TASK_STATE_WORKING
    view.history.extend(messages.history(found.history, session_id, record.id, first_turn))
    view.history.append(user_message(message, session_id, view.id))
    return view, turn


async def open_task(
    mesh: Mesh, request: a2a_pb2.SendMessageRequest, agent: str, push: PushNotifications
) -> tuple[TaskView, spb.Turn]:
    """The message's task, started (or, naming a task that waits for input,
    continued): its view (with the message in its history) and its turn as
    accepted (with its push config, if it names one). A new task's record is
    written before it is returned, so any server finds it by its id."""
    message = incoming(request.message, request.metadata)
    configuration = request.configuration
    config: a2a_pb2.TaskPushNotificationConfig | None = None
    if configuration.HasField("task_push_notification_config"):
        push.check(configuration.task_push_notification_config, PUSH_CONFIG)
        config = a2a_pb2.TaskPushNotificationConfig()
        config.CopyFrom(configuration.task_push_notification_config)
    if message.task_id:
        if config is not None:
            # Refused before the answer is given, not after: it changes nothing.
            config.task_id = message.task_id
            await push.check_room(mesh, config, agent, PUSH_CONFIG)
        view, turn = await _answer(mesh, message, agent)
    else:
        view, turn = await _start(mesh, message, agent)
    if config is not None:
        # After its turn is accepted: a config set with an answer is told how
        # the answer's turn ends (at once, if it has ended already).
        config.task_id = view.id
        try:
            await push.create(mesh, config, agent, PUSH_CONFIG)
        except TurnmeshError as exc:
            if message.task_id:
                # Only a race (the task's configs filled meanwhile) or a store
                # that failed gets here: the answer stands, and the error says so.
                exc.detail = (
                    f"the answer was given, but its push notification config was not kept"
                    f" ({exc.detail}): set it with CreateTaskPushNotificationConfig"
                )
            raise
    return view, turn


async def _start(mesh: Mesh, message: Incoming, agent: str) -> tuple[TaskView, spb.Turn]:
    """A message naming no task: a new task, its record written first."""
    session_id, made, agent_name = await _context(mesh, message.context_id, agent)
    try:
        turn = await mesh.start_turn(
            session_id,
            message.text,
            files=message.files,
            metadata=message.metadata,
            tools=message.tools,
            # One task per message: never coalesced with another's turn.
            policy=spb.TURN_POLICY_ENQUEUE,
            idempotency_key=message.message_id,
        )
    except TurnmeshError as exc:
        if made:  # a refused message leaves nothing behind
            await mesh.drop_session(session_id, exc, seeded=0)
        raise
    view = TaskView(session_id, turn.turn_id)
    # A message sent again (its turn's record made already) keeps its record.
    if made or await records.get(mesh, session_id, view.id) is None:
        made_record = records.new(view.id, agent_name, session_id, turn.turn_id)
        await records.put(mesh, session_id, made_record)
    if turn.state == spb.TURN_STATE_RUNNING:
        view.state = a2a_pb2.TASK_STATE_WORKING
    view.history.append(user_message(message, session_id, view.id))
    return view, turn


async def send(
    mesh: Mesh, request: a2a_pb2.SendMessageRequest, agent: str, push: PushNotifications
) -> a2a_pb2.SendMessageResponse:
    view, turn = await open_task(mesh, request, agent, push)
    configuration = request.configuration
    if configuration.return_immediately:
        return a2a_pb2.SendMessageResponse(task=view.task())
    async with mesh.subscribe_turn(view.context_id, turn.turn_id) as events:
        async for event in events:
            view.feed(event)
    # As GetTask shows it from now on.
    history_length = (
        configuration.history_length if configuration.HasField("history_length") else None
    )
    session_id, first_turn = parse_task_id(view.id)
    task = await stored.task(mesh, session_id, first_turn, agent, history_length)
    if view.ended:
        # The turn's last event says how it ended; the session's pause may
        # land a moment after it, so a read now could still say COMPLETED.
        task.status.CopyFrom(view.status())
    return a2a_pb2.SendMessageResponse(task=task)


async def stream(
    mesh: Mesh, request: a2a_pb2.SendMessageRequest, agent: str, push: PushNotifications
) -> AsyncIterator[a2a_pb2.StreamResponse]:
    """The task as it starts, then its updates, ending with the status that
    ends it (or asks for input). A caller that leaves does not stop it."""
    view, turn = await open_task(mesh, request, agent, push)
    yield a2a_pb2.StreamResponse(task=view.task())
    async with mesh.subscribe_turn(view.context_id, turn.turn_id) as events:
        async for event in events:
            for response in view.feed(event):
                yield response
