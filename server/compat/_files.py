"""Attachments on the compatibility surfaces: each API's content parts (OpenAI
chat's ``image_url`` and ``file``, Responses' ``input_image`` and
``input_file``, AG-UI's ``image`` and ``document``) become turn files.

Only inline bytes are accepted (data: URLs or base64): the mesh never fetches
a URL on a caller's behalf, and file ids belong to another provider. The
turn's own validation then checks types, sizes and magic numbers.

A part's form is checked as the request is read (``Inline``); its base64 is
decoded by ``decode``, off the event loop when it is large.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Sequence
from dataclasses import dataclass

from turnmesh.files.types import DOCX, PPTX, XLSX
from turnmesh.runtime import bodies
from turnmesh.server.compat._common import invalid
from turnmesh.v1 import message_pb2

# Where a data: URL's comma must be: its type and parameters are short.
MAX_DATA_URL_HEAD = 1024
_EXTENSIONS = {".docx": DOCX, ".xlsx": XLSX, ".pptx": PPTX, ".md": "text/markdown"}


@dataclass(frozen=True)
class Inline:
    """A file sent inline, its content still base64 from ``data[start:]`` (a
    data: URL's payload is not copied out of it); ``field`` names it in errors."""

    data: str
    mime_type: str
    filename: str
    field: str
    start: int = 0


async def decode(files: Sequence[Inline]) -> list[message_pb2.File]:
    """The files with their bytes; InvalidArgument naming the first that is not base64."""
    return [await bodies.sized(len(file.data), _decode, file) for file in files]


def _decode(file: Inline) -> message_pb2.File:
    try:
        content = bodies.b64decode(file.data, file.start)
    except ValueError as exc:  # binascii.Error, or a character beyond ASCII
        raise invalid(file.field, "must be base64") from exc
    return message_pb2.File(content=content, mime_type=file.mime_type, filename=file.filename)


def guess_mime_type(filename: str, field: str) -> str:
    suffix = filename[filename.rfind(".") :].lower() if "." in filename else ""
    mime_type = _EXTENSIONS.get(suffix) or mimetypes.guess_type(filename)[0]
    if not mime_type:
        raise invalid(
            field, "send a data: URL with the file's type, or a filename with a known extension"
        )
    return mime_type


def from_data_url(url: str, field: str, filename: str = "") -> Inline:
    """``data:<type>[;param=value];base64,<data>`` as a file."""
    if url.startswith(("http://", "https://")):
        raise invalid(field, "must be a data: URL; the mesh does not fetch URLs")
    comma = url.find(",", 0, MAX_DATA_URL_HEAD)
    params = url[:comma].removeprefix("data:").split(";") if comma > 0 else []
    if not url.startswith("data:") or not params or params[-1] != "base64" or not params[0]:
        raise invalid(field, "must be a data: URL with base64 content (data:TYPE;base64,...)")
    return Inline(url, params[0], filename, field, comma + 1)


def from_inline(data: str, filename: str, field: str) -> Inline:
    """A data: URL, or bare base64 whose type comes from the filename."""
    if data.startswith("data:"):
        return from_data_url(data, field, filename)
    return Inline(data, guess_mime_type(filename, field), filename, field)


def unsupported(field: str, what: str) -> Exception:
    return invalid(field, f"{what} are not supported: send the bytes inline (base64)")
