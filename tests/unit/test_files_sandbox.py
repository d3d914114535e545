"""The sandbox: each file is read in a process forked from the fork server,
with a memory limit (RLIMIT_AS), a wall-clock limit and cancellation."""

from __future__ import annotations

import asyncio
import io
import os
import resource
import struct
import threading
import time
import zlib
from typing import NoReturn

import pytest
from pypdf import PdfWriter

from tests.support import samples
from turnmesh.files import Outcome, Sandbox
from turnmesh.files import extract as extract_module
from turnmesh.files import sandbox as sandbox_module
from turnmesh.files.extract import MAX_PDF_PAGES, MAX_TEXT_CHARS

PDF = "application/pdf"
MEMORY_ERROR = "the file needs more memory to read than a worker allows"
CRASHED = "the file could not be read (its reader crashed)"


def _deep_page_tree_pdf(depth: int) -> bytes:
    """One page under ``depth`` nested /Pages nodes: pypdf refuses past 100."""
    nodes = [
        b"<< /Type /Pages /Kids [%d 0 R] /Count 1%s >>"
        % (n + 1, b"" if n == 2 else b" /Parent %d 0 R" % (n - 1))
        for n in range(2, depth + 2)
    ]
    page = b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 100 100] >>" % (depth + 1)
    return samples.raw_pdf([b"<< /Type /Catalog /Pages 2 0 R >>", *nodes, page])


def _rgba_png(width: int, height: int) -> bytes:
    """An opaque white RGBA PNG: small on disk, width * height * 4 bytes decoded."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    row = b"\x00" + b"\xff" * (width * 4)
    packer = zlib.compressobj(1)
    data = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")
    )


@pytest.fixture(scope="module")
def slow_pdf() -> bytes:
    """20,000 blank pages: reading them takes about a second."""
    return samples.blank_pdf(20_000)


@pytest.fixture
def reader_pids(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pid of every reader process, recorded as the sandbox kills its group."""
    pids: list[int] = []
    kill_group = sandbox_module._kill_group

    def recording(pid: int | None) -> None:
        assert pid is not None
        pids.append(pid)
        kill_group(pid)

    monkeypatch.setattr(sandbox_module, "_kill_group", recording)
    return pids


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_text_is_read_in_a_child_process(
    monkeypatch: pytest.MonkeyPatch, reader_pids: list[int]
) -> None:
    # The parent's reader is broken: only a separate process can still read.
    def broken(mime_type: str, content: bytes) -> NoReturn:
        raise AssertionError("extract ran in the worker's own process")

    monkeypatch.setattr(extract_module, "extract", broken)
    limit_before = resource.getrlimit(resource.RLIMIT_AS)
    outcome = await Sandbox().extract("text/plain", b"  hello from a file \n")
    assert outcome == Outcome(text="hello from a file", truncated=False, error="")
    assert len(reader_pids) == 1
    assert reader_pids[0] != os.getpid()
    assert _gone(reader_pids[0])
    # The memory limit is the reader's, never the worker's.
    assert resource.getrlimit(resource.RLIMIT_AS) == limit_before


@pytest.mark.parametrize(
    ("mime_type", "content", "expected"),
    [
        (PDF, samples.pdf("Lanterns: 12"), "Lanterns: 12"),
        (samples.DOCX, samples.docx("Lanterns: 12"), "Lanterns: 12\n\n| item | count |"),
        (samples.XLSX, samples.xlsx(("item", "n"), ("lanterns", 12)), "| lanterns | 12 |"),
        (samples.PPTX, samples.pptx("Stock", "Lanterns: 12"), "## Slide 1\n\nStock"),
        ("image/png", samples.image("Invoice 5521"), "5521"),
    ],
    ids=["pdf", "docx", "xlsx", "pptx", "ocr"],
)
async def test_every_reader_works_in_the_sandbox(
    mime_type: str, content: bytes, expected: str
) -> None:
    outcome = await Sandbox().extract(mime_type, content)
    assert outcome.error == ""
    assert expected in outcome.text
    assert outcome.truncated is False


async def test_truncation_reaches_the_caller() -> None:
    outcome = await Sandbox().extract("text/plain", b"x" * (MAX_TEXT_CHARS + 1))
    assert outcome.truncated is True
    assert outcome.text == "x" * MAX_TEXT_CHARS
    assert outcome.error == ""


@pytest.mark.parametrize(
    ("mime_type", "content", "message"),
    [
        (samples.DOCX, b"not a zip", "the document is damaged (not a valid zip)"),
        (PDF, b"%PDF-1.4\nno objects", "the PDF is damaged and cannot be read"),
        (samples.XLSX, samples.xlsx(("a",))[:500], "the document is damaged (not a valid zip)"),
        ("image/png", b"\x89PNG\r\n\x1a\nbroken", "the image is damaged and cannot be read"),
        ("application/x-unknown", b"?", "no reader for application/x-unknown"),
    ],
    ids=["docx", "pdf", "xlsx", "png", "unknown"],
)
async def test_unreadable_file_gives_the_user_message_and_no_text(
    mime_type: str, content: bytes, message: str
) -> None:
    outcome = await Sandbox().extract(mime_type, content)
    assert outcome == Outcome(text="", truncated=False, error=message)


async def test_encrypted_pdf_gives_the_user_message() -> None:
    writer = PdfWriter(clone_from=io.BytesIO(samples.pdf("Secret 42")))
    writer.encrypt("pw")
    out = io.BytesIO()
    writer.write(out)
    outcome = await Sandbox().extract(PDF, out.getvalue())
    assert outcome == Outcome(error="the PDF is encrypted")


