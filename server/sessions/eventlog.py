"""The bounded per-turn event log behind Turn and SubscribeTurn.

Every caller of a turn, and every later subscriber, reads the same log, so a
client that lost its stream resumes with exactly the events it missed. Logs
are bounded in events per turn, in turns kept per session, in age after the
turn ends, and, for the whole server, in bytes: a finished turn's events are
packed into one serialized buffer (a third of their size as objects), and
when the finished logs pass the byte budget the oldest go first. Expired logs
go whether or not their session is touched again (``sweep``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from array import array
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Protocol

from turnmesh.runtime.errors import NotFound, OutOfRange
from turnmesh.runtime.events import TERMINAL_TYPES, now_ms
from turnmesh.runtime.principals import public_id
from turnmesh.runtime.turn_errors import TurnError
from turnmesh.v1 import event_pb2
from turnmesh.v1 import session_service_pb2 as spb

log = logging.getLogger(__name__)

# What a server's finished turns' events may hold, packed (``--max-event-log-bytes``).
DEFAULT_MAX_BYTES = 128 * 2**20

# A finished turn with more events than this is packed in a thread.
PACK_ON_LOOP_EVENTS = 2_000

# The most events one read of a log takes (a reader far behind, a replay):
# what one streamed message may carry.
MAX_BATCH_EVENTS = 256

# Outcomes of turns whose events the byte budget dropped early (see EventLogs).
MAX_OUTCOMES = 200_000

# Writes a turn's events to a durable store: (session_id, turn_id, events).
EventSink = Callable[[str, str, list[event_pb2.Event]], Awaitable[None]]


class TurnLog:
    def __init__(
        self,
        session_id: str,
        turn_id: str,
        max_events: int,
        sink: EventSink | None = None,
        on_end: Callable[[TurnLog], None] | None = None,
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
        # What readers wait on; made by the first reader to wait, so that
        # appends nobody waits for (a batch's second event on) make none.
        self._changed: asyncio.Event | None = None
        self.ended_at: float | None = None
        self.finished = False  # ended with RUN_FINISHED (the turn changed the history)
        # Write-through to a durable store, in order, by one writer task.
        self._sink = sink
        self._unwritten: list[event_pb2.Event] = []
        self._writer: asyncio.Task[None] | None = None
        self._on_end = on_end
        # Once packed (the turn ended): the events serialized back to back,
        # and where each ends; _events is then empty.
        self._packed: bytes | None = None
        self._ends: array[int] | None = None
        # What GetTurn reports without reading the events: when the turn was
        # accepted and started (whole ms, as events' timestamps), its
        # terminal event, and whether StartTurn started it (or joined it).
        self.created_ms = now_ms()
        self.started_ms = 0.0
        self.end_event: event_pb2.Event | None = None
        self.background = False
        # Where its end is notified (a request's webhook_url; "" if none).
        self.webhook = ""
        # Rebuilt from a store's events: another server ran the turn.
        self.restored = False

    @classmethod
    def restore(
        cls,
        session_id: str,
        turn_id: str,
        events: list[event_pb2.Event],
        max_events: int,
        sink: EventSink | None,
        on_end: Callable[[TurnLog], None] | None = None,
    ) -> TurnLog:
        """A log rebuilt from a store's events (another server wrote them)."""
        restored = cls(session_id, turn_id, max_events, sink, on_end)
        restored.restored = True
        restored._events = list(events[-max_events:])
        if events and events[0].type == event_pb2.RUN_STARTED:
            restored.started_ms = events[0].timestamp
        if restored._events:
            restored._first_seq = restored._events[0].seq
            restored._next_seq = restored._events[-1].seq + 1
            last = restored._events[-1]
            if last.type in TERMINAL_TYPES:
                restored.end_event = last
                restored.ended_at = time.monotonic()
                restored.finished = last.type == event_pb2.RUN_FINISHED
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
            self.finished = event.type == event_pb2.RUN_FINISHED
            self.end_event = event
        elif event.type == event_pb2.RUN_STARTED and not self.started_ms:
            self.started_ms = event.timestamp
        self._wake()
        if self.ended_at is not None and self._on_end is not None:
            self._on_end(self)
        return event

    @property
    def event_count(self) -> int:
        return self._next_seq - self._first_seq

    @property
    def packed_bytes(self) -> int:
        """What the packed events hold (0 until packed)."""
        if self._packed is None or self._ends is None:
            return 0
        return len(self._packed) + self._ends.itemsize * len(self._ends)

    def pack(self) -> int:
        """An ended turn's events as one buffer: what resuming needs, at a
        third of their size as objects. Returns the bytes it holds."""
        if not self.done:
            raise RuntimeError("only an ended turn's events are packed")
        if self._packed is None:
            pieces = [event.SerializeToString() for event in self._events]
            # In this order (each assignment is atomic): a reader on the loop
            # sees _packed only once _ends is there, and _events until both are.
            self._ends = array("L", itertools.accumulate(map(len, pieces)))
            self._packed = b"".join(pieces)
            self._events = []
        return self.packed_bytes

    def _at(self, index: int) -> event_pb2.Event:
        if self._packed is None or self._ends is None:
            return self._events[index]
        start = self._ends[index - 1] if index else 0
        return event_pb2.Event.FromString(self._packed[start : self._ends[index]])

    def _slice(self, start: int, end: int) -> list[event_pb2.Event]:
        # The list first: a pack in a thread replaces it only after _packed
        # is set, and never changes it, so unpacked it is whole.
        events = self._events
        if self._packed is None:
            return events[start:end]
        return [self._at(index) for index in range(start, end)]

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
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def _waiter(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    async def follow(
        self,
        after_seq: int = 0,
        keepalive_seconds: float | None = None,
        on_abandon: Callable[[], None] | None = None,
    ) -> AsyncGenerator[event_pb2.Event, None]:
        """Events with seq > after_seq, then live ones until the turn ends,
        one at a time (``follow_batches`` says what each argument does)."""
        batches = self.follow_batches(after_seq, keepalive_seconds, on_abandon)
        async with contextlib.aclosing(batches):
            async for batch in batches:
                for event in batch:
                    yield event

    async def follow_batches(
        self,
        after_seq: int = 0,
        keepalive_seconds: float | None = None,
        on_abandon: Callable[[], None] | None = None,
        max_batch: int = MAX_BATCH_EVENTS,
    ) -> AsyncGenerator[list[event_pb2.Event], None]:
        """Events with seq > after_seq, then live ones until the turn ends,
        in batches: each holds every event appended since the reader last
        took one (at most ``max_batch``), so a reader that falls behind
        catches up in a few steps; a reader that keeps up gets each event
        alone, at once.

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
                if next_seq < self._next_seq:
                    start = next_seq - self._first_seq
                    end = min(self._next_seq - self._first_seq, start + max_batch)
                    next_seq += end - start
                    yield self._slice(start, end)
                    continue
                if self.done:
                    read_to_end = True
                    return
                if keepalive_seconds is None or self.last_seq == 0:
                    await self._waiter().wait()
                    continue
                try:
                    # asyncio.timeout, not wait_for: no extra task per wait.
                    async with asyncio.timeout(keepalive_seconds):
                        await self._waiter().wait()
                except TimeoutError:
                    yield [self._keepalive()]
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


def recorded(log: TurnLog) -> bool:
    """Whether the turn has a durable record (GetTurn after its events go)."""
    return log.background or bool(log.webhook)


class EventLogs:
    """The turn logs of every session this server owns; with a durable store,
    also the logs other servers wrote (loaded on demand).

    Finished logs are packed and listed in the order they ended, so the
    oldest go first: when they expire (``ttl_seconds``), and when together
    they pass ``max_bytes``. Running turns' logs are bounded per turn
    (``max_events``) and are never dropped."""

    def __init__(
        self,
        max_events: int,
        max_turns_per_session: int,
        ttl_seconds: float,
        store: EventStore | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        on_recorded_end: Callable[[TurnLog], None] | None = None,
    ) -> None:
        self._max_events = max_events
        self._max_turns = max_turns_per_session
        self._ttl = ttl_seconds
        self._max_bytes = max_bytes
        self._by_session: dict[str, OrderedDict[str, TurnLog]] = {}
        self._store = store if store is not None and store.persists_events else None
        # Finished logs, oldest end first, with the bytes each holds packed.
        self._finished: OrderedDict[tuple[str, str], int] = OrderedDict()
        self.finished_bytes = 0
        # How turns whose logs the byte budget dropped ended, until their
        # window would have passed: a retry of a finished turn's idempotency
        # key must not run it again (a few dozen bytes each, at most MAX_OUTCOMES).
        self._outcomes: OrderedDict[tuple[str, str], tuple[bool, float]] = OrderedDict()
        self._packing: set[asyncio.Task[None]] = set()
        # Told when a turn with a record (background, or with a webhook) that
        # ran here ends: its record's end (``TurnRecords.turn_ended``).
        self._on_recorded_end = on_recorded_end

    @property
    def _sink(self) -> EventSink | None:
        return self._store.append_events if self._store is not None else None

    def __len__(self) -> int:
        """Turn logs kept, running and finished."""
        return sum(len(logs) for logs in self._by_session.values())

    def create(self, session_id: str, turn_id: str) -> TurnLog:
        self.sweep()
        logs = self._by_session.setdefault(session_id, OrderedDict())
        log = TurnLog(session_id, turn_id, self._max_events, self._sink, self._ended)
        logs[turn_id] = log
        self._evict(session_id, logs)
        return log

    def peek(self, session_id: str, turn_id: str) -> TurnLog | None:
        """This server's log of the turn, if it keeps one."""
        self.sweep()
        return self._by_session.get(session_id, OrderedDict()).get(turn_id)

    def get(self, session_id: str, turn_id: str) -> TurnLog:
        self.sweep()
        log = self._by_session.get(session_id, OrderedDict()).get(turn_id)
        if log is None:
            raise NotFound(
                f"no events of turn {turn_id!r} of session {public_id(session_id)!r} are kept:"
                f" a turn's events are kept {self._ttl:g} s after it ends, within this server's"
                " budget for them (a finished turn's messages stay in the session's history)"
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
        restored = self._restore(session_id, turn_id, events)
        if not restored.done and not await self._store.abandon_turn(session_id, turn_id):
            # Its owner committed it just now: the store has the whole turn.
            events = await self._store.read_events(session_id, turn_id) or events
            restored = self._restore(session_id, turn_id, events)
        logs = self._by_session.setdefault(session_id, OrderedDict())
        logs[turn_id] = restored
        if not restored.done:
            # Fenced above: the owner, if it is only cut off, can no longer commit.
            restored.append(
                TurnError.OWNER_LOST.event(
                    "the server running this turn stopped; history is unchanged"
                )
            )
            restored.set_state(spb.TURN_STATE_FAILED)
        else:
            self._ended(restored)
        self._evict(session_id, logs)
        return restored

    def _restore(self, session_id: str, turn_id: str, events: list[event_pb2.Event]) -> TurnLog:
        return TurnLog.restore(
            session_id, turn_id, events, self._max_events, self._sink, self._ended
        )

    def finished_early_dropped(self, session_id: str, turn_id: str) -> bool:
        """Whether the turn finished (RUN_FINISHED) and the byte budget
        dropped its events before its window passed, which has not yet."""
        found = self._outcomes.get((session_id, turn_id))
        return found is not None and found[0] and time.monotonic() - found[1] <= self._ttl

    def drop_session(self, session_id: str) -> None:
        for turn_id in self._by_session.pop(session_id, OrderedDict()):
            self._forget(session_id, turn_id)

    def _ended(self, log: TurnLog) -> None:
        """A log's turn ended: packed, and last in line to go."""
        if recorded(log) and not log.restored and self._on_recorded_end is not None:
            self._on_recorded_end(log)
        if log.event_count > PACK_ON_LOOP_EVENTS:
            with contextlib.suppress(RuntimeError):  # no loop (a synchronous caller): inline
                task = asyncio.get_running_loop().create_task(self._pack_off_loop(log))
                self._packing.add(task)  # the loop keeps only a weak reference
                task.add_done_callback(self._packing.discard)
                return
        self._count(log, log.pack())

    async def _pack_off_loop(self, log: TurnLog) -> None:
        """A long turn's events are packed in a thread (50,000 took 166 ms):
        readers meanwhile read them unpacked or packed, never half of each."""
        self._count(log, await asyncio.to_thread(log.pack))

    def _count(self, log: TurnLog, size: int) -> None:
        key = (log.session_id, log.turn_id)
        logs = self._by_session.get(log.session_id)
        if key in self._finished or logs is None or logs.get(log.turn_id) is not log:
            return  # counted already, or no longer kept
        self._finished[key] = size
        self.finished_bytes += size
        self.sweep()

    def sweep(self) -> None:
        """Drop finished logs, oldest first, while they are expired or over
        the byte budget (the server also calls this each few seconds, so
        logs of sessions nobody touches again go too)."""
        now = time.monotonic()
        while self._finished:
            (session_id, turn_id), _ = next(iter(self._finished.items()))
            logs = self._by_session.get(session_id)
            log = logs.get(turn_id) if logs is not None else None
            expired = log is None or (log.ended_at is not None and now - log.ended_at > self._ttl)
            if not expired and self.finished_bytes <= self._max_bytes:
                break
            if not expired and log is not None and log.ended_at is not None:
                self._outcomes[(session_id, turn_id)] = (log.finished, log.ended_at)
                if len(self._outcomes) > MAX_OUTCOMES:
                    self._outcomes.popitem(last=False)
            self._forget(session_id, turn_id)
            if logs is not None:
                logs.pop(turn_id, None)
                if not logs:
                    del self._by_session[session_id]
        while self._outcomes:
            ended_at = next(iter(self._outcomes.values()))[1]
            if now - ended_at <= self._ttl:
                return
            self._outcomes.popitem(last=False)

    def _forget(self, session_id: str, turn_id: str) -> None:
        size = self._finished.pop((session_id, turn_id), None)
        if size is not None:
            self.finished_bytes -= size

    def _evict(self, session_id: str, logs: OrderedDict[str, TurnLog]) -> None:
        """A session's oldest finished logs past its count (the first ones in
        its dict are its oldest turns)."""
        excess = len(logs) - self._max_turns
        for turn_id, log in list(logs.items()):
            if excess <= 0:
                break
            if log.done:
                del logs[turn_id]
                self._forget(session_id, turn_id)
                excess -= 1


class EventStore(Protocol):
    """What EventLogs needs of a session store."""

    @property
    def persists_events(self) -> bool: ...

    async def append_events(
        self, session_id: str, turn_id: str, events: list[event_pb2.Event]
    ) -> None: ...

    async def read_events(self, session_id: str, turn_id: str) -> list[event_pb2.Event] | None: ...

    async def abandon_turn(self, session_id: str, turn_id: str) -> bool: ...
