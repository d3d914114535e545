"""``MemoryStore``: sessions in this process's memory, lost when it stops
(the default store). Not shared; it keeps no events or idempotency keys
(``persists_events`` is False), and turn records up to bounds of its own.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
import time
from collections import OrderedDict
from dataclasses import dataclass

from turnmesh.runtime.errors import AlreadyExists, NotFound
from turnmesh.runtime.principals import principal_of, public_id
from turnmesh.server.stores.base import (
    TURN_RECORDS_PER_SESSION,
    SessionRecord,
    session_quota_exceeded,
)
from turnmesh.server.stores.listing import Page, Position, position
from turnmesh.server.stores.push_configs import MemoryPushConfigs
from turnmesh.server.stores.tasks import MemoryTasks
from turnmesh.server.webhooks.outbox import MemoryOutbox
from turnmesh.v1 import event_pb2, message_pb2

# Turn records a memory store keeps at most (a few hundred bytes each, at
# most ``turn_records.MAX_TURN_BYTES``), and their bytes in all.
MAX_MEMORY_TURN_RECORDS = 10_000
MAX_MEMORY_TURN_RECORD_BYTES = 64 * 2**20


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
        self._tasks = MemoryTasks()
        self._push = MemoryPushConfigs(lambda session_id: session_id in self._records)

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
        self._tasks.delete(session_id)
        self._push.drop_session(session_id)
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

    async def put_task(
        self, session_id: str, task_id: str, record: bytes, created_at: float
    ) -> bool:
        if session_id not in self._records:
            return False
        self._tasks.put(session_id, task_id, record, created_at)
        return True

    async def get_task(self, session_id: str, task_id: str) -> bytes | None:
        return self._tasks.get(session_id, task_id)

    async def list_tasks(
        self, principal: str, before: Position | None, limit: int
    ) -> Page[tuple[str, bytes]]:
        return self._tasks.list(principal, before, limit)

    def outbox(self) -> MemoryOutbox:
        return self._outbox

    def push_configs(self) -> MemoryPushConfigs:
        return self._push

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
