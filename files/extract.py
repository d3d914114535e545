"""Text from a file: plain text, a PDF's text, an office document as Markdown,
an image through Tesseract OCR.

These functions run inside a throwaway process (``files/sandbox.py``) with a
memory and time limit, so a hostile file can only fail itself. Each reader is
also bounded on its own: pages, rows, slides, pixels, unzipped size and output
characters. A problem a user can act on raises ``FileUnreadable`` with a
message fit for them; anything else is reported as a generic failure.

The office formats are read with python-docx, openpyxl and python-pptx and
turned into Markdown here: markitdown does the same on top of those libraries
but pulls in onnxruntime and pandas, hundreds of megabytes for a worker.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import io
import warnings
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from turnmesh.files.types import DOCX, IMAGE_TYPES, MAX_ZIP_ENTRIES, PPTX, TEXT_TYPES, XLSX

MAX_TEXT_CHARS = 200_000
MAX_PDF_PAGES = 2_000
MAX_SHEET_ROWS = 5_000
MAX_IMAGE_PIXELS = 40_000_000
# Office files are zips: refuse bombs before a parser inflates them.
MAX_UNZIPPED_BYTES = 256 * 1024 * 1024
MAX_ZIP_RATIO = 200
OCR_SECONDS = 25

# What a file reads as depends on this module (its limits, its Markdown) and on
# the library that reads its type: bump this when the module changes what a
# file reads as. Texts a worker keeps (worker/extract_cache.py) are keyed by both.
READER_REVISION = 1

# Each accepted type's reader: a name, and the distributions whose code reads it.
READERS: dict[str, tuple[str, tuple[str, ...]]] = {
    **dict.fromkeys(TEXT_TYPES, ("text", ())),
    "application/pdf": ("pdf", ("pypdf",)),
    DOCX: ("docx", ("python-docx",)),
    XLSX: ("xlsx", ("openpyxl",)),
    PPTX: ("pptx", ("python-pptx",)),
    **dict.fromkeys(IMAGE_TYPES, ("ocr", ("pillow", "pytesseract"))),
}


class FileUnreadable(Exception):
    """The file cannot be read; the message says why, for the user."""


class _Full(Exception):
    """The text reached MAX_TEXT_CHARS."""


@dataclass
class Extracted:
    text: str
    truncated: bool = False


class _Text:
    """Collects text up to the limit, then stops the reader."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._size = 0
        self.truncated = False

    def add(self, text: str) -> None:
        room = MAX_TEXT_CHARS - self._size
        if len(text) > room:
            self._parts.append(text[:room])
            self._size = MAX_TEXT_CHARS
            self.truncated = True
            raise _Full
        self._parts.append(text)
        self._size += len(text)

    def result(self) -> Extracted:
        return Extracted("".join(self._parts).strip(), self.truncated)


@functools.cache
def reader_version(mime_type: str) -> str:
    """Which reader reads ``mime_type``, at which version (``pdf/1/pypdf-7.1.1``):
    a new revision of this module or a new library is a new version. The
    versions installed are read once per process, as the fork server imports
    the readers once. The Tesseract program is not named: a text read by an
    older one is still the file's text."""
    name, distributions = READERS.get(mime_type, ("none", ()))
    return "/".join([name, str(READER_REVISION), *(f"{d}-{_installed(d)}" for d in distributions)])