async def test_a_pdf_past_pypdfs_limits_is_named(caplog: pytest.LogCaptureFixture) -> None:
    outcome = await Sandbox().extract(PDF, _deep_page_tree_pdf(120))
    assert outcome == Outcome(error="the PDF is too large or too deeply nested to read")


async def test_slow_pdf_is_read_without_a_time_limit(slow_pdf: bytes) -> None:
    """The file the timeout and cancel tests use is valid, and slow (about a second here)."""
    started = time.monotonic()
    outcome = await Sandbox().extract(PDF, slow_pdf)
    elapsed = time.monotonic() - started
    assert outcome == Outcome(
        text=f"[{20_000 - MAX_PDF_PAGES} more pages not read]", truncated=True
    )
    assert elapsed > 0.3


async def test_timeout_kills_the_reader(slow_pdf: bytes, reader_pids: list[int]) -> None:
    sandbox = Sandbox(timeout_seconds=0.05)
    started = time.monotonic()
    outcome = await sandbox.extract(PDF, slow_pdf)
    elapsed = time.monotonic() - started
    assert outcome == Outcome(error="reading the file took longer than 0.05 seconds")
    assert "took longer than" in outcome.error
    # Returned long before the reader could have finished, and the reader is gone.
    assert elapsed < 1.0
    assert len(reader_pids) == 1
    assert _gone(reader_pids[0])


async def test_memory_limit_stops_a_reader_and_the_sandbox_keeps_serving() -> None:
    # 36 million pixels (under the 40 million limit) decode to 144 MB as RGBA and
    # another 108 MB as RGB for OCR; the reader starts at about 200 MB.
    assert extract_module.MAX_IMAGE_PIXELS > 6000 * 6000
    sandbox = Sandbox(memory_bytes=300 * 1024 * 1024, timeout_seconds=20)
    outcome = await sandbox.extract("image/png", _rgba_png(6000, 6000))
    assert outcome.text == ""
    assert outcome.error in (MEMORY_ERROR, CRASHED)
    after = await sandbox.extract(PDF, samples.pdf("Still serving"))
    assert after == Outcome(text="Still serving")


async def test_extractions_run_at_once_and_each_gets_its_own_text() -> None:
    files = [
        ("text/plain", b"first text"),
        (PDF, samples.pdf("second pdf")),
        (samples.DOCX, samples.docx("third docx")),
        ("text/csv", b"fourth,csv"),
        (samples.PPTX, samples.pptx("fifth", "pptx")),
        ("text/markdown", b"# sixth markdown"),
        (samples.XLSX, samples.xlsx(("seventh xlsx",))),
        ("text/plain", b"eighth text"),
    ]
    sandbox = Sandbox(concurrency=4)
    outcomes = await asyncio.gather(*(sandbox.extract(m, c) for m, c in files))
    words = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"]
    assert [o.error for o in outcomes] == [""] * len(files)
    for word, outcome in zip(words, outcomes, strict=True):
        assert word in outcome.text
        assert all(other not in outcome.text for other in words if other != word)


async def test_concurrency_is_the_number_of_readers_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sandbox = Sandbox(concurrency=2)
    run = sandbox._run_blocking
    # Each reader waits for a partner: two must run at once, or this breaks.
    pair = threading.Barrier(2, timeout=10)
    lock = threading.Lock()
    running = 0
    most = 0

    def counted(mime_type: str, content: bytes, stop: threading.Event | None = None) -> Outcome:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        try:
            pair.wait()
            return run(mime_type, content, stop)
        finally:
            with lock:
                running -= 1

    monkeypatch.setattr(sandbox, "_run_blocking", counted)
    texts = [f"file {n}" for n in range(6)]
    outcomes = await asyncio.gather(*(sandbox.extract("text/plain", t.encode()) for t in texts))
    assert [o.text for o in outcomes] == texts
    assert most == 2


async def test_cancelling_kills_the_reader_at_once(
    monkeypatch: pytest.MonkeyPatch, slow_pdf: bytes, reader_pids: list[int]
) -> None:
    sandbox = Sandbox(concurrency=1)
    run = sandbox._run_blocking
    entered = threading.Event()
    finished = threading.Event()
    results: list[Outcome] = []

    def observed(mime_type: str, content: bytes, stop: threading.Event | None = None) -> Outcome:
        entered.set()
        try:
            outcome = run(mime_type, content, stop)
            results.append(outcome)
            return outcome
        finally:
            finished.set()

    monkeypatch.setattr(sandbox, "_run_blocking", observed)
    task = asyncio.create_task(sandbox.extract(PDF, slow_pdf))
    assert await asyncio.to_thread(entered.wait, 10)
    cancelled_at = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(finished.wait, 10)
    # The reader needs over a second for this file; it was stopped well before.
    assert time.monotonic() - cancelled_at < 1.0
    assert results == [Outcome(error="cancelled")]
    assert len(reader_pids) == 1
    assert _gone(reader_pids[0])
    # The slot is free again.
    after = await asyncio.wait_for(sandbox.extract("text/plain", b"next"), 10)
    assert after == Outcome(text="next")


async def test_warm_up_reads_a_file_in_a_reader(reader_pids: list[int]) -> None:
    sandbox = Sandbox(timeout_seconds=10)
    await asyncio.to_thread(sandbox.warm_up)
    assert len(reader_pids) == 1
    assert await sandbox.extract("text/plain", b"warm") == Outcome(text="warm")
