"""The histories of recently served sessions, so a server sends a worker only
the messages it has not seen (RunRequest.history_base): a turn then costs the
same whether the conversation holds 2 messages or 2,000."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from turnmesh.runtime.errors import HistoryMiss

History = list[dict[str, Any]]


class HistoryCache:
    def __init__(self, max_sessions: int = 10_000) -> None:
        self._sessions: OrderedDict[str, History] = OrderedDict()
        self._max = max_sessions

    def resolve(self, session_id: str, base: int, tail: History) -> History:
        """The whole history: the cached first ``base`` messages plus ``tail``."""
        if base == 0:
            history = tail
        else:
            cached = self._sessions.get(session_id)
            if cached is None or len(cached) != base:
                raise HistoryMiss(session_id)
            history = cached + tail
        self._sessions[session_id] = history
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > self._max:
            self._sessions.popitem(last=False)
        # The agent gets its own list: whatever it does to it, the cache keeps.
        return list(history)

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
