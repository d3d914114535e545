"""This server's end of the workers' relays (``WorkerService.Relay``).

One long-lived stream per worker carries the events of every turn this
server runs there, many turns' events per message: one read and one wakeup
of one task per message, where a stream per turn took a read, a message and
a task switch per event. Each turn keeps its own ``Run`` call for its
request, its cancellation and its status; the turn's last ``Run`` response
says how many of its events came through the relay, and the runner waits
for that many before it reads that response's events (the two streams are
not ordered with each other).

A relay that ends (the worker stopped, the connection broke) fails the
turns that used it, as a broken ``Run`` stream does; the next turn opens a
new one, and until it is open turns stream on their ``Run`` call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from turnmesh.v1 import worker_service_pb2 as wpb

if TYPE_CHECKING:
    from turnmesh.v1.worker_service_pb2_grpc import WorkerServiceAsyncStub

__all__ = ["RelayLink", "RelayedTurn"]

log = logging.getLogger(__name__)

# After a relay ends, the next is opened no sooner than this (a worker that
# refuses relays is not asked on every turn); one whose worker does not know
# the method (an older version) is asked again after the longer wait.
REOPEN_SECONDS = 1.0
UNSUPPORTED_REOPEN_SECONDS = 60.0


class RelayedTurn:
    """One turn's share of a relay: its events go to ``feed`` as they come,
    and the runner waits here until it has had as many as the worker sent."""

    def __init__(self, key: int, feed: Callable[[wpb.RelayedEvents], None]) -> None:
        self.key = key
        self._feed = feed
        self.received = 0
        self.lost = False
        self._wanted: int | None = None
        self._arrived = asyncio.Event()

    def deliver(self, entry: wpb.RelayedEvents) -> None:
        if self.lost:
            return
        try:
            self._feed(entry)
        except Exception:
            log.exception("relayed events of one turn could not be taken; it fails")
            self.lose()
            return
        self.received += len(entry.events)
        if self._wanted is not None and self.received >= self._wanted:
            self._arrived.set()

    def lose(self) -> None:
        self.lost = True
        self._arrived.set()

    async def wait_for(self, count: int) -> bool:
        """Whether all ``count`` relayed events came (False: the relay ended
        first). A relay that ended after bringing them all (the worker ends
        its relays once its turns have) lost nothing."""
        if self.received < count and not self.lost:
            self._wanted = count
            await self._arrived.wait()
        return self.received >= count


class RelayLink:
    """This server's relay from one worker: opened at once, usable once the
    worker has answered."""

    def __init__(self, stub: WorkerServiceAsyncStub, metadata: tuple[tuple[str, str], ...]) -> None:
        self.relay_id = secrets.token_hex(16)
        self.open = False
        self.closed = False
        self.reopen_at = 0.0
        self._turns: dict[int, RelayedTurn] = {}
        self._last_key = 0
        self._task = asyncio.create_task(self._read(stub, metadata), name="relay")

    def register(self, feed: Callable[[wpb.RelayedEvents], None]) -> RelayedTurn:
        self._last_key += 1
        turn = self._turns[self._last_key] = RelayedTurn(self._last_key, feed)
        return turn

    def unregister(self, turn: RelayedTurn) -> None:
        self._turns.pop(turn.key, None)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _read(
        self, stub: WorkerServiceAsyncStub, metadata: tuple[tuple[str, str], ...]
    ) -> None:
        call = stub.Relay(wpb.RelayRequest(relay_id=self.relay_id), metadata=metadata)
        wait = REOPEN_SECONDS
        try:
            async for response in call:
                self.open = True  # the first (empty) response says so
                for entry in response.turns:
                    turn = self._turns.get(entry.relay_key)
                    if turn is not None:  # else: a turn that ended (cancelled) here
                        turn.deliver(entry)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                wait = UNSUPPORTED_REOPEN_SECONDS
            log.debug("relay %s ended: %s", self.relay_id, exc.code())
        finally:
            self.open = False
            self.closed = True
            self.reopen_at = time.monotonic() + wait
            call.cancel()
            for turn in self._turns.values():
                turn.lose()
            self._turns.clear()
