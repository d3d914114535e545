"""Where sessions live: one interface, an in-memory backend.

Durable backends (SQLite, Redis) implement the same ``SessionStore``. The
contract every backend keeps: ``append_messages`` is atomic (all of a turn's
messages or none) and costs the same whatever the history's length.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from turnmesh.runtime.errors import AlreadyExists, NotFound
from turnmesh.v1 import message_pb2


@dataclass
class SessionRecord:
    session_id: str
    agent_name: str
    created_at: float  # Unix seconds
    last_activity: float
    metadata: dict[str, Any] = field(default_factory=dict)
    message_count: int = 0


class SessionStore(Protocol):
    async def create(
        self, record: SessionRecord, messages: list[message_pb2.Message] | None = None
    ) -> None:
        """Add a session with an optional starting history, atomically;
        AlreadyExists if the id is taken."""

    async def get(self, session_id: str) -> SessionRecord | None: ...

    async def delete(self, session_id: str) -> bool:
        """Remove a session and its history; False if it did not exist."""

    async def history(self, session_id: str) -> list[message_pb2.Message]: ...

    async def append_messages(
        self, session_id: str, messages: list[message_pb2.Message], now: float
    ) -> None:
        """Append one turn's messages atomically; NotFound if the session is gone."""

    async def touch(self, session_id: str, now: float) -> None: ...

    async def idle_sessions(self, last_activity_before: float) -> list[str]: ...

    async def count(self) -> int: ...


class MemoryStore:
    """Sessions in this process's memory: lost when it stops."""

    def __init__(self) -> None:
        self._records: dict[str, SessionRecord] = {}
        self._messages: dict[str, list[message_pb2.Message]] = {}

    async def create(
        self, record: SessionRecord, messages: list[message_pb2.Message] | None = None
    ) -> None:
        if record.session_id in self._records:
            raise AlreadyExists(f"session {record.session_id!r} already exists")
        initial = list(messages or [])
        record.message_count = len(initial)
        self._records[record.session_id] = record
        self._messages[record.session_id] = initial

    async def get(self, session_id: str) -> SessionRecord | None:
        record = self._records.get(session_id)
        if record is None:
            return None
        return dataclasses.replace(record, metadata=copy.deepcopy(record.metadata))

    async def delete(self, session_id: str) -> bool:
        self._messages.pop(session_id, None)
        return self._records.pop(session_id, None) is not None

    async def history(self, session_id: str) -> list[message_pb2.Message]:
        if session_id not in self._messages:
            raise NotFound(f"session {session_id!r} not found")
        # Messages are never mutated after append, so sharing them is safe.
        return list(self._messages[session_id])

    async def append_messages(
        self, session_id: str, messages: list[message_pb2.Message], now: float
    ) -> None:
        record = self._records.get(session_id)
        if record is None:
            raise NotFound(f"session {session_id!r} not found")
        self._messages[session_id].extend(messages)
        record.message_count += len(messages)
        record.last_activity = now

    async def touch(self, session_id: str, now: float) -> None:
        record = self._records.get(session_id)
        if record is not None:
            record.last_activity = now

    async def idle_sessions(self, last_activity_before: float) -> list[str]:
        return [sid for sid, r in self._records.items() if r.last_activity < last_activity_before]

    async def count(self) -> int:
        return len(self._records)


def now() -> float:
    return time.time()
