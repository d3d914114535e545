"""The contract every session store keeps: the interface (``SessionStore``),
a session's record, the errors a store raises, the bounds it keeps, and
``TurnCommits`` (a commit's entry points over one ``_commit``).

Four backends keep it: ``memory``, ``sqlite`` (``sqlite:PATH``),
``redis`` (``redis://HOST:PORT/DB`` or ``redis+cluster://HOST:PORT``) and
``postgres`` (``postgresql://USER@HOST/DB``); ``open_store`` (the
package's) picks one from a URL. Redis and PostgreSQL are ``shared``: with
them a session can move between servers, and leases (``server.mesh.leases``)
say which one owns it; memory and SQLite belong to one server.

The contract every backend keeps: a turn is committed atomically (all of its
messages and its terminal event, or nothing), and committing costs the
same whatever the history's length. Durable backends also keep each turn's
events (``persists_events``), so a stream can be resumed after its server is
gone, and idempotency keys, so a retried turn never runs twice: both for the
event-log window, and at most ``IDEMPOTENCY_KEYS_PER_SESSION`` keys a
session. (The memory store keeps none: ``SessionTurns`` keeps a session's
newest ``MAX_IDEMPOTENCY_KEYS``.)

Every backend keeps turn records (``put_turn``): a background turn's state,
written when it is accepted and when it ends, kept longer than its events
(their own TTL), at most ``TURN_RECORDS_PER_SESSION`` per session, deleted
with the session. The first record that says a turn ended is final, so the
write that ends a turn happens once: where a later outbox (webhooks) hangs.

Every backend keeps A2A task records (``put_task``; ``stores.tasks``): an
A2A task's record, opaque bytes to the store, under its session and its
principal, listed newest first in keyset pages (by creation time and task
id), at most ``TASK_RECORDS_PER_SESSION`` a session and
``TASK_RECORDS_PER_PRINCIPAL`` a principal (the oldest go), kept as long
as their session and deleted with it.

Every backend keeps A2A tasks' push notification configs too
(``push_configs``: bounded per task and per session, deleted with the session).
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from turnmesh.runtime.errors import SessionQuotaExceeded
from turnmesh.server.stores.listing import Page, Position
from turnmesh.server.stores.push_configs import PushConfigs
from turnmesh.server.webhooks.outbox import Outbox
from turnmesh.v1 import event_pb2, message_pb2

# Turn records a session keeps at most; the oldest go first.
TURN_RECORDS_PER_SESSION = 1_000
# Idempotency keys a session keeps at most, each for the event-log window
# (``event_ttl_seconds``: a retry after it runs anew anyway, its events being
# gone); the oldest go first, trimmed as new ones are written. Likewise the
# index of a session's turns with stored events (Redis), which a delete reads.
IDEMPOTENCY_KEYS_PER_SESSION = 1_000
TURNS_INDEXED_PER_SESSION = 1_000
# A2A task records a session and a principal keep at most; the oldest go.
TASK_RECORDS_PER_SESSION = 1_000
TASK_RECORDS_PER_PRINCIPAL = 10_000


@dataclass(slots=True)
class SessionRecord:
    session_id: str
    agent_name: str
    created_at: float  # Unix seconds
    last_activity: float
    metadata: dict[str, Any] = field(default_factory=dict)
    message_count: int = 0
    # The lease token of the server that owns the session (shared stores only).
    owner: str = ""
    # What the session waits for from the client: a serialized
    # ``turnmesh.v1.Pause``, empty when it waits for nothing.
    pause: bytes = b""
    # Where its turns' ends are notified, unless a turn names its own.
    webhook_url: str = ""


class SessionStore(Protocol):
    @property
    def shared(self) -> bool:
        """Whether every server sees the sessions (so a session can move to
        another server, under a lease: ``server.mesh.leases``)."""

    async def open(self) -> None:
        """Connect, and bring data of an older layout up to date."""

    async def create(
        self,
        record: SessionRecord,
        messages: list[message_pb2.Message] | None = None,
        quota: int | None = None,
    ) -> None:
        """Add a session with an optional starting history, atomically;
        AlreadyExists if the id is taken; SessionQuotaExceeded if its
        principal holds ``quota`` sessions already (creates racing at the
        quota never pass it together)."""

    async def get(self, session_id: str) -> SessionRecord | None: ...

    async def delete(self, session_id: str) -> bool:
        """Remove a session and its history; False if it did not exist."""

    async def history(self, session_id: str, start: int = 0) -> list[message_pb2.Message]:
        """The session's messages from position ``start`` on; NotFound if none."""

    async def append_messages(
        self, session_id: str, messages: list[message_pb2.Message], now: float
    ) -> None:
        """Append one turn's messages atomically; NotFound if the session is gone."""

    async def commit_turn(
        self,
        session_id: str,
        messages: list[message_pb2.Message],
        final_event: event_pb2.Event,
        now: float,
        fence: str = "",
        pause: bytes = b"",
        checkpoint: bytes = b"",
    ) -> None:
        """Append a finished turn's messages and its RUN_FINISHED event, and
        set what the session waits for (``pause``; empty: nothing) and the
        agent's checkpoint for it (``checkpoint``), in one atomic step;
        NotFound if the session is gone; TurnAbandoned (nothing written) if
        another server gave the turn up for lost and re-ran it, or if
        ``fence`` (the owner token the turn started under) is no longer the
        session's owner.

        The checkpoint (up to 16 MiB) is kept apart from the record, which
        every call on the session and every listing reads: only the turn
        that answers the pause reads it (``checkpoint``)."""

    async def set_pause(self, session_id: str, pause: bytes, now: float, fence: str = "") -> None:
        """Set what the session waits for (a cancelled pause, say; its
        checkpoint stays); NotFound and TurnAbandoned (a fenced-off owner) as
        ``commit_turn``."""

    async def checkpoint(self, session_id: str) -> bytes:
        """The agent's checkpoint for the session's pause, b"" if none."""

    async def abandon_turn(self, session_id: str, turn_id: str) -> bool:
        """Make sure the turn never commits (its owner vanished, so a retry
        will run it again): True if so, False if it has committed already.
        Atomic against ``commit_turn``: exactly one of the two wins."""

    async def touch(self, session_id: str, now: float) -> None: ...

    async def idle_sessions(self, last_activity_before: float) -> list[str]: ...

    async def count(self) -> int: ...

    async def list_sessions(
        self, principal: str, before: Position | None, limit: int
    ) -> Page[SessionRecord]:
        """The principal's sessions positioned below ``before`` (all if None),
        newest first, at most ``limit`` (``stores.listing``)."""

    async def count_of(self, principal: str) -> int:
        """The sessions the principal holds (the whole mesh's in a shared store)."""

    @property
    def persists_events(self) -> bool:
        """Whether turn events and idempotency keys outlive this process."""

    async def append_events(
        self, session_id: str, turn_id: str, events: list[event_pb2.Event]
    ) -> None: ...

    async def read_events(self, session_id: str, turn_id: str) -> list[event_pb2.Event] | None:
        """A turn's stored events in order; None if the turn is unknown."""

    async def get_key(self, session_id: str, key: str) -> str | None:
        """The turn an idempotency key was used for, within the event-log
        window (None after it)."""

    async def set_key(self, session_id: str, key: str, turn_id: str) -> None:
        """Remember the key's turn; past ``IDEMPOTENCY_KEYS_PER_SESSION`` of
        the session's, or past the window, the oldest go."""

    async def put_turn(
        self, session_id: str, turn_id: str, record: bytes, *, ended: bool, ttl_seconds: float
    ) -> bool:
        """Write a turn's record (a serialized ``turnmesh.v1.Turn``), kept
        ``ttl_seconds`` after this write, unless the session is gone or the
        record already says the turn ended (``ended``): that one is final.
        True if written. Past ``TURN_RECORDS_PER_SESSION`` records the
        session's oldest go."""

    async def get_turn(self, session_id: str, turn_id: str) -> bytes | None:
        """A turn's record, None if there is none (or it expired)."""

    async def open_turns(
        self, limit: int, cursor: int = 0
    ) -> tuple[list[tuple[str, str]], int | None]:
        """A page of turn records that do not say their turn ended, oldest
        first (turns running, or lost with the server that ran them:
        ``RecordedTurns.settle_open``): (session, turn) of at most
        ``limit`` from position ``cursor`` (0: the first page), and the next
        page's position (None: this was the last). A position, not a
        bookmark: records that end meanwhile may shift a later page, never
        hide an open one for good (the next pass starts again at 0)."""

    async def put_task(
        self, session_id: str, task_id: str, record: bytes, created_at: float
    ) -> bool:
        """Write an A2A task's record (a new one, or over its last), unless
        the session is gone (False). A new one is listed at ``created_at``;
        past the bounds the session's or principal's oldest records go.
        A task id holds no ``|``."""

    async def get_task(self, session_id: str, task_id: str) -> bytes | None:
        """An A2A task's record; None if there is none."""

    async def list_tasks(
        self, principal: str, before: Position | None, limit: int
    ) -> Page[tuple[str, bytes]]:
        """The principal's task records positioned below ``before`` (all if
        None), newest first (position: creation nanoseconds, task id), at
        most ``limit``: each as (session, record)."""

    def outbox(self) -> Outbox:
        """Where webhook notices wait to be delivered (as durable as the sessions)."""

    def push_configs(self) -> PushConfigs:
        """A2A tasks' push notification configs (``push_configs``), deleted
        with their session."""

    async def close(self) -> None: ...


