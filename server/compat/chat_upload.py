"""Simple chat's multipart/form-data forms (HoloDeck's uploads): a form read
into the ``ChatRequest`` its JSON form would be, then answered by the same
code (``simple_chat``), printed as the transcoder prints ``Chat`` and
``ChatStream``.

The form: ``message``, ``session_id`` and ``agent_name`` text fields (each at
most once), and ``files`` parts, each with its own ``Content-Type`` and
``filename``. Other fields are ignored, as HoloDeck's form parser does. The
parser is python-multipart's streaming one (the maintained parser behind
Starlette's forms), bounded: at most ``MAX_PARTS`` parts, ``MAX_FILES``
files, and part headers of its own default size and count.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from google.api import httpbody_pb2
from google.protobuf import json_format
from python_multipart import MultipartParser
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartState, parse_options_header

from turnmesh.files import MAX_FILES
from turnmesh.runtime import receipts, sse
from turnmesh.server.compat._common import invalid, json_body
from turnmesh.v1 import chat_upload_pb2, event_pb2, message_pb2
from turnmesh.v1 import compat_service_pb2 as cpb

# Parts a form may hold: every file, the text fields, and a few the client
# adds that are ignored.
MAX_PARTS = MAX_FILES + 16
TEXT_FIELDS = ("message", "session_id", "agent_name")
FILES_FIELD = "files"
MULTIPART = b"multipart/form-data"
# RFC 2046's limit on a boundary (python-multipart refuses longer ones).
MAX_BOUNDARY_BYTES = 70
# A form this large is parsed off the event loop.
PARSE_IN_THREAD_BYTES = 1024 * 1024


@dataclass
class _Part:
    headers: dict[bytes, bytes] = field(default_factory=dict)
    chunks: list[bytes] = field(default_factory=list)


class _Form:
    """The parts as python-multipart's callbacks hand them over."""

    def __init__(self) -> None:
        self.parts: list[_Part] = []
        self._field = b""
        self._value = b""
        self.too_many = False

    def on_part_begin(self) -> None:
        if len(self.parts) >= MAX_PARTS:
            self.too_many = True
            raise MultipartParseError("too many parts")
        self.parts.append(_Part())

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        self.parts[-1].chunks.append(data[start:end])

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def on_header_end(self) -> None:
        self.parts[-1].headers[self._field.strip().lower()] = self._value.strip()
        self._field = self._value = b""

    def callbacks(self) -> Any:
        return {
            "on_part_begin": self.on_part_begin,
            "on_part_data": self.on_part_data,
            "on_header_field": self.on_header_field,
            "on_header_value": self.on_header_value,
            "on_header_end": self.on_header_end,
        }


def _boundary(content_type: str) -> bytes:
    try:
        kind, options = parse_options_header(content_type)
    except UnicodeEncodeError:  # not Latin-1: no header a form sends
        kind, options = b"", {}
    boundary = options.get(b"boundary", b"")
    if kind != MULTIPART or not boundary or len(boundary) > MAX_BOUNDARY_BYTES:
        raise invalid("Content-Type", "must be multipart/form-data with a boundary")
    return boundary


def _parts(content_type: str, data: bytes) -> list[_Part]:
    form = _Form()
    parser = MultipartParser(_boundary(content_type), form.callbacks())
    try:
        parser.write(data)
        parser.finalize()
        if parser.state != MultipartState.END:  # cut short: no closing boundary
            raise MultipartParseError("the form ends before its closing boundary")
    except MultipartParseError:
        if form.too_many:
            raise invalid("body", f"a form holds at most {MAX_PARTS} parts") from None
        raise invalid("body", "is not a well-formed multipart/form-data body") from None
    return form.parts


def _text(part: _Part, name: str) -> str:
    try:
        return b"".join(part.chunks).decode()
    except UnicodeDecodeError:
        raise invalid(name, "must be UTF-8 text") from None


def _read(content_type: str, data: bytes, agent_name: str) -> cpb.ChatRequest:
    request = cpb.ChatRequest()
    seen: set[str] = set()
    files = 0
    for part in _parts(content_type, data):
        disposition, options = parse_options_header(part.headers.get(b"content-disposition"))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        if disposition != b"form-data" or not name:
            raise invalid("body", "each part must be form-data with a name")
        if name == FILES_FIELD:
            files += 1
            if files > MAX_FILES:
                raise invalid(FILES_FIELD, f"at most {MAX_FILES} files")
            mime = part.headers.get(b"content-type", b"application/octet-stream")
            filename = options.get(b"filename", b"").decode("utf-8", "replace")
            request.files.append(
                message_pb2.File(
                    content=b"".join(part.chunks),
                    mime_type=parse_options_header(mime)[0].decode("latin-1"),
                    filename=filename,
                )
            )
        elif name in TEXT_FIELDS:
            if name in seen:
                raise invalid(name, "given more than once")
            seen.add(name)
            setattr(request, name, _text(part, name))
        part.chunks.clear()  # its bytes are in the request now (or ignored)
    if agent_name:
        if request.agent_name and request.agent_name != agent_name:
            raise invalid("agent_name", "differs from the agent the path names")
        request.agent_name = agent_name
    return request


async def read(request: chat_upload_pb2.UploadChatRequest) -> cpb.ChatRequest:
    """The form as a ``ChatRequest``; 400 for a body that is not one."""
    body: httpbody_pb2.HttpBody = request.body
    try:
        if len(body.data) > PARSE_IN_THREAD_BYTES:
            return await asyncio.to_thread(_read, body.content_type, body.data, request.agent_name)
        return _read(body.content_type, body.data, request.agent_name)
    finally:
        receipts.decoded()  # the call's receipt slot, kept until the form was read


def response_body(response: cpb.ChatResponse) -> httpbody_pb2.HttpBody:
    """``Chat``'s answer as the transcoder prints a unary answer: every field,
    zero or empty too, by its JSON name."""
    return json_body(json_format.MessageToDict(response, always_print_fields_with_no_presence=True))


def event_body(event: event_pb2.Event) -> httpbody_pb2.HttpBody:
    """One ``ChatStream`` event as the transcoder's SSE frame: set fields only."""
    return httpbody_pb2.HttpBody(content_type=sse.CONTENT_TYPE, data=sse.frames([event]))
