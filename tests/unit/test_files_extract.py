"""Attachment reading in-process: magic-number sniffing (``files/types.py``) and
text extraction with its limits and Markdown shapes (``files/extract.py``)."""

from __future__ import annotations

import io
import os
import struct
import zipfile
import zlib
from typing import Any

import docx as python_docx
import openpyxl
import pptx as python_pptx
import pytest
from docx.document import Document as WordDocument
from PIL import Image, ImageDraw, ImageFont
from pptx.presentation import Presentation
from pptx.util import Inches
from pypdf import PdfWriter

import turnmesh.files
from tests.support import samples
from turnmesh.files import extract as ex
from turnmesh.files.extract import Extracted, FileUnreadable, extract
from turnmesh.files.types import (
    ALLOWED_MIME_TYPES,
    DOCX,
    IMAGE_TYPES,
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_TOTAL_FILE_BYTES,
    OFFICE_TYPES,
    PPTX,
    SNIFF_BYTES,
    TEXT_TYPES,
    XLSX,
    sniff_problem,
)

PDF = "application/pdf"
OFFICE = [DOCX, XLSX, PPTX]


@pytest.fixture(autouse=True)
def _restore_pillow_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``extract`` sets Pillow's global pixel limit; keep it from leaking."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)


def _save(document: WordDocument | Presentation) -> bytes:
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def _zip(entries: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", method) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return out.getvalue()


def _blank_pdf(pages: int) -> bytes:
    writer = PdfWriter()
    for _ in range(pages):
        writer.add_blank_page(100, 100)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def _png(width: int, height: int, mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    Image.new(mode, (width, height), "white").save(out, "PNG")
    return out.getvalue()


def _unreadable(mime_type: str, content: bytes) -> str:
    with pytest.raises(FileUnreadable) as caught:
        extract(mime_type, content)
    return str(caught.value)


# --- types.py: constants ----------------------------------------------------


def test_allowed_types_are_text_images_office_and_pdf() -> None:
    assert sorted(TEXT_TYPES) == ["text/csv", "text/markdown", "text/plain"]
    assert sorted(IMAGE_TYPES) == ["image/gif", "image/jpeg", "image/png", "image/webp"]
    assert sorted(OFFICE_TYPES) == sorted([DOCX, XLSX, PPTX])
    assert sorted(ALLOWED_MIME_TYPES) == sorted([*TEXT_TYPES, *IMAGE_TYPES, *OFFICE_TYPES, PDF])
    assert len(ALLOWED_MIME_TYPES) == 11
    # The samples speak the same official OOXML names.
    assert (DOCX, XLSX, PPTX) == (samples.DOCX, samples.XLSX, samples.PPTX)
    assert turnmesh.files.ALLOWED_MIME_TYPES is ALLOWED_MIME_TYPES
    assert turnmesh.files.sniff_problem is sniff_problem


def test_size_limits_are_consistent() -> None:
    assert MAX_FILES >= 1
    assert 0 < MAX_FILE_BYTES <= MAX_TOTAL_FILE_BYTES
    assert MAX_TOTAL_FILE_BYTES <= MAX_FILES * MAX_FILE_BYTES
    assert (turnmesh.files.MAX_FILES, turnmesh.files.MAX_FILE_BYTES) == (MAX_FILES, MAX_FILE_BYTES)
    assert turnmesh.files.MAX_TOTAL_FILE_BYTES == MAX_TOTAL_FILE_BYTES


# --- types.py: sniff_problem ------------------------------------------------


@pytest.mark.parametrize("mime_type", sorted(ALLOWED_MIME_TYPES))
def test_sniff_accepts_a_real_file_of_every_allowed_type(mime_type: str) -> None:
    assert sniff_problem(samples.minimal(mime_type), mime_type) is None


@pytest.mark.parametrize(
    ("content_type", "declared"),
    [
        ("image/png", "image/jpeg"),
        ("image/jpeg", "image/png"),
        ("image/gif", "image/webp"),
        (PDF, DOCX),
        (DOCX, XLSX),
        (XLSX, PPTX),
        (PPTX, DOCX),
        (DOCX, PDF),
        ("image/png", "text/plain"),
        (PDF, "text/markdown"),
    ],
)
def test_sniff_names_the_real_type_when_it_differs(content_type: str, declared: str) -> None:
    problem = sniff_problem(samples.minimal(content_type), declared)
    assert problem == f"declared {declared} but the content is {content_type}"


def test_sniff_rejects_unrecognised_bytes_for_a_binary_type() -> None:
    problem = sniff_problem(b"hello, just text\n", "image/png")
    assert problem == "declared image/png but the content is not a recognised binary type"
    assert sniff_problem(b"", PDF) == (
        "declared application/pdf but the content is not a recognised binary type"
    )


def test_sniff_rejects_a_plain_zip_declared_as_office() -> None:
    problem = sniff_problem(_zip({"notes.txt": b"hello" * 100}), DOCX)
    assert problem == f"declared {DOCX} but the content is application/zip"


def _lying_zip(entries: int) -> bytes:
    """A docx-looking zip whose directory lists ``entries`` parts while its
    end record claims one (the directory size it states is the true one)."""
    # The main part last: only the directory can tell what this is.
    content = bytearray(
        _zip({**{f"p/{i}": b"" for i in range(entries)}, "word/document.xml": b"<w/>"})
    )
    end = content.rfind(b"PK\x05\x06")
    content[end + 8 : end + 12] = struct.pack("<HH", 1, 1)
    return bytes(content)


def test_sniff_never_lists_a_zip_directory_past_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One entry claimed, 20,000 listed: the directory's stated size gives it
    away, and zipfile is never asked to list it (that cost 10 s per file on
    the server's event loop with a million entries)."""
    lying, small = _lying_zip(20_000), _lying_zip(10)
    opened: list[object] = []
    real = zipfile.ZipFile

    def counted(*args: Any, **kwargs: Any) -> zipfile.ZipFile:
        opened.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(zipfile, "ZipFile", counted)
    assert sniff_problem(lying, DOCX) == f"declared {DOCX} but the content is application/zip"
    assert opened == []
    # A real document of the same shape, small, is still read and accepted.
    assert sniff_problem(small, DOCX) is None
    assert len(opened) == 1


def test_sniff_leaves_zip64_directories_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    content = bytearray(_zip({"notes.txt": b"x" * 100, "word/document.xml": b"<w/>"}))
    end = content.rfind(b"PK\x05\x06")
    locator = b"PK\x06\x07" + bytes(16)  # a ZIP64 end locator just before the end record
    patched = bytes(content[:end]) + locator + bytes(content[end:])
    monkeypatch.setattr(zipfile, "ZipFile", lambda *a, **k: pytest.fail("listed a ZIP64 zip"))
    assert sniff_problem(patched, DOCX) is not None


@pytest.mark.parametrize("mime_type", sorted(TEXT_TYPES))
def test_sniff_accepts_utf8_text(mime_type: str) -> None:
    assert sniff_problem("naïve café, 東京 ✓\n".encode(), mime_type) is None
    assert sniff_problem(b"", mime_type) is None


def test_sniff_rejects_text_with_nul_bytes() -> None:
    problem = sniff_problem(b"abc\x00def", "text/plain")
    assert problem == "declared text/plain but the content is binary"


def test_sniff_rejects_text_that_is_not_utf8() -> None:
    problem = sniff_problem("café".encode("latin-1"), "text/csv")
    assert problem == "declared text/csv but the content is not UTF-8 text"


def test_sniff_allows_a_multibyte_character_cut_by_the_sample() -> None:
    content = b"a" + "é".encode() * SNIFF_BYTES  # byte SNIFF_BYTES is mid-character
    assert content[:SNIFF_BYTES].decode("utf-8", errors="replace").endswith("\ufffd")
    assert sniff_problem(content, "text/plain") is None


def test_sniff_rejects_a_short_text_ending_inside_a_character() -> None:
    content = "café".encode()[:-1]
    assert len(content) <= SNIFF_BYTES
    assert sniff_problem(content, "text/plain") == (
        "declared text/plain but the content is not UTF-8 text"
    )


def test_sniff_reads_only_the_first_kilobytes() -> None:
    content = b"a" * SNIFF_BYTES + b"\xff\x00 not text after the sample"
    assert sniff_problem(content, "text/plain") is None


def test_sniff_accepts_csv_starting_with_bm() -> None:
    assert sniff_problem(b"BMI,weight\n22.5,70\n", "text/csv") is None


def test_sniff_accepts_a_docx_whose_word_part_is_not_among_the_first_entries() -> None:
    source = zipfile.ZipFile(io.BytesIO(samples.docx("hello")))
    names = source.namelist()
    assert names[0] == "[Content_Types].xml"
    entries = {names[0]: source.read(names[0]), "docProps/custom.xml": os.urandom(7000)}
    entries.update((name, source.read(name)) for name in names[1:])
    content = _zip(entries)
    assert "hello" in extract(DOCX, content).text  # a valid Word document
    assert sniff_problem(content, DOCX) is None


# --- extract.py: text -------------------------------------------------------


@pytest.mark.parametrize("mime_type", sorted(TEXT_TYPES))
def test_text_is_returned_stripped(mime_type: str) -> None:
    assert extract(mime_type, "  # Héllo\n\nwörld\n\n".encode()) == Extracted("# Héllo\n\nwörld")


def test_invalid_utf8_becomes_replacement_characters() -> None:
    result = extract("text/plain", b"caf\xe9 \xff\xfe ok \xe2\x82")
    assert result == Extracted("caf\ufffd \ufffd\ufffd ok \ufffd")


def test_text_at_the_limit_is_whole() -> None:
    for size in (ex.MAX_TEXT_CHARS - 1, ex.MAX_TEXT_CHARS):
        result = extract("text/plain", b"a" * size)
        assert (len(result.text), result.truncated) == (size, False)


def test_text_over_the_limit_is_cut_at_exactly_the_limit() -> None:
    result = extract("text/plain", b"a" * (ex.MAX_TEXT_CHARS + 1))
    assert result.truncated is True
    assert len(result.text) == ex.MAX_TEXT_CHARS


def test_text_limit_counts_characters_not_bytes() -> None:
    result = extract("text/plain", "é".encode() * (ex.MAX_TEXT_CHARS + 10))
    assert result.truncated is True
    assert result.text == "é" * ex.MAX_TEXT_CHARS


def test_unknown_type_has_no_reader() -> None:
    assert _unreadable("application/zip", b"PK") == "no reader for application/zip"


# --- extract.py: PDF --------------------------------------------------------


def test_pdf_text_from_every_page() -> None:
    result = extract(PDF, samples.pdf("Quarterly report", "Revenue grew 12%", pages=2))
    assert result.truncated is False
    assert result.text.count("Quarterly report") == 2
    assert result.text.count("Revenue grew 12%") == 2


def test_pdf_over_the_page_limit_says_how_many_pages_were_not_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ex, "MAX_PDF_PAGES", 4)
    result = extract(PDF, _blank_pdf(4 + 3))
    assert result == Extracted("[3 more pages not read]", truncated=True)


def test_pdf_at_the_page_limit_is_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex, "MAX_PDF_PAGES", 4)
    assert extract(PDF, _blank_pdf(4)) == Extracted("", truncated=False)


def test_pdf_pages_past_the_limit_are_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex, "MAX_PDF_PAGES", 2)
    result = extract(PDF, samples.pdf("Chapter text", pages=5))
    assert result.truncated is True
    assert result.text.count("Chapter text") == 2
    assert result.text.endswith("[3 more pages not read]")


