"""The worker's end of the servers' relays (``WorkerService.Relay``).

A relay gathers the events of many turns into one gRPC message: an agent's
emit appends its event to the relay's next response and wakes the relay's
writer, which sends whatever every turn had ready when the transport took
the last response. A paced agent's event therefore waits for nothing but the
write before it (no timer, no batch to fill), while at load one message and
one wakeup carry many turns' events instead of one each.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Sequence
from dataclasses import dataclass, field

from turnmesh.runtime import metrics
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import worker_service_pb2 as wpb

__all__ = ["Relay", "Relays"]

log = logging.getLogger(__name__)

# One response holds at most this much (a larger event goes alone): the
# server reads a response whole, and a big one delays every turn in it.
MAX_RESPONSE_BYTES = 256 * 1024
# Past this many bytes waiting to be written, a turn's next emit waits until
# the writer has caught up (backpressure, as a stream per turn had), so one
# turn's burst slows the turns emitting with it and fails none of them.
HIGH_WATER_BYTES = 8 * 1024 * 1024
# Still past this when more comes (the server stopped reading while turns
# emitted anyway): the relay ends, and its turns with it.
MAX_OUTBOX_BYTES = 64 * 1024 * 1024


class RelayClosed(Exception):
    """The relay a turn was using has ended."""


@dataclass(slots=True)
class _Pending:
    """A response waiting to be written, and what its events hold."""

    response: wpb.RelayResponse = field(default_factory=wpb.RelayResponse)
    bytes: int = 0
    events: int = 0


class Relay:
    """One server's relay on this worker: an outbox of responses and the
    turns writing to it."""

    def __init__(self, relay_id: str) -> None:
        self.relay_id = relay_id
        self.closed = False
        self._outbox: deque[_Pending] = deque()
        # The open response's entry per turn (a turn's events stay together).
        self._entries: dict[int, wpb.RelayedEvents] = {}
        self._outbox_bytes = 0
        self._ready = asyncio.Event()
        self._room = asyncio.Event()  # set while under the high-water mark
        self._room.set()
        self._flushed = asyncio.Event()  # set while everything put is written
        self._flushed.set()
        # The turns using this relay, to stop when it ends.
        self._turns: dict[int, asyncio.Task[object]] = {}

    def attach(self, key: int, task: asyncio.Task[object]) -> None:
        self._turns[key] = task

    def detach(self, key: int) -> None:
        self._turns.pop(key, None)

    def put(
        self,
        key: int,
        events: Sequence[event_pb2.Event],
        files: Sequence[message_pb2.FileRef] = (),
    ) -> None:
        """Queue a turn's events (and its file readings) for the next write."""
        if self.closed:
            raise RelayClosed(self.relay_id)
        size = sum(event.ByteSize() for event in events) + sum(f.ByteSize() for f in files)
        if self._outbox_bytes > MAX_OUTBOX_BYTES:
            log.warning("relay %s: the server is not reading; closing it", self.relay_id)
            self.close()
            raise RelayClosed(self.relay_id)
        pending = self._outbox[-1] if self._outbox else None
        if pending is None or (pending.bytes and pending.bytes + size > MAX_RESPONSE_BYTES):
            pending = _Pending()
            self._outbox.append(pending)
            self._entries = {}
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = pending.response.turns.add(relay_key=key)
        entry.events.extend(events)
        entry.files.extend(files)
        pending.bytes += size
        pending.events += len(events)
        self._outbox_bytes += size
        self._flushed.clear()
        if self._outbox_bytes > HIGH_WATER_BYTES:
            self._room.clear()
        self._ready.set()

    def room(self) -> Awaitable[bool] | None:
        """None while a turn may emit at once; past the high-water mark,
        what to wait on first (it is done when the writer has caught up, or
        the relay has ended)."""
        return None if self._room.is_set() else self._room.wait()

    async def flush(self) -> None:
        """Wait until everything put has been written (or the relay ended)."""
        await self._flushed.wait()

    async def responses(self) -> AsyncGenerator[wpb.RelayResponse, None]:
        """What to write, one response at a time, until the relay closes."""
        while not self.closed:
            if not self._outbox:
                # Back here, the transport has taken the last response.
                self._flushed.set()
                self._ready.clear()
                await self._ready.wait()
                continue
            pending = self._outbox.popleft()
            if not self._outbox:
                self._entries = {}  # the next event starts a new response
            self._outbox_bytes -= pending.bytes
            if self._outbox_bytes <= HIGH_WATER_BYTES:
                self._room.set()
            # Counted once a response, not once an event (the hot path).
            metrics.WORKER_RELAY_RESPONSES.inc()
            metrics.WORKER_RELAYED_EVENTS.inc(pending.events)
            yield pending.response

    def close(self) -> None:
        """End the relay: its turns are stopped (their Run calls then fail)."""
        if self.closed:
            return
        self.closed = True
        self._outbox.clear()
        self._entries = {}
        self._outbox_bytes = 0
        self._ready.set()
        self._room.set()
        self._flushed.set()
        for task in self._turns.values():
            task.cancel("the relay to the server ended")


class Relays:
    """The relays servers hold open to this worker, by id."""

    def __init__(self) -> None:
        self._relays: dict[str, Relay] = {}

    def open(self, relay_id: str) -> Relay:
        old = self._relays.pop(relay_id, None)
        if old is not None:
            old.close()
        relay = self._relays[relay_id] = Relay(relay_id)
        return relay

    def get(self, relay_id: str) -> Relay | None:
        relay = self._relays.get(relay_id)
        return relay if relay is not None and not relay.closed else None

    def close(self, relay: Relay) -> None:
        relay.close()
        if self._relays.get(relay.relay_id) is relay:
            del self._relays[relay.relay_id]

    async def flush_all(self) -> None:
        for relay in list(self._relays.values()):
            await relay.flush()

    def close_all(self) -> None:
        for relay in list(self._relays.values()):
            self.close(relay)

    def __len__(self) -> int:
        return len(self._relays)
