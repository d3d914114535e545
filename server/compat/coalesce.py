"""One message for every event ready at once, on the surfaces' SSE streams.

A surface reads its turn's events one at a time (``ReadyEvents``, over the
turn log's batches: ``SessionServicer.turn_batches``) and writes its own
frames for each. ``coalesced`` holds the frames made while more events are
already in hand and sends them with the next, so a client that reads slower
than the agent speaks gets fewer, larger messages; with nothing in hand
every frame goes at once (no timer).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable

from google.api import httpbody_pb2

from turnmesh.runtime.sse import MAX_BODY_BYTES
from turnmesh.v1 import event_pb2


class ReadyEvents:
    """A turn's events, one at a time, from its batches; ``ready`` says how
    many are in hand (read without waiting)."""

    def __init__(self, batches: AsyncGenerator[list[event_pb2.Event], None]) -> None:
        self._batches = batches
        self._batch: list[event_pb2.Event] = []
        self._next = 0

    def __aiter__(self) -> ReadyEvents:
        return self

    async def __anext__(self) -> event_pb2.Event:
        while self._next >= len(self._batch):
            self._batch = await anext(self._batches)  # StopAsyncIteration: the end
            self._next = 0
        event = self._batch[self._next]
        self._next += 1
        return event

    @property
    def ready(self) -> int:
        return len(self._batch) - self._next

    async def aclose(self) -> None:
        self._batch = []
        await self._batches.aclose()


async def coalesced(
    bodies: AsyncIterator[httpbody_pb2.HttpBody], ready: Callable[[], int]
) -> AsyncIterator[httpbody_pb2.HttpBody]:
    """``bodies``, those made while ``ready()`` events are in hand joined to
    the next (at most about ``MAX_BODY_BYTES`` a message)."""
    held: list[httpbody_pb2.HttpBody] = []
    size = 0
    try:
        async for body in bodies:
            held.append(body)
            size += len(body.data)
            if ready() and size < MAX_BODY_BYTES:
                continue
            yield _joined(held)
            held, size = [], 0
    except Exception:
        if held:  # what the client was owed before the surface failed
            yield _joined(held)
        raise
    if held:
        yield _joined(held)


def _joined(bodies: list[httpbody_pb2.HttpBody]) -> httpbody_pb2.HttpBody:
    if len(bodies) == 1:
        return bodies[0]
    data = b"".join(body.data for body in bodies)
    return httpbody_pb2.HttpBody(content_type=bodies[0].content_type, data=data)