def test_pdf_text_limit_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex, "MAX_TEXT_CHARS", 30)
    result = extract(PDF, samples.pdf("A sentence long enough to be cut short", pages=3))
    assert result.truncated is True
    assert result.text == "A sentence long enough to be c"


@pytest.mark.parametrize("algorithm", ["RC4-128", "AES-256"])
def test_encrypted_pdf_is_unreadable(algorithm: str) -> None:
    writer = PdfWriter(clone_from=io.BytesIO(samples.pdf("Secret 42")))
    writer.encrypt("pw", algorithm=algorithm)
    out = io.BytesIO()
    writer.write(out)
    assert _unreadable(PDF, out.getvalue()) == "the PDF is encrypted"


def test_pdf_encrypted_with_an_empty_user_password_is_read() -> None:
    writer = PdfWriter(clone_from=io.BytesIO(samples.pdf("Secret 42")))
    writer.encrypt("", "owner password")
    out = io.BytesIO()
    writer.write(out)
    assert extract(PDF, out.getvalue()).text == "Secret 42"


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not a pdf at all",
        b"%PDF-1.4\ngarbage with no objects",
        samples.pdf("hello")[:200],
    ],
    ids=["empty", "not-pdf", "garbage", "truncated"],
)
def test_damaged_pdf_is_unreadable(content: bytes) -> None:
    assert _unreadable(PDF, content) == "the PDF is damaged and cannot be read"


