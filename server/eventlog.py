"""The bounded per-turn event log behind Turn and SubscribeTurn.

Every caller of a turn, and every later subscriber, reads the same log, so a
client that lost its stream resumes with exactly the events it missed. Logs
are bounded in events per turn, in turns kept per session, and in age after
the turn ends.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator

from turnmesh.runtime.errors import NotFound, OutOfRange
from turnmesh.v1 import event_pb2
from turnmesh.v1 import session_service_pb2 as spb


def now_ms() -> float:
    """Whole milliseconds: AG-UI clients reject a timestamp with a fraction."""
    return float(time.time_ns() // 1_000_000)


TERMINAL_TYPES = frozenset({event_pb2.RUN_FINISHED, event_pb2.RUN_ERROR})


class TurnLog:
    def __init__(self, session_id: str, turn_id: str, max_events: int) -> None:
        self.session_id = session_id
        self.turn_id = turn_id
        self.state: spb.TurnState.ValueType = spb.TURN_STATE_QUEUED
        self._events: list[event_pb2.Event] = []
        self._first_seq = 1  # seq of self._events[0]
        self._next_seq = 1
        self._max_events = max_events
        self._changed = asyncio.Event()
        self.ended_at: float | None = None

    @property
    def done(self) -> bool:
        return self.ended_at is not None

    @property
    def last_seq(self) -> int:
        return self._next_seq - 1

    def append(self, event: event_pb2.Event) -> event_pb2.Event:
        """Stamp the event with its seq and ids, and wake every reader."""
        if self.done:
            raise RuntimeError("append to an ended turn")
        event.seq = self._next_seq
        event.thread_id = self.session_id
        event.run_id = self.turn_id
        if not event.timestamp:
            event.timestamp = now_ms()
        self._next_seq += 1
        self._events.append(event)
        if len(self._events) > self._max_events:
            drop = len(self._events) - self._max_events
            del self._events[:drop]
            self._first_seq += drop
        if event.type in TERMINAL_TYPES:
            self.ended_at = time.monotonic()
        self._wake()
        return event

    def set_state(self, state: spb.TurnState.ValueType) -> None:
        self.state = state

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def follow(
        self, after_seq: int = 0, keepalive_seconds: float | None = None
    ) -> AsyncIterator[event_pb2.Event]:
        """Events with seq > after_seq, then live ones until the turn ends.

        With ``keepalive_seconds``, a silent turn yields a CUSTOM "keepalive"
        event (seq 0, not part of the log) that often, once the turn has
        started, so proxies and clients do not take a long tool call for a
        dead stream.
        """
        next_seq = after_seq + 1
        while True:
            if next_seq < self._first_seq:
                raise OutOfRange(
                    f"events before seq {self._first_seq} of turn {self.turn_id} are no longer kept"
                )
            while next_seq < self._next_seq:
                if next_seq < self._first_seq:
                    break  # a slow reader fell behind the bound
                yield self._events[next_seq - self._first_seq]
                next_seq += 1
            else:
                if self.done:
                    return
                if keepalive_seconds is None or self.last_seq == 0:
                    await self._changed.wait()
                    continue
                try:
                    await asyncio.wait_for(self._changed.wait(), keepalive_seconds)
                except TimeoutError:
                    yield self._keepalive()

    def _keepalive(self) -> event_pb2.Event:
        event = event_pb2.Event(
            type=event_pb2.CUSTOM,
            thread_id=self.session_id,
            run_id=self.turn_id,
            timestamp=now_ms(),
            name="keepalive",
        )
        event.value.struct_value.SetInParent()  # AG-UI requires a value
        return event


class EventLogs:
    """The turn logs of every session on this server."""

    def __init__(self, max_events: int, max_turns_per_session: int, ttl_seconds: float) -> None:
        self._max_events = max_events
        self._max_turns = max_turns_per_session
        self._ttl = ttl_seconds
        self._by_session: dict[str, OrderedDict[str, TurnLog]] = {}

    def create(self, session_id: str, turn_id: str) -> TurnLog:
        logs = self._by_session.setdefault(session_id, OrderedDict())
        log = TurnLog(session_id, turn_id, self._max_events)
        logs[turn_id] = log
        self._evict(logs)
        return log

    def get(self, session_id: str, turn_id: str) -> TurnLog:
        self._evict(self._by_session.get(session_id, OrderedDict()))
        log = self._by_session.get(session_id, {}).get(turn_id)
        if log is None:
            raise NotFound(f"turn {turn_id!r} of session {session_id!r} not found or expired")
        return log

    def drop_session(self, session_id: str) -> None:
        self._by_session.pop(session_id, None)

    def _evict(self, logs: OrderedDict[str, TurnLog]) -> None:
        now = time.monotonic()
        for turn_id, log in list(logs.items()):
            too_many = len(logs) > self._max_turns
            expired = log.ended_at is not None and now - log.ended_at > self._ttl
            if log.done and (too_many or expired):
                del logs[turn_id]
