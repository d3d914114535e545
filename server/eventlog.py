"""The bounded per-turn event log behind Turn and SubscribeTurn.

Every caller of a turn, and every later subscriber, reads the same log, so a
client that lost its stream resumes with exactly the events it missed. Logs
are bounded in events per turn, in turns kept per session, and in age after
the turn ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Protocol

from turnmesh.runtime.errors import NotFound, OutOfRange, TurnError
from turnmesh.runtime.events import TERMINAL_TYPES, now_ms
from turnmesh.runtime.principals import public_id
from turnmesh.v1 import event_pb2
from turnmesh.v1 import session_service_pb2 as spb

log = logging.getLogger(__name__)

# Writes a turn's events to a durable store: (session_id, turn_id, events).
EventSink = Callable[[str, str, list[event_pb2.Event]], Awaitable[None]]


class TurnLog:
    def __init__(
        self, session_id: str, turn_id: str, max_events: int, sink: EventSink | None = None
    ) -> None:
        self.session_id = session_id
        # What callers see: the session's public id.
        self._thread_id = public_id(session_id)
        self.turn_id = turn_id
        self.state: spb.TurnState.ValueType = spb.TURN_STATE_QUEUED
        self._events: list[event_pb2.Event] = []
        self._first_seq = 1  # seq of self._events[0]
        self._next_seq = 1
        self._max_events = max_events
        self._changed = asyncio.Event()
        self.ended_at: float | None = None
        # Write-through to a durable store, in order, by one writer task.
        self._sink = sink
        self._unwritten: list[event_pb2.Event] = []
        self._writer: asyncio.Task[None] | None = None

    @classmethod
    def restore(
        cls,
        session_id: str,
        turn_id: str,
        events: list[event_pb2.Event],
        max_events: int,
        sink: EventSink | None,
    ) -> TurnLog:
        """A log rebuilt from a store's events (another server wrote them)."""
        restored = cls(session_id, turn_id, max_events, sink)
        restored._events = list(events[-max_events:])
        if restored._events:
            restored._first_seq = restored._events[0].seq
            restored._next_seq = restored._events[-1].seq + 1
            last = restored._events[-1]
            if last.type in TERMINAL_TYPES:
                restored.ended_at = time.monotonic()
                restored.state = (
                    spb.TURN_STATE_FINISHED
                    if last.type == event_pb2.RUN_FINISHED
                    else spb.TURN_STATE_FAILED
                )
        return restored

    @property
    def done(self) -> bool:
        return self.ended_at is not None

    @property
    def last_seq(self) -> int:
        return self._next_seq - 1

    def stamp(self, event: event_pb2.Event) -> event_pb2.Event:
        """Give the event the seq and ids it gets when appended next."""
        event.seq = self._next_seq
        event.thread_id = self._thread_id
        event.run_id = self.turn_id
        if not event.timestamp:
            event.timestamp = now_ms()
        return event

    def append(self, event: event_pb2.Event, *, persisted: bool = False) -> event_pb2.Event:
        """Stamp the event, wake every reader, and queue it for the store.
        A ``persisted`` event was stamped (``stamp``) and stored by its caller
        already, as a turn's commit does with RUN_FINISHED."""
        if self.done:
            raise RuntimeError("append to an ended turn")
        if not persisted:
            self.stamp(event)
        elif event.seq != self._next_seq:
            raise RuntimeError("a persisted event must be the next one stamped")
        self._next_seq += 1
        if self._sink is not None and not persisted:
            self._unwritten.append(event)
            if self._writer is None or self._writer.done():
                self._writer = asyncio.create_task(self._write(), name=f"events-{self.turn_id}")
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

    async def _write(self) -> None:
        assert self._sink is not None
        while self._unwritten:
            batch, self._unwritten = self._unwritten, []
            try:
                await self._sink(self.session_id, self.turn_id, batch)
            except Exception:  # the live log still has them; only a resume elsewhere suffers
                log.warning("could not store %d events of turn %s", len(batch), self.turn_id)

    async def flush(self) -> None:
        """Wait until every appended event is in the store."""
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def follow(
        self,
        after_seq: int = 0,
        keepalive_seconds: float | None = None,
        on_abandon: Callable[[], None] | None = None,
    ) -> AsyncGenerator[event_pb2.Event, None]:
        """Events with seq > after_seq, then live ones until the turn ends.

        With ``keepalive_seconds``, a silent turn yields a CUSTOM "keepalive"
        event (seq 0, not part of the log) that often, once the turn has
        started, so proxies and clients do not take a long tool call for a
        dead stream. ``on_abandon`` runs if the reader stops before the end (a
        dropped caller: CancelledError inside, or GeneratorExit when gRPC
        closes the stream between events).
        """
        read_to_end = False
        try:
            next_seq = after_seq + 1
            while True:
                if next_seq < self._first_seq:
                    raise OutOfRange(
                        f"events before seq {self._first_seq} of turn {self.turn_id} "
                        "are no longer kept"
                    )
                while next_seq < self._next_seq:
                    if next_seq < self._first_seq:
                        break  # a slow reader fell behind the bound
                    yield self._events[next_seq - self._first_seq]
                    next_seq += 1
                else:
                    if self.done:
                        read_to_end = True
                        return
                    if keepalive_seconds is None or self.last_seq == 0:
                        await self._changed.wait()
                        continue
                    try:
                        # asyncio.timeout, not wait_for: no extra task per wait.
                        async with asyncio.timeout(keepalive_seconds):
                            await self._changed.wait()
                    except TimeoutError:
                        yield self._keepalive()
        finally:
            if on_abandon is not None and not read_to_end and not self.done:
                on_abandon()

    def _keepalive(self) -> event_pb2.Event:
        event = event_pb2.Event(
            type=event_pb2.CUSTOM,
            thread_id=public_id(self.session_id),
            run_id=self.turn_id,
            timestamp=now_ms(),
            name="keepalive",
        )
        event.value.struct_value.SetInParent()  # AG-UI requires a value
        return event