# --- extract.py: office zips ------------------------------------------------


@pytest.mark.parametrize(
    ("mime_type", "message"),
    [
        (DOCX, "the Word document is damaged and cannot be read"),
        (XLSX, "the spreadsheet is damaged and cannot be read"),
        (PPTX, "the presentation is damaged and cannot be read"),
    ],
)
def test_zip_that_is_not_the_document_is_damaged(mime_type: str, message: str) -> None:
    assert _unreadable(mime_type, _zip({"notes.txt": b"hello"})) == message


@pytest.mark.parametrize("mime_type", OFFICE)
def test_non_zip_office_file_is_damaged(mime_type: str) -> None:
    message = _unreadable(mime_type, b"this is not a zip archive")
    assert message == "the document is damaged (not a valid zip)"


@pytest.mark.parametrize("mime_type", OFFICE)
def test_truncated_office_file_is_damaged(mime_type: str) -> None:
    content = samples.minimal(mime_type)
    assert "damaged" in _unreadable(mime_type, content[: len(content) // 2])


@pytest.mark.parametrize("mime_type", OFFICE)
def test_zip_bomb_by_ratio_is_refused(mime_type: str) -> None:
    content = _zip({"[Content_Types].xml": b"\0" * (2 * 1024 * 1024)})
    assert len(content) * ex.MAX_ZIP_RATIO < 2 * 1024 * 1024
    message = _unreadable(mime_type, content)
    assert "decompression bomb" in message
    assert message.startswith("the document would unpack to 2 MB (")


@pytest.mark.parametrize("mime_type", OFFICE)
def test_zip_bomb_by_total_size_is_refused(mime_type: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex, "MAX_UNZIPPED_BYTES", 40_000)
    # Stored, incompressible: the ratio is about 1, only the size is too big.
    content = _zip({"a.bin": os.urandom(20_001), "b.bin": os.urandom(20_000)}, zipfile.ZIP_STORED)
    message = _unreadable(mime_type, content)
    assert "decompression bomb" in message
    assert "(0x its size)" in message or "(1x its size)" in message


@pytest.mark.parametrize("mime_type", OFFICE)
def test_zip_at_the_size_limit_is_not_a_bomb(
    mime_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ex, "MAX_UNZIPPED_BYTES", 40_000)
    content = _zip({"a.bin": os.urandom(20_000), "b.bin": os.urandom(20_000)}, zipfile.ZIP_STORED)
    assert "damaged" in _unreadable(mime_type, content)


@pytest.mark.parametrize("mime_type", OFFICE)
def test_zip_with_too_many_entries_is_refused(
    mime_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ex, "MAX_ZIP_ENTRIES", 5)
    content = _zip({f"part{n}.xml": b"<x/>" for n in range(6)})
    assert _unreadable(mime_type, content) == "the document has 6 parts, more than 5"
    at_limit = _zip({f"part{n}.xml": b"<x/>" for n in range(5)})
    assert "parts" not in _unreadable(mime_type, at_limit)


def test_real_office_files_pass_the_bomb_checks_at_the_default_limits() -> None:
    for mime_type in OFFICE:
        assert extract(mime_type, samples.minimal(mime_type)).text


# --- extract.py: Word -------------------------------------------------------


def test_docx_headings_lists_and_tables_become_markdown() -> None:
    document = python_docx.Document()
    document.add_heading("Annual report", level=0)
    document.add_heading("Scope", level=1)
    document.add_paragraph("Plain words.")
    document.add_paragraph("   ")
    document.add_heading("Detail", level=2)
    document.add_paragraph("first point", style="List Bullet")
    document.add_paragraph("second point", style="List Number")
    document.add_heading("Very deep", level=9)
    table = document.add_table(rows=3, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "item", "note"
    table.cell(1, 0).text, table.cell(1, 1).text = "a|b", "two\nlines"
    table.cell(2, 0).text = "lanterns"
    document.add_paragraph("Closing words.")
    assert extract(DOCX, _save(document)) == Extracted(
        "# Annual report\n\n"
        "## Scope\n\n"
        "Plain words.\n\n"
        "### Detail\n\n"
        "- first point\n"
        "- second point\n\n"
        "###### Very deep\n\n"
        "| item | note |\n"
        "| --- | --- |\n"
        "| a\\|b | two lines |\n"
        "| lanterns |  |\n\n"
        "Closing words."
    )


def test_docx_sample_keeps_document_order() -> None:
    text = extract(DOCX, samples.docx("The lanterns are in the shed.")).text
    assert text == (
        "## Field notes\n\n"
        "The lanterns are in the shed.\n\n"
        "| item | count |\n"
        "| --- | --- |\n"
        "| lanterns | 12 |"
    )


def test_docx_text_limit_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex, "MAX_TEXT_CHARS", 100)
    document = python_docx.Document()
    for n in range(50):
        document.add_paragraph(f"Paragraph number {n} of the long document.")
    result = extract(DOCX, _save(document))
    assert result.truncated is True
    assert result.text.startswith("Paragraph number 0 of")
    assert len(result.text) <= 100
    assert "Paragraph number 49" not in result.text


def test_docx_paragraph_after_a_list_is_its_own_block() -> None:
    document = python_docx.Document()
    document.add_paragraph("last point", style="List Bullet")
    document.add_paragraph("After the list.")
    assert "- last point\n\nAfter the list." in extract(DOCX, _save(document)).text


# --- extract.py: Excel ------------------------------------------------------


def _workbook(sheets: dict[str, list[list[object]]]) -> bytes:
    workbook = openpyxl.Workbook()
    default = workbook.active
    assert default is not None
    workbook.remove(default)
    for title, rows in sheets.items():
        sheet = workbook.create_sheet(title)
        for row in rows:
            sheet.append(row)
    out = io.BytesIO()
    workbook.save(out)
    return out.getvalue()


def test_xlsx_is_one_section_and_table_per_sheet() -> None:
    content = _workbook(
        {
            "Stock": [
                ["item", "count", "note"],
                ["lanterns", 12, None],
                [None, None, None],
                ["  ", None, None],
                ["rope|twine", 3.5, "two\nlines"],
            ],
            "People": [["name"], ["Ada"]],
            "Empty": [],
        }
    )
    assert extract(XLSX, content) == Extracted(
        "## Stock\n\n"
        "| item | count | note |\n"
        "| --- | --- | --- |\n"
        "| lanterns | 12 |  |\n"
        "| rope\\|twine | 3.5 | two lines |\n\n"
        "## People\n\n"
        "| name |\n"
        "| --- |\n"
        "| Ada |\n\n"
        "## Empty"
    )


def test_xlsx_sample() -> None:
    text = extract(XLSX, samples.xlsx(("item", "count"), ("lanterns", 12))).text
    assert text == "## Inventory\n\n| item | count |\n| --- | --- |\n| lanterns | 12 |"


def test_xlsx_rows_past_the_limit_are_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex, "MAX_SHEET_ROWS", 3)
    rows: list[list[object]] = [["n"], [None]]
    rows += ([n] for n in range(1, 10))
    content = _workbook({"First": rows, "Second": [["kept"], ["too"]]})
    text = extract(XLSX, content).text
    # Empty rows do not count: the header and the first two numbers are kept.
    assert text == (
        "## First\n\n| n |\n| --- |\n| 1 |\n| 2 |\n\n[rows after the first 3 not read]\n\n"
        "## Second\n\n| kept |\n| --- |\n| too |"
    )


def test_xlsx_rows_past_the_limit_mark_the_text_truncated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ex, "MAX_SHEET_ROWS", 3)
    content = _workbook({"First": [[n] for n in range(10)]})
    assert extract(XLSX, content).truncated is True


