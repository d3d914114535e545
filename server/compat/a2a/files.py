"""A message's ``raw`` parts as the turn's files, checked under the names an
A2A client sent them by (``message.parts[i]``): the mesh's own types (one it
does not take is ContentTypeNotSupported, as A2A says), count and sizes
(InvalidParams). The turn's validation checks them again; this says which
part, in A2A's words."""

from __future__ import annotations

from collections.abc import Sequence

from a2a.types import a2a_pb2

from turnmesh.files import (
    ALLOWED_MIME_TYPES,
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_TOTAL_FILE_BYTES,
    sniff_problem,
)
from turnmesh.runtime.errors import ContentTypeNotSupported, FieldViolation, InvalidParams
from turnmesh.server.compat._files import guess_mime_type
from turnmesh.v1 import message_pb2

MAX_FILENAME_CHARS = 255
MB = 1024 * 1024


def _invalid(field: str, description: str) -> InvalidParams:
    return InvalidParams([FieldViolation(field, description)])


def raw_file(part: a2a_pb2.Part, where: str) -> message_pb2.File:
    """A raw part as a turn file; its type from ``media_type``, else from
    its filename's extension."""
    if len(part.filename) > MAX_FILENAME_CHARS:
        raise _invalid(f"{where}.filename", f"must be at most {MAX_FILENAME_CHARS} characters")
    mime_type = part.media_type or guess_mime_type(part.filename, f"{where}.media_type")
    if mime_type not in ALLOWED_MIME_TYPES:
        shown = repr(mime_type) if len(mime_type) <= 100 else "given"
        raise ContentTypeNotSupported(
            [
                FieldViolation(
                    f"{where}.media_type",
                    f"type {shown} is not taken (the card's defaultInputModes are)",
                )
            ]
        )
    content = part.raw
    if not content:
        raise _invalid(f"{where}.raw", "must not be empty")
    if len(content) > MAX_FILE_BYTES:
        raise _invalid(f"{where}.raw", f"must be at most {MAX_FILE_BYTES // MB} MB")
    if (problem := sniff_problem(content, mime_type)) is not None:
        raise _invalid(f"{where}.raw", problem)
    return message_pb2.File(content=content, mime_type=mime_type, filename=part.filename)


def check_all(files: Sequence[message_pb2.File]) -> None:
    if len(files) > MAX_FILES:
        raise _invalid("message.parts", f"must hold at most {MAX_FILES} raw parts (files)")
    if sum(len(f.content) for f in files) > MAX_TOTAL_FILE_BYTES:
        raise _invalid(
            "message.parts", f"files must be at most {MAX_TOTAL_FILE_BYTES // MB} MB in all"
        )