def session_quota_exceeded(quota: int) -> SessionQuotaExceeded:
    return SessionQuotaExceeded(
        f"this caller holds its maximum of {quota} sessions; delete one first"
    )


class StoreInUse(RuntimeError):
    """The store belongs to another server (a SQLite file is one server's)."""


class TurnAbandoned(Exception):
    """The turn was given up for lost and re-run elsewhere: its result is void."""


class TurnCommits(abc.ABC):
    """``append_messages`` and ``commit_turn`` for a backend whose ``_commit``
    does both (the final event is optional)."""

    @abc.abstractmethod
    async def _commit(
        self,
        session_id: str,
        messages: list[message_pb2.Message],
        final_event: event_pb2.Event | None,
        now: float,
        fence: str = "",
        pause: bytes | None = None,
        checkpoint: bytes | None = None,
    ) -> None:
        """``pause``: what the session waits for now (empty: nothing), or
        None to leave it as it is; ``checkpoint`` the same for the agent's
        checkpoint of it."""

    async def append_messages(
        self, session_id: str, messages: list[message_pb2.Message], now: float
    ) -> None:
        await self._commit(session_id, messages, None, now)

    async def commit_turn(
        self,
        session_id: str,
        messages: list[message_pb2.Message],
        final_event: event_pb2.Event,
        now: float,
        fence: str = "",
        pause: bytes = b"",
        checkpoint: bytes = b"",
    ) -> None:
        await self._commit(session_id, messages, final_event, now, fence, pause, checkpoint)

    async def set_pause(self, session_id: str, pause: bytes, now: float, fence: str = "") -> None:
        await self._commit(session_id, [], None, now, fence, pause)

    @abc.abstractmethod
    async def abandon_turn(self, session_id: str, turn_id: str) -> bool: ...


def now() -> float:
    return time.time()