def test_xlsx_text_limit_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex, "MAX_TEXT_CHARS", 40)
    content = _workbook({"Data": [[f"row {n}", n] for n in range(100)]})
    result = extract(XLSX, content)
    assert result.truncated is True
    assert result.text.startswith("## Data\n\n| row 0 |")
    assert len(result.text) <= 40


# --- extract.py: PowerPoint -------------------------------------------------


def test_pptx_slides_with_text_tables_and_notes() -> None:
    presentation = python_pptx.Presentation()
    first = presentation.slides.add_slide(presentation.slide_layouts[1])
    first.shapes.title.text = "Plan"
    first.placeholders[1].text = "Ship in May"
    first.notes_slide.notes_text_frame.text = "Say it slowly"
    second = presentation.slides.add_slide(presentation.slide_layouts[5])
    second.shapes.title.text = "Numbers"
    shape = second.shapes.add_table(2, 2, Inches(1), Inches(2), Inches(4), Inches(1))
    table = shape.table
    table.cell(0, 0).text, table.cell(0, 1).text = "region", "sales"
    table.cell(1, 0).text, table.cell(1, 1).text = "north|east", "12"
    presentation.slides.add_slide(presentation.slide_layouts[6])
    assert extract(PPTX, _save(presentation)) == Extracted(
        "## Slide 1\n\n"
        "Plan\n\n"
        "Ship in May\n\n"
        "Notes: Say it slowly\n\n"
        "## Slide 2\n\n"
        "Numbers\n\n"
        "| region | sales |\n"
        "| --- | --- |\n"
        "| north\\|east | 12 |\n\n"
        "## Slide 3"
    )