def _installed(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def extract(mime_type: str, content: bytes) -> Extracted:
    out = _Text()
    with contextlib.suppress(_Full):  # the text reached its limit
        if mime_type in TEXT_TYPES:
            out.add(content.decode("utf-8", errors="replace"))
        elif mime_type == "application/pdf":
            _pdf(content, out)
        elif mime_type == DOCX:
            _docx(_checked_zip(content), out)
        elif mime_type == XLSX:
            _xlsx(_checked_zip(content), out)
        elif mime_type == PPTX:
            _pptx(_checked_zip(content), out)
        elif mime_type in IMAGE_TYPES:
            _image(content, out)
        else:
            raise FileUnreadable(f"no reader for {mime_type}")
    return out.result()


def _pdf(content: bytes, out: _Text) -> None:
    from pypdf import PdfReader
    from pypdf.errors import LimitReachedError, PdfReadError

    try:
        reader = PdfReader(io.BytesIO(content))
        if reader.is_encrypted and not reader.decrypt(""):
            raise FileUnreadable("the PDF is encrypted")
        pages = len(reader.pages)
    except LimitReachedError as exc:
        raise FileUnreadable("the PDF is too large or too deeply nested to read") from exc
    except PdfReadError as exc:
        raise FileUnreadable("the PDF is damaged and cannot be read") from exc
    for number in range(min(pages, MAX_PDF_PAGES)):
        out.add(reader.pages[number].extract_text() or "")
        out.add("\n\n")
    if pages > MAX_PDF_PAGES:
        out.truncated = True
        out.add(f"[{pages - MAX_PDF_PAGES} more pages not read]")


def _checked_zip(content: bytes) -> io.BytesIO:
    """The zip, once its entries are known to inflate to a sane size."""
    try:
        with zipfile.ZipFile(io.BytesIO(content)) as archive:
            entries = archive.infolist()
    except zipfile.BadZipFile as exc:
        raise FileUnreadable("the document is damaged (not a valid zip)") from exc
    if len(entries) > MAX_ZIP_ENTRIES:
        raise FileUnreadable(f"the document has {len(entries)} parts, more than {MAX_ZIP_ENTRIES}")
    unzipped = sum(e.file_size for e in entries)
    packed = max(1, sum(e.compress_size for e in entries))
    if unzipped > MAX_UNZIPPED_BYTES or unzipped / packed > MAX_ZIP_RATIO:
        raise FileUnreadable(
            f"the document would unpack to {unzipped // (1024 * 1024)} MB "
            f"({unzipped // packed}x its size): refused as a decompression bomb"
        )
    return io.BytesIO(content)


def _table(rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table; the first row is the header."""
    if not rows:
        return ""
    width = max(len(r) for r in rows)

    def line(cells: Sequence[Any]) -> str:
        values = [_cell(c) for c in cells] + [""] * (width - len(cells))
        return "| " + " | ".join(values) + " |"

    lines = [line(rows[0]), "|" + " --- |" * width, *(line(r) for r in rows[1:])]
    return "\n".join(lines) + "\n\n"


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return " ".join(text.split()).replace("|", "\\|")


def _docx(stream: io.BytesIO, out: _Text) -> None:
    import docx
    from docx.table import Table

    try:
        document = docx.Document(stream)
    except Exception as exc:  # python-docx raises many types for a broken file
        raise FileUnreadable("the Word document is damaged and cannot be read") from exc
    in_list = False
    for block in document.iter_inner_content():
        if isinstance(block, Table):
            text, style = None, ""
        else:
            text = block.text.strip()
            if not text:
                continue
            style = (block.style.name if block.style is not None else "") or ""
        if in_list and not style.startswith("List"):
            out.add("\n")  # a list ends with a blank line in Markdown
        in_list = style.startswith("List")
        if text is None:
            assert isinstance(block, Table)
            out.add(_table([[cell.text for cell in row.cells] for row in block.rows]))
        elif style == "Title":
            out.add(f"# {text}\n\n")
        elif style.startswith("Heading ") and style[8:].isdigit():
            out.add(f"{'#' * min(6, int(style[8:]) + 1)} {text}\n\n")
        elif in_list:
            out.add(f"- {text}\n")
        else:
            out.add(f"{text}\n\n")


def _xlsx(stream: io.BytesIO, out: _Text) -> None:
    import openpyxl

    try:
        workbook = openpyxl.load_workbook(stream, read_only=True, data_only=True)
    except Exception as exc:  # openpyxl raises many types for a broken file
        raise FileUnreadable("the spreadsheet is damaged and cannot be read") from exc
    try:
        for sheet in workbook.worksheets:
            out.add(f"## {sheet.title}\n\n")
            rows, cut = _rows(sheet.iter_rows(values_only=True))
            out.add(_table(rows))
            if cut:
                out.truncated = True
                out.add(f"[rows after the first {MAX_SHEET_ROWS} not read]\n\n")
    finally:
        workbook.close()


def _rows(rows: Iterable[Sequence[Any]]) -> tuple[list[Sequence[Any]], bool]:
    """The non-empty rows, at most MAX_SHEET_ROWS of them (a sheet of
    blank rows is walked no further than that either); and whether any were cut."""
    kept: list[Sequence[Any]] = []
    for seen, row in enumerate(rows):
        if len(kept) >= MAX_SHEET_ROWS or seen >= 2 * MAX_SHEET_ROWS:
            return kept, True
        if any(v is not None and str(v).strip() for v in row):
            kept.append(row)
    return kept, False


def _pptx(stream: io.BytesIO, out: _Text) -> None:
    import pptx

    try:
        presentation = pptx.Presentation(stream)
    except Exception as exc:  # python-pptx raises many types for a broken file
        raise FileUnreadable("the presentation is damaged and cannot be read") from exc
    for number, slide in enumerate(presentation.slides, start=1):
        out.add(f"## Slide {number}\n\n")
        _shapes(slide.shapes, out)
        if slide.has_notes_slide:
            notes = slide.notes_slide.notes_text_frame
            if notes is not None and notes.text.strip():
                out.add(f"Notes: {notes.text.strip()}\n\n")


def _shapes(shapes: Iterable[Any], out: _Text) -> None:
    from pptx.enum.shapes import MSO_SHAPE_TYPE

    for shape in shapes:
        if shape.shape_type == MSO_SHAPE_TYPE.GROUP:
            _shapes(shape.shapes, out)  # grouped text boxes are text too
            continue
        if shape.has_text_frame:
            text = shape.text_frame.text.strip()
            if text:
                out.add(f"{text}\n\n")
        if getattr(shape, "has_table", False) and shape.has_table:
            out.add(_table([[cell.text for cell in row.cells] for row in shape.table.rows]))


def _image(content: bytes, out: _Text) -> None:
    import pytesseract
    from PIL import Image, UnidentifiedImageError

    Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS
    too_big = f"the image has more than {MAX_IMAGE_PIXELS:,} pixels"
    try:
        with warnings.catch_warnings():
            # Pillow warns past the limit and refuses past twice it: we refuse.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image: Image.Image = Image.open(io.BytesIO(content))
        width, height = image.size
        if width * height > MAX_IMAGE_PIXELS:
            raise FileUnreadable(
                f"the image is {width}x{height} pixels, more than {MAX_IMAGE_PIXELS:,}"
            )
        image.load()
    except Image.DecompressionBombError as exc:
        raise FileUnreadable(too_big) from exc
    except (UnidentifiedImageError, OSError) as exc:
        raise FileUnreadable("the image is damaged and cannot be read") from exc
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        # On white, as a viewer shows it: dark text on a transparent
        # background would otherwise become dark text on black.
        rgba = image.convert("RGBA")
        image = Image.new("RGB", rgba.size, "white")
        image.paste(rgba, mask=rgba.getchannel("A"))
    elif image.mode not in ("L", "RGB"):
        image = image.convert("RGB")
    try:
        text = pytesseract.image_to_string(image, timeout=OCR_SECONDS)
    except pytesseract.TesseractNotFoundError as exc:
        raise FileUnreadable("OCR is not installed on this worker") from exc
    except pytesseract.TesseractError as exc:
        raise FileUnreadable("OCR could not read this image") from exc
    except RuntimeError as exc:  # pytesseract's timeout
        raise FileUnreadable("reading the image's text took too long") from exc
    out.add(text)
