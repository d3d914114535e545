"""Attachments on the compatibility surfaces: each API's content parts (OpenAI
chat's ``image_url`` and ``file``, Responses' ``input_image`` and
``input_file``, AG-UI's ``image`` and ``document``) become turn files.

Only inline bytes are accepted (data: URLs or base64): the mesh never fetches
a URL on a caller's behalf, and file ids belong to another provider. The
turn's own validation then checks types, sizes and magic numbers.
"""

from __future__ import annotations

import base64
import binascii
import mimetypes

from turnmesh.files.types import DOCX, PPTX, XLSX
from turnmesh.server.compat._common import invalid
from turnmesh.v1 import message_pb2

_EXTENSIONS = {".docx": DOCX, ".xlsx": XLSX, ".pptx": PPTX, ".md": "text/markdown"}


def decode_base64(value: str, field: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise invalid(field, "must be base64") from exc


def guess_mime_type(filename: str, field: str) -> str:
    suffix = filename[filename.rfind(".") :].lower() if "." in filename else ""
    mime_type = _EXTENSIONS.get(suffix) or mimetypes.guess_type(filename)[0]
    if not mime_type:
        raise invalid(
            field, "send a data: URL with the file's type, or a filename with a known extension"
        )
    return mime_type


def from_data_url(url: str, field: str, filename: str = "") -> message_pb2.File:
    """``data:<type>[;param=value];base64,<data>`` as a file."""
    if url.startswith(("http://", "https://")):
        raise invalid(field, "must be a data: URL; the mesh does not fetch URLs")
    head, comma, data = url.partition(",")
    params = head.removeprefix("data:").split(";")
    if not url.startswith("data:") or not comma or params[-1] != "base64" or not params[0]:
        raise invalid(field, "must be a data: URL with base64 content (data:TYPE;base64,...)")
    return message_pb2.File(
        content=decode_base64(data, field), mime_type=params[0], filename=filename
    )


def from_inline(data: str, filename: str, field: str) -> message_pb2.File:
    """A data: URL, or bare base64 whose type comes from the filename."""
    if data.startswith("data:"):
        return from_data_url(data, field, filename)
    return message_pb2.File(
        content=decode_base64(data, field),
        mime_type=guess_mime_type(filename, field),
        filename=filename,
    )


def unsupported(field: str, what: str) -> Exception:
    return invalid(field, f"{what} are not supported: send the bytes inline (base64)")