def test_pptx_sample() -> None:
    text = extract(PPTX, samples.pptx("Lanterns", "Twelve in the shed")).text
    assert text == "## Slide 1\n\nLanterns\n\nTwelve in the shed"


def test_pptx_text_limit_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex, "MAX_TEXT_CHARS", 25)
    presentation = python_pptx.Presentation()
    for n in range(20):
        slide = presentation.slides.add_slide(presentation.slide_layouts[5])
        slide.shapes.title.text = f"Title {n}"
    result = extract(PPTX, _save(presentation))
    assert result == Extracted("## Slide 1\n\nTitle 0\n\n## S", truncated=True)


def test_pptx_text_in_a_group_is_read() -> None:
    presentation = python_pptx.Presentation()
    slide = presentation.slides.add_slide(presentation.slide_layouts[6])
    group = slide.shapes.add_group_shape()
    box = group.shapes.add_textbox(Inches(1), Inches(1), Inches(3), Inches(1))
    box.text_frame.text = "Grouped words"
    assert "Grouped words" in extract(PPTX, _save(presentation)).text


# --- extract.py: images -----------------------------------------------------


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP"])
def test_image_text_is_read_by_ocr(fmt: str) -> None:
    result = extract(f"image/{fmt.lower()}", samples.image("Invoice 5521", fmt))
    assert "5521" in result.text
    assert result.truncated is False


