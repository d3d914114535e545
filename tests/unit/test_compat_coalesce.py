"""server/compat/coalesce.py: a surface's frames for events already in hand
go out together; with none in hand, each goes at once."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

import pytest
from google.api import httpbody_pb2

from turnmesh.runtime.sse import MAX_BODY_BYTES
from turnmesh.server.compat.coalesce import ReadyEvents, coalesced
from turnmesh.v1 import event_pb2


async def _batches(*sizes: int) -> AsyncGenerator[list[event_pb2.Event], None]:
    seq = 0
    for size in sizes:
        batch = []
        for _ in range(size):
            seq += 1
            batch.append(event_pb2.Event(seq=seq, delta=f"w{seq} "))
        yield batch


async def test_events_come_one_at_a_time_and_say_how_many_are_in_hand() -> None:
    events = ReadyEvents(_batches(3, 1))
    assert events.ready == 0
    seen = []
    async for event in events:
        seen.append((event.seq, events.ready))
    assert seen == [(1, 2), (2, 1), (3, 0), (4, 0)]


async def _frames(events: ReadyEvents) -> AsyncIterator[httpbody_pb2.HttpBody]:
    yield httpbody_pb2.HttpBody(content_type="text/event-stream", data=b"data: start\n\n")
    async for event in events:
        yield httpbody_pb2.HttpBody(data=f"data: {event.delta}\n\n".encode())
    yield httpbody_pb2.HttpBody(data=b"data: [DONE]\n\n")


async def test_frames_of_events_in_hand_go_with_the_next() -> None:
    events = ReadyEvents(_batches(1, 3, 2))
    bodies = [body async for body in coalesced(_frames(events), lambda: events.ready)]
    assert [b.data.count(b"data: ") for b in bodies] == [1, 1, 3, 2, 1]
    assert bodies[0].content_type == "text/event-stream"  # the stream's type, first
    joined = b"".join(b.data for b in bodies)
    assert (
        joined
        == b"data: start\n\n"
        + b"".join(f"data: w{n} \n\n".encode() for n in range(1, 7))
        + b"data: [DONE]\n\n"
    )


@pytest.mark.parametrize("in_hand", [1, 50])
async def test_a_message_stops_growing_at_the_size_bound(in_hand: int) -> None:
    big = httpbody_pb2.HttpBody(data=b"x" * (MAX_BODY_BYTES // 4))

    async def bodies() -> AsyncIterator[httpbody_pb2.HttpBody]:
        for _ in range(10):
            yield big

    sent = [body async for body in coalesced(bodies(), lambda: in_hand)]
    assert sum(len(b.data) for b in sent) == 10 * len(big.data)
    assert all(len(b.data) <= MAX_BODY_BYTES for b in sent)
    assert len(sent) == 3  # four a message, then four, then the two left


async def test_frames_held_when_the_surface_fails_go_out_before_the_error() -> None:
    async def failing() -> AsyncIterator[httpbody_pb2.HttpBody]:
        yield httpbody_pb2.HttpBody(data=b"data: one\n\n")
        raise RuntimeError("the surface failed")

    sent: list[bytes] = []

    async def read() -> None:
        async for body in coalesced(failing(), lambda: 3):  # more always in hand
            sent.append(body.data)

    with pytest.raises(RuntimeError):
        await read()
    assert sent == [b"data: one\n\n"]
