"""Real files of every allowed type, made here by the libraries that write
them (fpdf2, python-docx, openpyxl, python-pptx, Pillow), each carrying one
sentence a test can ask about."""

from __future__ import annotations

import functools
import io
from collections.abc import Callable

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"


def pdf(*lines: str, pages: int = 1) -> bytes:
    from fpdf import FPDF

    document = FPDF()
    document.set_font("helvetica", size=14)
    for _ in range(pages):
        document.add_page()
        for line in lines:
            document.cell(text=line, new_x="LMARGIN", new_y="NEXT")
    return bytes(document.output())


def raw_pdf(bodies: list[bytes]) -> bytes:
    """A PDF of the given objects (numbered from 1, the first is the catalog)."""
    out = bytearray(b"%PDF-1.4\n")
    offsets: list[int] = []
    for number, body in enumerate(bodies, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(bodies) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\n" % (len(bodies) + 1)
    out += b"startxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)


def blank_pdf(pages: int) -> bytes:
    """Blank pages, written directly: pypdf's PdfWriter takes a second for 20,000."""
    kids = b" ".join(b"%d 0 R" % (n + 3) for n in range(pages))
    page = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 100 100] >>"
    return raw_pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, pages),
            *[page] * pages,
        ]
    )


def docx(*paragraphs: str) -> bytes:
    import docx as python_docx

    document = python_docx.Document()
    document.add_heading("Field notes", level=1)
    for paragraph in paragraphs:
        document.add_paragraph(paragraph)
    table = document.add_table(rows=2, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "item", "count"
    table.cell(1, 0).text, table.cell(1, 1).text = "lanterns", "12"
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def xlsx(*rows: tuple[object, ...]) -> bytes:
    import openpyxl

    workbook = openpyxl.Workbook()
    sheet = workbook.active
    assert sheet is not None
    sheet.title = "Inventory"
    for row in rows:
        sheet.append(list(row))
    out = io.BytesIO()
    workbook.save(out)
    return out.getvalue()


def pptx(title: str, body: str) -> bytes:
    import pptx as python_pptx

    presentation = python_pptx.Presentation()
    slide = presentation.slides.add_slide(presentation.slide_layouts[1])
    slide.shapes.title.text = title
    slide.placeholders[1].text = body
    out = io.BytesIO()
    presentation.save(out)
    return out.getvalue()


def image(text: str, fmt: str = "PNG") -> bytes:
    """Printed text on a white background, large enough for OCR."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=48)
    width = int(font.getlength(text)) + 80
    picture = Image.new("RGB", (width, 130), "white")
    ImageDraw.Draw(picture).text((40, 35), text, fill="black", font=font)
    out = io.BytesIO()
    picture.save(out, fmt)
    return out.getvalue()


def image_lines(lines: list[str]) -> bytes:
    """A page of small print: many lines, slow for OCR."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=22)
    picture = Image.new("L", (1400, 40 + 30 * len(lines)), 255)
    draw = ImageDraw.Draw(picture)
    for n, line in enumerate(lines):
        draw.text((20, 20 + 30 * n), line, fill=0, font=font)
    out = io.BytesIO()
    picture.save(out, "PNG")
    return out.getvalue()


@functools.cache
def minimal(mime_type: str) -> bytes:
    """A small valid file of the type (for validation tests)."""
    makers: dict[str, Callable[[], bytes]] = {
        "application/pdf": lambda: pdf("hello"),
        DOCX: lambda: docx("hello"),
        XLSX: lambda: xlsx(("hello",)),
        PPTX: lambda: pptx("hello", "world"),
        "image/png": lambda: image("hi", "PNG"),
        "image/jpeg": lambda: image("hi", "JPEG"),
        "image/gif": lambda: image("hi", "GIF"),
        "image/webp": lambda: image("hi", "WEBP"),
        "text/plain": lambda: b"hello\n",
        "text/csv": lambda: b"a,b\n1,2\n",
        "text/markdown": lambda: b"# hello\n",
    }
    return makers[mime_type]()
