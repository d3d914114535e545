"""A2A task records in this process's memory (``MemoryStore``'s): each
session's by task id, and each principal's in listing order (``listing``
positions: creation nanoseconds and task id), bounded per session and per
principal as the store contract says (``base``)."""

from __future__ import annotations

import bisect

from turnmesh.runtime.principals import principal_of
from turnmesh.server.stores.base import TASK_RECORDS_PER_PRINCIPAL, TASK_RECORDS_PER_SESSION
from turnmesh.server.stores.listing import Page, Position


class MemoryTasks:
    def __init__(self) -> None:
        # Per session: task id -> (position, record).
        self._of: dict[str, dict[str, tuple[Position, bytes]]] = {}
        # Per principal: (position, session id), ascending.
        self._listed: dict[str, list[tuple[Position, str]]] = {}

    def put(self, session_id: str, task_id: str, record: bytes, created_at: float) -> None:
        kept = self._of.setdefault(session_id, {})
        if task_id in kept:
            kept[task_id] = (kept[task_id][0], record)
            return
        at = (int(created_at * 1e9), task_id)
        kept[task_id] = (at, record)
        listed = self._listed.setdefault(principal_of(session_id), [])
        bisect.insort(listed, (at, session_id))
        if len(kept) > TASK_RECORDS_PER_SESSION:
            self._drop(session_id, min(kept.values())[0])
        if len(listed) > TASK_RECORDS_PER_PRINCIPAL:
            oldest, owner = listed[0]
            self._drop(owner, oldest)

    def _drop(self, session_id: str, at: Position) -> None:
        kept = self._of.get(session_id, {})
        kept.pop(at[1], None)
        if not kept:
            self._of.pop(session_id, None)
        principal = principal_of(session_id)
        listed = self._listed.get(principal, [])
        index = bisect.bisect_left(listed, (at, session_id))
        if index < len(listed) and listed[index] == (at, session_id):
            del listed[index]
        if not listed:
            self._listed.pop(principal, None)

    def get(self, session_id: str, task_id: str) -> bytes | None:
        found = self._of.get(session_id, {}).get(task_id)
        return None if found is None else found[1]

    def delete(self, session_id: str) -> None:
        for at, _ in list(self._of.get(session_id, {}).values()):
            self._drop(session_id, at)

    def list(self, principal: str, before: Position | None, limit: int) -> Page[tuple[str, bytes]]:
        listed = self._listed.get(principal, [])
        end = len(listed) if before is None else bisect.bisect_left(listed, (before, ""))
        chosen = listed[max(0, end - limit) : end][::-1]
        items = [(at, (sid, self._of[sid][at[1]][1])) for at, sid in chosen]
        frontier = chosen[-1][0] if chosen and end - limit > 0 else None
        return Page(items, frontier)