class EventLogs:
    """The turn logs of every session this server owns; with a durable store,
    also the logs other servers wrote (loaded on demand)."""

    def __init__(
        self,
        max_events: int,
        max_turns_per_session: int,
        ttl_seconds: float,
        store: EventStore | None = None,
    ) -> None:
        self._max_events = max_events
        self._max_turns = max_turns_per_session
        self._ttl = ttl_seconds
        self._by_session: dict[str, OrderedDict[str, TurnLog]] = {}
        self._store = store if store is not None and store.persists_events else None

    @property
    def _sink(self) -> EventSink | None:
        return self._store.append_events if self._store is not None else None

    def create(self, session_id: str, turn_id: str) -> TurnLog:
        logs = self._by_session.setdefault(session_id, OrderedDict())
        log = TurnLog(session_id, turn_id, self._max_events, self._sink)
        logs[turn_id] = log
        self._evict(logs)
        return log

    def get(self, session_id: str, turn_id: str) -> TurnLog:
        self._evict(self._by_session.get(session_id, OrderedDict()))
        log = self._by_session.get(session_id, OrderedDict()).get(turn_id)
        if log is None:
            raise NotFound(
                f"turn {turn_id!r} of session {public_id(session_id)!r} not found or expired"
            )
        return log

    async def find(self, session_id: str, turn_id: str) -> TurnLog:
        """This server's log of the turn, or the store's. A turn the store
        holds unfinished ran on a server that is gone (only the owner runs
        turns): it is ended here with RUN_ERROR "owner_lost"."""
        try:
            return self.get(session_id, turn_id)
        except NotFound:
            if self._store is None:
                raise
        events = await self._store.read_events(session_id, turn_id)
        try:
            return self.get(session_id, turn_id)  # loaded meanwhile by another caller
        except NotFound:
            pass
        if not events:
            raise NotFound(
                f"turn {turn_id!r} of session {public_id(session_id)!r} not found or expired"
            )
        restored = TurnLog.restore(session_id, turn_id, events, self._max_events, self._sink)
        if not restored.done and not await self._store.abandon_turn(session_id, turn_id):
            # Its owner committed it just now: the store has the whole turn.
            events = await self._store.read_events(session_id, turn_id) or events
            restored = TurnLog.restore(session_id, turn_id, events, self._max_events, self._sink)
        if not restored.done:
            # Fenced above: the owner, if it is only cut off, can no longer commit.
            restored.append(
                TurnError.OWNER_LOST.event(
                    "the server running this turn stopped; history is unchanged"
                )
            )
            restored.set_state(spb.TURN_STATE_FAILED)
        logs = self._by_session.setdefault(session_id, OrderedDict())
        logs[turn_id] = restored
        self._evict(logs)
        return restored

    def drop_session(self, session_id: str) -> None:
        self._by_session.pop(session_id, None)

    def _evict(self, logs: OrderedDict[str, TurnLog]) -> None:
        now = time.monotonic()
        for turn_id, log in list(logs.items()):
            too_many = len(logs) > self._max_turns
            expired = log.ended_at is not None and now - log.ended_at > self._ttl
            if log.done and (too_many or expired):
                del logs[turn_id]


class EventStore(Protocol):
    """What EventLogs needs of a session store."""

    @property
    def persists_events(self) -> bool: ...

    async def append_events(
        self, session_id: str, turn_id: str, events: list[event_pb2.Event]
    ) -> None: ...

    async def read_events(self, session_id: str, turn_id: str) -> list[event_pb2.Event] | None: ...

    async def abandon_turn(self, session_id: str, turn_id: str) -> bool: ...
