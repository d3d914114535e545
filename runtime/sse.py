"""Events as the edge's SSE frames, printed in Python byte for byte as
Envoy's JSON transcoder prints them on the streamed routes.

The REST event streams (``EventStreamService``) send several frames in one
message when the caller's stream is backed up, so their JSON is printed
here, not by the transcoder; clients and tests see the same bytes either way
(``tests/integration/test_sse_printing.py`` holds this printer to the real
transcoder). Written by hand because no library prints protobuf's C++ JSON:
``json_format`` differs in doubles (``1.0`` where C++ prints ``1``) and in the
characters C++ escapes (``<``, ``>``, DEL, C1 controls and invisible format
characters such as U+2028, which ``json`` leaves as they are).

The transcoder's streamed print options: set fields only (proto3 scalars at
zero, empty lists and unset messages are left out), lowerCamelCase names,
enums by name, no whitespace. One difference no printer can remove: the
members of a ``google.protobuf.Struct`` (tool results, custom values, answer
schemas) come out in C++'s hash map order there and sorted here; each member
prints the same.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncGenerator, Callable, Iterable
from typing import Any

from google.api import httpbody_pb2
from google.protobuf import descriptor, message, struct_pb2, timestamp_pb2

from turnmesh.v1 import event_pb2

CONTENT_TYPE = "text/event-stream"

# The characters protobuf's C++ JSON writer escapes beyond JSON's own
# (quotes, backslash and C0 controls, which json.dumps escapes alike).
_CPP_ESCAPED = re.compile(
    "[<>\x7f-\x9f\xad\u0600-\u0603\u06dd\u070f\u17b4\u17b5\u200b-\u200f\u2028-\u202e"
    "\u2060-\u2064\u206a-\u206f\ufeff\ufff9-\ufffb\U0001d173-\U0001d17a\U000e0001"
    "\U000e0020-\U000e007f]"
)

_encode_string: Callable[[str], str] = json.encoder.encode_basestring

_TYPE = descriptor.FieldDescriptor


def _escape_one(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, as C++ writes it
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def string(value: str) -> str:
    """A JSON string as protobuf's C++ writer prints it."""
    text = _encode_string(value)
    if _CPP_ESCAPED.search(text) is None:
        return text
    return _CPP_ESCAPED.sub(_escape_one, text)


def number(value: float) -> str:
    """A double as protobuf's C++ writer prints it (its ``SimpleDtoa``: 15
    significant digits when they read back exactly, else 17)."""
    if value != value:
        return '"NaN"'
    if value in (float("inf"), float("-inf")):
        return '"Infinity"' if value > 0 else '"-Infinity"'
    text = f"{value:.15g}"
    if float(text) != value:
        text = f"{value:.17g}"
    return text


def _value(value: struct_pb2.Value) -> str:
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return string(value.string_value)
    if kind == "number_value":
        return number(value.number_value)
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    if kind == "struct_value":
        return _struct(value.struct_value)
    if kind == "list_value":
        return _list(value.list_value)
    return "null"


def _struct(value: struct_pb2.Struct) -> str:
    # C++ prints a Struct's members in its hash map's order, which nothing
    # can reproduce (or rely on): sorted here, so the same value prints alike.
    fields = value.fields
    return "{" + ",".join(f"{string(k)}:{_value(fields[k])}" for k in sorted(fields)) + "}"


def _list(value: struct_pb2.ListValue) -> str:
    return "[" + ",".join(_value(v) for v in value.values) + "]"


def _timestamp(value: timestamp_pb2.Timestamp) -> str:
    return '"' + value.ToJsonString() + '"'


# Well-known types print as their JSON forms, not as messages.
_WELL_KNOWN: dict[str, Callable[[Any], str]] = {
    "google.protobuf.Struct": _struct,
    "google.protobuf.Value": _value,
    "google.protobuf.ListValue": _list,
    "google.protobuf.Timestamp": _timestamp,
}


