"""The histories of recently served sessions, so a server sends a worker only
the messages it has not seen (RunRequest.history_base): a turn then costs the
same whether the conversation holds 2 messages or 2,000.

Bounded in sessions and in bytes (a seeded history may hold 64 MiB): the
least recently used go first, and a turn of one that went is a HistoryMiss,
after which the server sends the whole history again."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from turnmesh.runtime.errors import HistoryMiss

History = list[dict[str, Any]]

DEFAULT_MAX_SESSIONS = 10_000
DEFAULT_MAX_BYTES = 256 * 2**20


def message_bytes(message: dict[str, Any]) -> int:
    """About what a history message holds: its text, its files' texts, its
    tool calls' arguments (characters, read without copying) and its
    metadata."""
    size = len(message.get("content") or "")
    if "metadata" in message:
        size += len(str(message["metadata"]))
    for file in message.get("files", ()):
        size += len(file.get("text") or "") + len(file.get("error") or "")
    for call in message.get("tool_calls", ()):
        size += len(call["function"]["arguments"])
    return size + 64  # names, roles, ids


class HistoryCache:
    def __init__(
        self, max_sessions: int = DEFAULT_MAX_SESSIONS, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self._sessions: OrderedDict[str, tuple[History, int]] = OrderedDict()
        self._max = max_sessions
        self._max_bytes = max_bytes
        self.bytes = 0

    def resolve(self, session_id: str, base: int, tail: History) -> History:
        """The whole history: the cached first ``base`` messages plus ``tail``."""
        size = sum(message_bytes(m) for m in tail)
        if base == 0:
            history = tail
        else:
            cached = self._sessions.get(session_id)
            if cached is None or len(cached[0]) != base:
                raise HistoryMiss(session_id)
            history = cached[0] + tail
            size += cached[1]
        self.forget(session_id)
        if size <= self._max_bytes:  # one larger than the whole cache is not kept
            self._sessions[session_id] = (history, size)
            self.bytes += size
        while len(self._sessions) > self._max or self.bytes > self._max_bytes:
            _, (_, dropped) = self._sessions.popitem(last=False)
            self.bytes -= dropped
        # The agent gets its own list: whatever it does to it, the cache keeps.
        return list(history)

    def forget(self, session_id: str) -> None:
        entry = self._sessions.pop(session_id, None)
        if entry is not None:
            self.bytes -= entry[1]
