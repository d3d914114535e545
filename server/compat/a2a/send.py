"""SendMessage and SendStreamingMessage: a message starts a task, a
background turn (StartTurn, ENQUEUE) on its context's session, so it has a
durable record and runs on whether or not its caller stays; the blocking
call and the stream follow its events (SubscribeTurn), from any server."""

from __future__ import annotations

from collections.abc import AsyncIterator

from a2a.types import a2a_pb2

from turnmesh.runtime.errors import AlreadyExists, NotFound, TurnmeshError, UnsupportedOperation
from turnmesh.server.compat._common import Mesh
from turnmesh.server.compat.a2a import stored
from turnmesh.server.compat.a2a.ids import parse_task_id
from turnmesh.server.compat.a2a.messages import Incoming, incoming, invalid_params, user_message
from turnmesh.server.compat.a2a.push import PushNotifications
from turnmesh.server.compat.a2a.task import TaskView
from turnmesh.v1 import session_service_pb2 as spb

# Where a message's push config is, for its errors.
PUSH_CONFIG = "configuration.task_push_notification_config."


async def _context(mesh: Mesh, context_id: str, agent: str) -> tuple[str, bool]:
    """The session a message goes to, and whether this call made it: its
    context's (a client-chosen id is made on first use), or a new one."""
    if context_id:
        try:
            session = await mesh.get_session(context_id)
        except NotFound:
            try:
                return await mesh.create_session(context_id, agent, param="tenant"), True
            except AlreadyExists:  # made meanwhile by another message
                session = await mesh.get_session(context_id)
        if agent and session.agent_name != agent:
            raise invalid_params("message.context_id", "is a context of another agent")
        return session.session_id, False
    return await mesh.create_session(None, agent, param="tenant"), True


async def _refuse_task_message(mesh: Mesh, message: Incoming, agent: str) -> None:
    """A message naming a task: this mesh runs every message as a new task
    of its context, so one naming a task is refused as A2A says, by the
    task's state."""
    session_id, turn_id = parse_task_id(message.task_id)
    task = await stored.task(mesh, session_id, turn_id, agent, history_length=0)
    if message.context_id and message.context_id != task.context_id:
        raise invalid_params("message.context_id", "is not the task's context")
    state = a2a_pb2.TaskState.Name(task.status.state)
    if task.status.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED:
        raise UnsupportedOperation(
            f"task {message.task_id!r} waits for input ({state}), which this mesh does not "
            "take as an A2A message yet: answer it on the session's native or Responses API"
        )
    raise UnsupportedOperation(
        f"task {message.task_id!r} is {state}: send the message without task_id to start "
        "a new task in its context"
    )


async def open_task(
    mesh: Mesh, request: a2a_pb2.SendMessageRequest, agent: str, push: PushNotifications
) -> tuple[TaskView, spb.Turn]:
    """The message's task, started: its view (with the message in its
    history) and its turn as accepted (with its push config, if it names one)."""
    message = incoming(request.message, request.metadata)
    configuration = request.configuration
    if configuration.HasField("task_push_notification_config"):
        push.check(configuration.task_push_notification_config, PUSH_CONFIG)
    if message.task_id:
        await _refuse_task_message(mesh, message, agent)
    session_id, made = await _context(mesh, message.context_id, agent)
    try:
        turn = await mesh.start_turn(
            session_id,
            message.text,
            files=message.files,
            metadata=message.metadata,
            # One task per message: never coalesced with another's turn.
            policy=spb.TURN_POLICY_ENQUEUE,
            idempotency_key=message.message_id,
        )
    except TurnmeshError as exc:
        if made:  # a refused message leaves nothing behind
            await mesh.drop_session(session_id, exc, seeded=0)
        raise
    view = TaskView(session_id, turn.turn_id)
    if turn.state == spb.TURN_STATE_RUNNING:
        view.state = a2a_pb2.TASK_STATE_WORKING
    view.history.append(user_message(message, session_id, view.id))
    if configuration.HasField("task_push_notification_config"):
        config = a2a_pb2.TaskPushNotificationConfig()
        config.CopyFrom(configuration.task_push_notification_config)
        config.task_id = view.id
        await push.create(mesh, config, agent, PUSH_CONFIG)
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
    task = await stored.task(mesh, view.context_id, turn.turn_id, agent, history_length)
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