def _scalar(field: descriptor.FieldDescriptor) -> Callable[[Any], str]:
    kind = field.type
    if kind == _TYPE.TYPE_STRING:
        return string
    if kind in (_TYPE.TYPE_DOUBLE, _TYPE.TYPE_FLOAT):
        return number
    if kind == _TYPE.TYPE_BOOL:
        return lambda v: "true" if v else "false"
    if kind == _TYPE.TYPE_ENUM and field.enum_type is not None:
        names = {v.number: v.name for v in field.enum_type.values}
        return lambda v: f'"{names[v]}"' if v in names else str(v)
    if kind in (_TYPE.TYPE_INT32, _TYPE.TYPE_SINT32, _TYPE.TYPE_SFIXED32, _TYPE.TYPE_UINT32):
        return str
    if kind == _TYPE.TYPE_FIXED32:
        return str
    if kind == _TYPE.TYPE_MESSAGE and field.message_type is not None:
        return printer(field.message_type)
    # 64-bit integers print as strings; bytes as base64. No event field has them.
    raise TypeError(f"no JSON printing for {field.full_name}")


_PRINTERS: dict[str, Callable[[Any], str]] = {}

# Field kinds the printer's loop handles inline.
_STRING, _INT, _DOUBLE, _OTHER = range(4)
_KINDS = {
    _TYPE.TYPE_STRING: _STRING,
    _TYPE.TYPE_INT32: _INT,
    _TYPE.TYPE_SINT32: _INT,
    _TYPE.TYPE_SFIXED32: _INT,
    _TYPE.TYPE_UINT32: _INT,
    _TYPE.TYPE_FIXED32: _INT,
    _TYPE.TYPE_DOUBLE: _DOUBLE,
}


def printer(desc: descriptor.Descriptor) -> Callable[[Any], str]:
    """A function printing messages of ``desc`` as the transcoder does."""
    found = _PRINTERS.get(desc.full_name)
    if found is not None:
        return found
    well_known = _WELL_KNOWN.get(desc.full_name)
    if well_known is not None:
        return well_known
    # Each field: its `"jsonName":`, and how its value prints: a kind the
    # loop prints itself (no call for the common fields), or a function.
    fields: dict[int, tuple[str, int, Callable[[Any], str]]] = {}

    def entry(field: descriptor.FieldDescriptor) -> tuple[str, int, Callable[[Any], str]]:
        key = string(field.json_name) + ":"
        if field.is_repeated:
            scalar = _scalar(field)
            return key, _OTHER, lambda values: "[" + ",".join(map(scalar, values)) + "]"
        kind = _KINDS.get(field.type, _OTHER)
        return key, kind, _scalar(field)

    def render(msg: message.Message) -> str:
        parts = []
        for field, value in msg.ListFields():
            found = fields.get(field.number)
            if found is None:
                found = fields[field.number] = entry(field)
            key, kind, scalar = found
            if kind == _STRING:
                text = _encode_string(value)
                if _CPP_ESCAPED.search(text) is not None:
                    text = _CPP_ESCAPED.sub(_escape_one, text)
                parts.append(key + text)
            elif kind == _INT:
                parts.append(key + str(value))
            elif kind == _DOUBLE and value.is_integer() and 0 < abs(value) < 1e15:
                parts.append(key + str(int(value)))  # what %.15g prints for it
            else:
                parts.append(key + scalar(value))
        return "{" + ",".join(parts) + "}"

    _PRINTERS[desc.full_name] = render
    return render


_event_json = printer(event_pb2.Event.DESCRIPTOR)


def event_json(event: event_pb2.Event) -> str:
    """An event as the transcoder prints it on a streamed route."""
    return _event_json(event)


def frames(events: Iterable[event_pb2.Event]) -> bytes:
    """Events as SSE frames, one ``data: <json>`` frame each."""
    return "".join([f"data: {_event_json(e)}\n\n" for e in events]).encode()


# The most one streamed message carries: a batch of large events goes out in
# several messages of about this size.
MAX_BODY_BYTES = 256 * 1024


async def bodies(
    batches: AsyncGenerator[list[event_pb2.Event], None],
) -> AsyncGenerator[httpbody_pb2.HttpBody, None]:
    """Each batch of events as one SSE message (or a few, past
    ``MAX_BODY_BYTES``): one message for every event ready at once."""
    async with contextlib.aclosing(batches):
        async for batch in batches:
            parts: list[bytes] = []
            size = 0
            for event in batch:
                # Counted in bytes: the JSON keeps non-ASCII text as UTF-8.
                frame = f"data: {_event_json(event)}\n\n".encode()
                parts.append(frame)
                size += len(frame)
                if size >= MAX_BODY_BYTES:
                    yield _body(parts)
                    parts, size = [], 0
            if parts:
                yield _body(parts)


def _body(parts: list[bytes]) -> httpbody_pb2.HttpBody:
    return httpbody_pb2.HttpBody(content_type=CONTENT_TYPE, data=b"".join(parts))
