"""Which files a turn accepts, and whether a file's bytes are what it claims.

Sniffing looks at magic numbers only (the first few kilobytes), so it is cheap
enough for a session server to run on every request before anything else
happens; reading the whole file is the worker's job.
"""

from __future__ import annotations

import codecs
import io
import zipfile

import filetype

MAX_FILES = 10
MAX_FILE_BYTES = 50 * 1024 * 1024
MAX_TOTAL_FILE_BYTES = 100 * 1024 * 1024

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
TEXT_TYPES = frozenset({"text/plain", "text/csv", "text/markdown"})
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
OFFICE_TYPES = frozenset({DOCX, XLSX, PPTX})
ALLOWED_MIME_TYPES = frozenset({*TEXT_TYPES, *IMAGE_TYPES, *OFFICE_TYPES, "application/pdf"})

# How much of a file sniffing reads: enough for every magic number, and for
# filetype to find the OOXML part names near the start of the zip.
SNIFF_BYTES = 8192


def _describe(mime: str | None) -> str:
    return mime or "not a recognised binary type"


def sniff_problem(content: bytes, mime_type: str) -> str | None:
    """Why the bytes are not of the declared type, or None when they are."""
    head = content[:SNIFF_BYTES]
    guessed = filetype.guess_mime(head)
    if mime_type in TEXT_TYPES:
        # Only the accepted binary types count: filetype also "recognises"
        # two-byte signatures (BM, MZ) that plenty of text starts with.
        if guessed in ALLOWED_MIME_TYPES:
            return f"declared {mime_type} but the content is {guessed}"
        if b"\x00" in head:
            return f"declared {mime_type} but the content is binary"
        decoder = codecs.getincrementaldecoder("utf-8")()
        try:
            # Not final: the sample may end inside a multi-byte character.
            decoder.decode(head, final=len(content) <= SNIFF_BYTES)
        except UnicodeDecodeError:
            return f"declared {mime_type} but the content is not UTF-8 text"
        return None
    if mime_type in OFFICE_TYPES and guessed in ("application/zip", *OFFICE_TYPES):
        # filetype finds the part names only among the first few entries;
        # the zip's own directory says for sure.
        guessed = _office_type(content) or guessed
    if guessed != mime_type:
        return f"declared {mime_type} but the content is {_describe(guessed)}"
    return None


# The part every document of the type has.
_MAIN_PARTS = {"word/document.xml": DOCX, "xl/workbook.xml": XLSX, "ppt/presentation.xml": PPTX}
# More entries, or a bigger directory, than this is not a document we read
# (nor cheap to list here: the session server sniffs on its event loop).
MAX_ZIP_ENTRIES = 5_000
MAX_ZIP_DIRECTORY_BYTES = 256 * 1024


def _office_type(content: bytes) -> str | None:
    """The OOXML type by the zip's part names. The end record's counts are
    checked first, and zipfile reads no more of the directory than the
    record's size says, so a zip that lies about its entry count (one entry
    claimed, a million listed) costs at most MAX_ZIP_DIRECTORY_BYTES."""
    tail = content[-(65_535 + 22) :]
    end = tail.rfind(b"PK\x05\x06")
    if end < 0 or len(tail) < end + 20:
        return None
    if int.from_bytes(tail[end + 10 : end + 12], "little") > MAX_ZIP_ENTRIES:
        return None
    if int.from_bytes(tail[end + 12 : end + 16], "little") > MAX_ZIP_DIRECTORY_BYTES:
        return None
    if end >= 20 and tail[end - 20 : end - 16] == b"PK\x06\x07":
        return None  # ZIP64: zipfile would take its own (unchecked) counts
    try:
        with zipfile.ZipFile(io.BytesIO(content)) as archive:
            names = set(archive.namelist())
    except (zipfile.BadZipFile, ValueError):
        return None
    return next((kind for part, kind in _MAIN_PARTS.items() if part in names), None)
