"""A2A push notifications, on the webhook outbox: a task's configs kept in
the session store (``stores.push_configs``), and, each time its turn ends
(the write that ends a background turn's record: ``TurnRecords.on_end``), a
POST to each of them of a ``StreamResponse`` JSON holding the task as it
stands (status, and the answer artifact; no history), as the a2a-sdk's own
sender posts it, with ``X-A2A-Notification-Token`` and ``Authorization``
from the config beside the outbox's Standard Webhooks signature.

Pushed: INPUT_REQUIRED and the terminal states (COMPLETED, FAILED, CANCELED,
REJECTED), the changes a receiver acts on and the ones the mesh writes
durably. SUBMITTED and WORKING are not: the caller that set a config has the
task's state from its own answer already, and a push each would double the
outbox's writes per task. A config set on a task that has ended already (or
waits for input) gets that state at once, so one set while the task ends is
never missed; the outbox keeps each push once (its id names the task, turn,
state and config), so at most one of the two is sent.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

from a2a.types import a2a_pb2
from google.protobuf import json_format, message

from turnmesh.runtime import principals
from turnmesh.runtime.errors import (
    NotFound,
    PushNotificationNotSupported,
    TaskNotFound,
    Unavailable,
    UnsupportedOperation,
)
from turnmesh.server.compat._common import Mesh
from turnmesh.server.compat.a2a import push_configs, records, stored
from turnmesh.server.compat.a2a.ids import MAX_ECHOED_ID, parse_task_id, task_id
from turnmesh.server.compat.a2a.messages import invalid_params
from turnmesh.server.compat.a2a.task import (
    answer,
    answer_artifact_id,
    state_of,
    status_message,
)
from turnmesh.server.sessions import turn_records
from turnmesh.server.stores.base import SessionStore
from turnmesh.server.webhooks.outbox import MAX_NOTICE_BYTES, Delivery, OutboxUnavailable
from turnmesh.server.webhooks.sender import WebhookSender
from turnmesh.v1 import session_service_pb2 as spb

S = a2a_pb2.TaskState
NOT_SERVED = "push notifications are not served by this agent (its card says so)"
# The messages at the end of a history a task's answer is looked for in
# (its turn's are the last ones when it ends).
HISTORY_TAIL = 256
# What a push's body keeps below the outbox's bound (its answer is cut to fit).
MAX_PUSH_BYTES = MAX_NOTICE_BYTES - 1024


# A task's record a turn's end looks among for the chain holding the turn:
# the principal's newest (an answer goes to a task that just asked).
CHAIN_SCAN = 100


async def task_of_turn(store: SessionStore, session_id: str, turn_id: str) -> str:
    """The A2A task a turn of the session (its store id) belongs to: the task
    the turn began, or the one whose chain the turn continues (an answer
    given on the task); for pushes keyed by task. A turn of no task names
    the task it would have begun (which has no configs)."""
    first = task_id(principals.public_id(session_id), turn_id)
    if await store.get_task(session_id, first) is not None:
        return first
    page = await store.list_tasks(principals.principal_of(session_id), None, CHAIN_SCAN)
    for _, (session, data) in page.items:
        record = records.loaded(data) if session == session_id else None
        if record is not None and turn_id in record.turns:
            return record.id
    return first


def state_at_end(turn: spb.Turn) -> a2a_pb2.TaskState:
    """The task's state as its turn ended: a turn that ended waiting for
    the client is INPUT_REQUIRED (its own outcome says so, whatever the
    session's pause became since)."""
    if turn.state == spb.TURN_STATE_FINISHED:
        waits = turn.outcome.interrupts or turn.outcome.pending_tool_call_ids
        return S.TASK_STATE_INPUT_REQUIRED if waits else S.TASK_STATE_COMPLETED
    return state_of(turn, spb.Session())


class PushNotifications:
    """A2A push notification configs and their pushes."""

    def __init__(
        self,
        store: SessionStore,
        owns: Callable[[str], bool],
        webhooks: WebhookSender | None,
        ttl_seconds: float,
    ) -> None:
        self._store = store
        self._configs = store.push_configs()
        # Whether this server holds a session (a store of its own keeps only those).
        self._owns = owns
        self._webhooks = webhooks
        self._ttl = ttl_seconds

    @property
    def enabled(self) -> bool:
        """Served where webhooks are (their allow-list, outbox and secret)."""
        return self._webhooks is not None and self._webhooks.enabled

    # The RPCs -----------------------------------------------------------------

    async def create(
        self,
        mesh: Mesh,
        config: a2a_pb2.TaskPushNotificationConfig,
        agent: str,
        where: str = "",
    ) -> a2a_pb2.TaskPushNotificationConfig:
        """Keep a config for the caller's task (one with its id is
        replaced), and push the task's state to it at once if it has ended
        or waits for input."""
        self.check(config, where)
        session_id, turn_id = parse_task_id(config.task_id)
        await stored.task(mesh, session_id, turn_id, agent, history_length=0)
        scoped = self._scoped(session_id)
        kept = push_configs.stored(config, config.task_id, agent)
        written = await self._configs.put(
            scoped,
            config.task_id,
            kept.id,
            kept.SerializeToString(),
            limit=push_configs.MAX_CONFIGS_PER_TASK,
            ttl_seconds=self._ttl,
        )
        if not written:
            raise invalid_params(
                f"{where}id",
                f"task {config.task_id!r} has {push_configs.MAX_CONFIGS_PER_TASK} push"
                " notification configs already: delete one first",
            )
        # Read after the config is kept: a turn not ended by now has its end
        # (and its configs, this one with them) still to record.
        record = await records.get(mesh, session_id, config.task_id)
        turn = await mesh.get_turn(session_id, record.latest if record else turn_id)
        if turn_records.ended(turn):
            try:
                await self._push(scoped, config.task_id, turn, [kept])
            except OutboxUnavailable:
                # Kept, but its push not queued: the caller sets it again.
                raise Unavailable("the push could not be queued; set the config again") from None
        return push_configs.shown(kept)

    def check(self, config: a2a_pb2.TaskPushNotificationConfig, where: str = "") -> None:
        """The config as a client may set it (before anything is done with
        it): its fields, and its URL on the caller's webhook allow-list."""
        if self._webhooks is None or not self.enabled:
            raise not_served()
        push_configs.checked(config, where)
        self._webhooks.check(principals.current().name, config.url, f"{where}url")

    async def get(
        self, mesh: Mesh, request: a2a_pb2.GetTaskPushNotificationConfigRequest, agent: str
    ) -> a2a_pb2.TaskPushNotificationConfig:
        for config in await self._of_task(mesh, request.task_id, agent):
            if config.id == request.id:
                return push_configs.shown(config)
        shown = repr(request.id) if len(request.id) <= MAX_ECHOED_ID else "requested"
        raise TaskNotFound(
            f"push notification config {shown} of task {request.task_id!r} not found"
        )

    async def check_room(
        self, mesh: Mesh, config: a2a_pb2.TaskPushNotificationConfig, agent: str, where: str
    ) -> None:
        """Refuse a config its task has no room for (one with a kept id
        replaces it): for a config given with an answer, before the answer."""
        kept = await self._of_task(mesh, config.task_id, agent)
        wanted = config.id or config.task_id  # as kept (push_configs.stored)
        if len(kept) >= push_configs.MAX_CONFIGS_PER_TASK and all(c.id != wanted for c in kept):
            raise invalid_params(
                f"{where}id",
                f"task {config.task_id!r} has {push_configs.MAX_CONFIGS_PER_TASK} push"
                " notification configs already: delete one first",
            )

    async def list_configs(
        self, mesh: Mesh, request: a2a_pb2.ListTaskPushNotificationConfigsRequest, agent: str
    ) -> a2a_pb2.ListTaskPushNotificationConfigsResponse:
        if request.page_size < 0:
            raise invalid_params("page_size", "must not be negative")
        if request.page_token:
            # A task's few configs fit one page: no token is ever given out.
            raise invalid_params("page_token", "is not a token this server gave")
        configs = await self._of_task(mesh, request.task_id, agent)
        return a2a_pb2.ListTaskPushNotificationConfigsResponse(
            configs=[push_configs.shown(c) for c in configs]
        )

    async def delete(
        self, mesh: Mesh, request: a2a_pb2.DeleteTaskPushNotificationConfigRequest, agent: str
    ) -> None:
        """Remove one (none with its id: nothing to do, as a2a-sdk's stores do)."""
        await self._of_task(mesh, request.task_id, agent)
        session_id, _ = parse_task_id(request.task_id)
        await self._configs.delete(self._scoped(session_id), request.task_id, request.id)

    async def _of_task(
        self, mesh: Mesh, task: str, agent: str
    ) -> list[a2a_pb2.TaskPushNotificationConfig]:
        """The configs of a task of the caller's (TaskNotFound for any other)."""
        if not self.enabled:
            raise not_served()
        session_id, turn_id = parse_task_id(task)
        await stored.task(mesh, session_id, turn_id, agent, history_length=0)
        return _parsed(await self._configs.of_task(self._scoped(session_id), task))

    def _scoped(self, session_id: str) -> str:
        """The caller's session as the store knows it; UnsupportedOperation
        if this server's store does not hold it (a mesh of several servers,
        each with a store of its own)."""
        scoped = principals.scoped(principals.current().name, session_id)
        if not self._store.shared and not self._owns(scoped):
            raise UnsupportedOperation(
                "this task's context is held by another server of a mesh whose servers keep"
                " their own stores: push notification configs need a shared (Redis) store there"
            )
        return scoped

    # Pushes -------------------------------------------------------------------

    async def turn_ended(self, session_id: str, turn: spb.Turn) -> None:
        """A background turn's end, before its record says so: its task's
        push to each config, queued in the outbox (OutboxUnavailable or
        Unavailable: not queued, and the record stays open to be ended, and
        pushed, again)."""
        if not self.enabled:
            return
        task = await task_of_turn(self._store, session_id, turn.turn_id)
        configs = _parsed(await self._configs.of_task(session_id, task))
        if configs:
            await self._push(session_id, task, turn, configs)

    async def _push(
        self,
        session_id: str,
        task: str,
        turn: spb.Turn,
        configs: list[a2a_pb2.TaskPushNotificationConfig],
    ) -> None:
        assert self._webhooks is not None
        try:
            body = await self._body(session_id, task, turn)
        except NotFound:
            return  # the session is gone, and its configs with it
        state = S.Name(state_at_end(turn))
        for config in configs:
            key = f"{config.task_id}\n{turn.turn_id}\n{state}\n{config.id}"
            await self._webhooks.queue(
                Delivery(
                    f"a2a_{hashlib.sha256(key.encode()).hexdigest()[:40]}",
                    config.url,
                    body,
                    owner=principals.principal_of(session_id),
                    headers=push_configs.headers(config),
                ),
                f"a2a.{state}",
            )

    async def _body(self, session_id: str, task: str, turn: spb.Turn) -> bytes:
        """The push: ``{"task": ...}`` as the task stands at its turn's end,
        its answer cut to fit the outbox (``metadata.truncated``)."""
        text = ""
        if turn.state == spb.TURN_STATE_FINISHED:
            record = await self._store.get(session_id)
            if record is None:
                raise NotFound("session gone")
            tail = await self._store.history(
                session_id, max(0, record.message_count - HISTORY_TAIL)
            )
            text = answer(m for m in tail if m.turn_id == turn.turn_id)
        return task_body(principals.public_id(session_id), task, turn, text)


def task_body(context_id: str, task_id_: str, turn: spb.Turn, text: str) -> bytes:
    """A ``StreamResponse`` with the task as its turn ended, as JSON at most
    ``MAX_PUSH_BYTES`` (the answer cut to fit, then the status message)."""
    bounded, _ = turn_records.bounded(turn)
    state = state_at_end(turn)
    task = a2a_pb2.Task(id=task_id_, context_id=context_id)
    task.status.state = state
    if turn.HasField("end_time"):
        task.status.timestamp.CopyFrom(turn.end_time)
    if (said := status_message(bounded, state, context_id, task.id)) is not None:
        task.status.message.CopyFrom(said)
    cut = False
    for _ in range(4):
        task.ClearField("artifacts")
        if text:
            task.artifacts.add(
                artifact_id=answer_artifact_id(turn.turn_id),
                name="answer",
                parts=[a2a_pb2.Part(text=text)],
            )
        if cut:
            task.metadata["truncated"] = True
        body = _json(task)
        if len(body) <= MAX_PUSH_BYTES:
            return body
        # Each character cut is at least a byte of JSON less (the margin
        # covers the flag that says so): once is enough unless the status is
        # the larger part.
        over = len(body) - MAX_PUSH_BYTES
        text = text[: max(0, len(text) - over - 64)]
        cut = True
    task.ClearField("artifacts")
    task.status.ClearField("message")
    task.metadata["truncated"] = True
    return _json(task)


def _json(task: a2a_pb2.Task) -> bytes:
    # As the a2a-sdk's sender posts it: MessageToDict (camelCase), JSON.
    value = json_format.MessageToDict(a2a_pb2.StreamResponse(task=task))
    return json.dumps(value, separators=(",", ":")).encode()


def _parsed(kept: list[bytes]) -> list[a2a_pb2.TaskPushNotificationConfig]:
    out = []
    for data in kept:
        try:
            out.append(a2a_pb2.TaskPushNotificationConfig.FromString(data))
        except message.DecodeError:
            continue  # not one this mesh wrote: nothing to push to
    return out


def not_served() -> PushNotificationNotSupported:
    return PushNotificationNotSupported(NOT_SERVED)
