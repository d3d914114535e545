"""Where sessions live: one interface, three backends.

``memory`` (this module), ``sqlite:PATH`` (``store_sqlite``) and
``redis://HOST:PORT/DB`` or ``redis+cluster://HOST:PORT`` (``store_redis``);
``open_store`` picks one from a URL. Only Redis is ``shared``: with it a
session can move between servers, and leases (``server.leases``) say which
one owns it; memory and SQLite belong to one server.

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
"""

from __future__ import annotations

import abc
import bisect
import copy
import dataclasses
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

from turnmesh.runtime.errors import AlreadyExists, NotFound, SessionQuotaExceeded
from turnmesh.runtime.principals import ANONYMOUS, principal_of, public_id
from turnmesh.server.stores.listing import Page, Position, position
from turnmesh.server.webhooks.outbox import MemoryOutbox, Outbox
from turnmesh.v1 import event_pb2, message_pb2

# Turn records a session keeps at most; the oldest go first.
TURN_RECORDS_PER_SESSION = 1_000
# Idempotency keys a session keeps at most, each for the event-log window
# (``event_ttl_seconds``: a retry after it runs anew anyway, its events being
# gone); the oldest go first, trimmed as new ones are written. Likewise the
# index of a session's turns with stored events (Redis), which a delete reads.
IDEMPOTENCY_KEYS_PER_SESSION = 1_000
TURNS_INDEXED_PER_SESSION = 1_000
# Turn records a memory store keeps at most (a few hundred bytes each, at
# most ``turn_records.MAX_TURN_BYTES``), and their bytes in all.
MAX_MEMORY_TURN_RECORDS = 10_000
MAX_MEMORY_TURN_RECORD_BYTES = 64 * 2**20


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
        another server, under a lease: ``server.leases``)."""

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
        newest first, at most ``limit`` (``server.listing``)."""

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
        ``SessionCore.settle_open_turns``): (session, turn) of at most
        ``limit`` from position ``cursor`` (0: the first page), and the next
        page's position (None: this was the last). A position, not a
        bookmark: records that end meanwhile may shift a later page, never
        hide an open one for good (the next pass starts again at 0)."""

    def outbox(self) -> Outbox:
        """Where webhook notices wait to be delivered (as durable as the sessions)."""

    async def close(self) -> None: ...


def session_quota_exceeded(quota: int) -> SessionQuotaExceeded:
    return SessionQuotaExceeded(
        f"this caller holds its maximum of {quota} sessions; delete one first"
    )


class StoreInUse(RuntimeError):
    """The store belongs to another server (a SQLite file is one server's)."""


class TurnAbandoned(Exception):
    """The turn was given up for lost and re-run elsewhere: its result is void."""


@dataclass(slots=True)
class _KeptTurn:
    record: bytes
    ended: bool
    expires: float


class MemoryStore:
    """Sessions in this process's memory: lost when it stops."""

    def __init__(
        self,
        *,
        max_turn_records: int = MAX_MEMORY_TURN_RECORDS,
        max_turn_record_bytes: int = MAX_MEMORY_TURN_RECORD_BYTES,
    ) -> None:
        self._records: dict[str, SessionRecord] = {}
        # The agents' checkpoints of the sessions' pauses (commit_turn).
        self._checkpoints: dict[str, bytes] = {}
        # Per principal: (position, scoped id), ascending, for listing.
        self._listed: dict[str, list[tuple[Position, str]]] = {}
        # Serialized: a few hundred bytes less per message than live protobuf
        # objects, and turns read only the tail they need.
        self._messages: dict[str, list[bytes]] = {}
        # Turn records, least recently written first (so the first to
        # expire), and each session's turn ids in the order they came.
        self._turn_records: OrderedDict[tuple[str, str], _KeptTurn] = OrderedDict()
        self._turns_of: dict[str, dict[str, None]] = {}
        self._max_turn_records = max_turn_records
        self._max_turn_record_bytes = max_turn_record_bytes
        self._turn_record_bytes = 0
        self._outbox = MemoryOutbox()  # lost with the process, as the sessions are

    @property
    def shared(self) -> bool:
        return False

    async def open(self) -> None:
        return None

    async def create(
        self,
        record: SessionRecord,
        messages: list[message_pb2.Message] | None = None,
        quota: int | None = None,
    ) -> None:
        if record.session_id in self._records:
            raise AlreadyExists(f"session {public_id(record.session_id)!r} already exists")
        if (
            quota is not None
            and len(self._listed.get(principal_of(record.session_id), [])) >= quota
        ):
            raise session_quota_exceeded(quota)
        initial = [m.SerializeToString() for m in messages or []]
        record.message_count = len(initial)
        self._records[record.session_id] = record
        self._messages[record.session_id] = initial
        entry = (position(record.created_at, record.session_id), record.session_id)
        bisect.insort(self._listed.setdefault(principal_of(record.session_id), []), entry)

    async def get(self, session_id: str) -> SessionRecord | None:
        record = self._records.get(session_id)
        if record is None:
            return None
        return dataclasses.replace(record, metadata=copy.deepcopy(record.metadata))

    async def delete(self, session_id: str) -> bool:
        self._messages.pop(session_id, None)
        for turn_id in self._turns_of.pop(session_id, {}):
            if (gone := self._turn_records.pop((session_id, turn_id), None)) is not None:
                self._turn_record_bytes -= len(gone.record)
        self._checkpoints.pop(session_id, None)
        record = self._records.pop(session_id, None)
        if record is None:
            return False
        principal = principal_of(session_id)
        listed = self._listed[principal]
        entry = (position(record.created_at, session_id), session_id)
        del listed[bisect.bisect_left(listed, entry)]
        if not listed:
            del self._listed[principal]
        return True

    async def history(self, session_id: str, start: int = 0) -> list[message_pb2.Message]:
        if session_id not in self._messages:
            raise NotFound(f"session {public_id(session_id)!r} not found")
        return [message_pb2.Message.FromString(m) for m in self._messages[session_id][start:]]

    async def append_messages(
        self, session_id: str, messages: list[message_pb2.Message], now: float
    ) -> None:
        record = self._records.get(session_id)
        if record is None:
            raise NotFound(f"session {public_id(session_id)!r} not found")
        self._messages[session_id].extend(m.SerializeToString() for m in messages)
        record.message_count += len(messages)
        record.last_activity = now

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
        # The event log of this process holds the final event; no other
        # server can own the session, so there is nothing to fence.
        await self.append_messages(session_id, messages, now)
        self._records[session_id].pause = pause
        if checkpoint:
            self._checkpoints[session_id] = checkpoint
        else:
            self._checkpoints.pop(session_id, None)

    async def set_pause(self, session_id: str, pause: bytes, now: float, fence: str = "") -> None:
        await self.append_messages(session_id, [], now)
        self._records[session_id].pause = pause

    async def checkpoint(self, session_id: str) -> bytes:
        return self._checkpoints.get(session_id, b"")

    async def abandon_turn(self, session_id: str, turn_id: str) -> bool:
        # Not shared: a turn seen failed here was ended by its own runner,
        # which commits nothing afterwards.
        return True

    @property
    def persists_events(self) -> bool:
        return False

    async def append_events(
        self, session_id: str, turn_id: str, events: list[event_pb2.Event]
    ) -> None:
        return None

    async def read_events(self, session_id: str, turn_id: str) -> list[event_pb2.Event] | None:
        return None

    async def get_key(self, session_id: str, key: str) -> str | None:
        return None

    async def set_key(self, session_id: str, key: str, turn_id: str) -> None:
        return None

    async def put_turn(
        self, session_id: str, turn_id: str, record: bytes, *, ended: bool, ttl_seconds: float
    ) -> bool:
        if session_id not in self._records:
            return False
        key = (session_id, turn_id)
        kept = self._turn_records.get(key)
        if kept is not None and kept.ended:
            return False
        at = time.monotonic()
        self._turn_record_bytes += len(record) - (len(kept.record) if kept is not None else 0)
        self._turn_records[key] = _KeptTurn(record, ended, at + ttl_seconds)
        self._turn_records.move_to_end(key)
        order = self._turns_of.setdefault(session_id, {})
        order[turn_id] = None
        if len(order) > TURN_RECORDS_PER_SESSION:
            self._drop_turn((session_id, next(iter(order))))
        # Expired ones first, then the least recently written past the bounds.
        while self._turn_records:
            oldest, first = next(iter(self._turn_records.items()))
            if (
                first.expires > at
                and len(self._turn_records) <= self._max_turn_records
                and self._turn_record_bytes <= self._max_turn_record_bytes
            ):
                break
            self._drop_turn(oldest)
        return True

    def _drop_turn(self, key: tuple[str, str]) -> None:
        if (gone := self._turn_records.pop(key, None)) is not None:
            self._turn_record_bytes -= len(gone.record)
        order = self._turns_of.get(key[0])
        if order is not None:
            order.pop(key[1], None)
            if not order:
                del self._turns_of[key[0]]

    def outbox(self) -> MemoryOutbox:
        return self._outbox

    async def open_turns(
        self, limit: int, cursor: int = 0
    ) -> tuple[list[tuple[str, str]], int | None]:
        now = time.monotonic()
        open_ = [
            k for k, kept in self._turn_records.items() if not kept.ended and kept.expires > now
        ]
        end = cursor + limit
        return open_[cursor:end], end if end < len(open_) else None

    async def get_turn(self, session_id: str, turn_id: str) -> bytes | None:
        kept = self._turn_records.get((session_id, turn_id))
        if kept is None or kept.expires <= time.monotonic():
            return None
        return kept.record

    async def close(self) -> None:
        return None

    async def touch(self, session_id: str, now: float) -> None:
        record = self._records.get(session_id)
        if record is not None:
            record.last_activity = now

    async def idle_sessions(self, last_activity_before: float) -> list[str]:
        return [sid for sid, r in self._records.items() if r.last_activity < last_activity_before]

    async def count(self) -> int:
        return len(self._records)

    async def list_sessions(
        self, principal: str, before: Position | None, limit: int
    ) -> Page[SessionRecord]:
        listed = self._listed.get(principal, [])
        end = len(listed) if before is None else bisect.bisect_left(listed, (before, ""))
        chosen = listed[max(0, end - limit) : end][::-1]
        items = [(at, self._records[sid]) for at, sid in chosen]
        frontier = chosen[-1][0] if chosen and end - limit > 0 else None
        return Page([(at, dataclasses.replace(r)) for at, r in items], frontier)

    async def count_of(self, principal: str) -> int:
        return len(self._listed.get(principal, ()))


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


def open_store(
    url: str, event_ttl_seconds: float, legacy_principal: str = ANONYMOUS
) -> SessionStore:
    """A store from ``memory``, ``sqlite:PATH``, ``redis://HOST:PORT/DB`` or
    ``redis+cluster://HOST:PORT`` (any node of a Redis Cluster).

    ``legacy_principal`` owns the sessions a durable store held from before
    sessions had principals (the one principal of a mesh with one; else
    anonymous), given to it once, when ``open`` brings the data up to date."""
    if url in ("", "memory"):
        return MemoryStore()
    if url.startswith("sqlite:"):
        from turnmesh.server.stores.sqlite import SqliteStore

        return SqliteStore(url.removeprefix("sqlite:"), event_ttl_seconds, legacy_principal)
    if url.startswith(("redis://", "rediss://", "redis+cluster://", "rediss+cluster://")):
        from turnmesh.server.stores.redis import RedisStore

        return RedisStore(url, event_ttl_seconds, legacy_principal)
    raise ValueError(
        f"unknown store {url!r}: use memory, sqlite:PATH, redis://HOST:PORT/DB"
        " or redis+cluster://HOST:PORT"
    )
