"""Large requests serialized without holding the event loop.

Serializing a message is one call into C that holds the GIL from start to
end, wherever it runs: a request carrying 100 MB of files held a server's
event loop for half a second on a busy machine. But concatenated protobuf
messages parse as one (repeated fields append), so a large request is
serialized in a thread a file or message at a time (the event loop runs
between pieces) and handed to gRPC as bytes, through a method whose
serializer passes bytes on as they are.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, TypeVar, cast

import grpc
from google.protobuf.message import Message

M = TypeVar("M", bound=Message)
R = TypeVar("R")

# The size on the wire of the request the current call received.
_RECEIVED: ContextVar[int | None] = ContextVar("turnmesh_received_bytes", default=None)


def note_received(size: int) -> None:
    """Called as a request is decoded, in the call's own context."""
    _RECEIVED.set(size)


def received_bytes() -> int | None:
    """The size on the wire of the request this call received (None outside
    a server's call): what it holds in memory, known without copying a byte."""
    return _RECEIVED.get()


def serialize(head: Message, repeated: Mapping[str, Sequence[Message]]) -> bytes:
    """``head`` with each ``repeated[field]`` appended to its repeated field,
    serialized one element at a time (each element's encoding is one call)."""
    pieces = [head.SerializeToString()]
    for field, items in repeated.items():
        number = head.DESCRIPTOR.fields_by_name[field].number
        for item in items:
            data = item.SerializeToString()
            pieces += (_varint(number << 3 | _LENGTH_DELIMITED), _varint(len(data)), data)
    return b"".join(pieces)


_LENGTH_DELIMITED = 2  # the wire type of an embedded message


def _varint(value: int) -> bytes:
    """Protobuf's base-128 varint (a tag, or a length)."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


async def serialize_off_loop(head: Message, repeated: Mapping[str, Sequence[Message]]) -> bytes:
    return await asyncio.to_thread(serialize, head, repeated)


def _passed(request: bytes) -> bytes:
    return request


def raw_unary_stream(
    channel: grpc.aio.Channel, method: Any, response: type[M]
) -> grpc.aio.UnaryStreamMultiCallable[bytes, M]:
    """A unary-stream method (its descriptor) that sends requests already serialized."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    return channel.unary_stream(path, _passed, response.FromString)


async def responses(call: grpc.aio.UnaryStreamCall[Any, R]) -> AsyncIterator[R]:
    """A call's responses, read one at a time. Iterating the call itself
    makes an async generator that refers to the call as the call refers to
    it: a reader that stops at a final event leaves the pair in a reference
    cycle, and with them the request the call keeps (a turn's files), until
    the cyclic garbage collector runs (with our thresholds, rarely): 15 MiB
    kept for each turn of a 15 MiB file."""
    while (response := await call.read()) is not grpc.aio.EOF:
        yield cast("R", response)