def test_image_in_grayscale_with_alpha_is_converted_before_ocr() -> None:
    font = ImageFont.load_default(size=48)
    picture = Image.new("LA", (500, 130), (255, 255))
    ImageDraw.Draw(picture).text((40, 35), "Invoice 5521", fill=(0, 255), font=font)
    out = io.BytesIO()
    picture.save(out, "PNG")
    assert "5521" in extract("image/png", out.getvalue()).text


def test_image_with_transparent_background_is_read() -> None:
    font = ImageFont.load_default(size=48)
    picture = Image.new("RGBA", (500, 130), (0, 0, 0, 0))
    ImageDraw.Draw(picture).text((40, 35), "Invoice 5521", fill=(0, 0, 0, 255), font=font)
    out = io.BytesIO()
    picture.save(out, "PNG")
    assert "5521" in extract("image/png", out.getvalue()).text


def test_image_text_limit_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex, "MAX_TEXT_CHARS", 6)
    assert extract("image/png", samples.image("Invoice 5521")) == Extracted("Invoic", True)


# Between the limit and twice the limit Pillow only warns; the reader refuses.
@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_image_over_the_pixel_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex, "MAX_IMAGE_PIXELS", 10_000)
    message = _unreadable("image/png", _png(150, 100))
    assert message == "the image is 150x100 pixels, more than 10,000"


def test_image_at_the_pixel_limit_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ex, "MAX_IMAGE_PIXELS", 10_000)
    assert extract("image/png", _png(100, 100)) == Extracted("")


def test_image_far_over_the_pixel_limit_names_the_pixels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ex, "MAX_IMAGE_PIXELS", 10_000)
    assert "pixels" in _unreadable("image/png", _png(250, 100))


def _damaged_png() -> bytes:
    """A PNG whose header promises more pixels than its data holds."""
    header = struct.pack(">IIBBBBB", 64, 64, 8, 2, 0, 0, 0)

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    data = chunk(b"IDAT", zlib.compress(b"\0" * 10))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + data + chunk(b"IEND", b"")


@pytest.mark.parametrize(
    ("mime_type", "content"),
    [
        ("image/png", b"\x89PNG\r\n\x1a\n" + b"garbage" * 10),
        ("image/png", _damaged_png()),
        ("image/jpeg", samples.image("hi", "JPEG")[:300]),
        ("image/webp", b"not an image"),
    ],
    ids=["bad-header", "short-data", "truncated-jpeg", "not-image"],
)
def test_damaged_image_is_unreadable(mime_type: str, content: bytes) -> None:
    assert _unreadable(mime_type, content) == "the image is damaged and cannot be read"
