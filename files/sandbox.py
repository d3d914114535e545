"""Run one file's extraction in a throwaway process, with limits.

Each file gets its own process, forked from a clean fork server (started once,
with the readers already imported, so a fork costs milliseconds): a memory
limit (``RLIMIT_AS``) caps what a decompression bomb can take, a wall-clock
limit kills a reader that never ends, and a crash takes only that process.
The worker's own memory holds the bytes and the text, nothing else. A process
pool cannot do this: it cannot kill one task, and a killed worker breaks it.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import resource
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 30.0
DEFAULT_MEMORY_BYTES = 2 * 1024 * 1024 * 1024
PRELOAD = [
    "turnmesh.files.extract",
    "pypdf",
    "docx",
    "openpyxl",
    "pptx",
    "PIL.Image",
    "pytesseract",
]


@dataclass(frozen=True)
class Outcome:
    """A file's text, or why there is none (fit to show the user)."""

    text: str = ""
    truncated: bool = False
    error: str = ""


def _child(conn: Connection, mime_type: str, content: bytes, memory_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    # Tesseract's OpenMP threads each reserve address space; one is plenty here.
    os.environ["OMP_THREAD_LIMIT"] = "1"
    from turnmesh.files.extract import FileUnreadable, extract

    try:
        result = extract(mime_type, content)
        message: tuple[str, Any] = ("ok", (result.text, result.truncated))
    except FileUnreadable as exc:
        message = ("unreadable", str(exc))
    except MemoryError:
        message = ("unreadable", "the file needs more memory to read than a worker allows")
    except Exception as exc:  # a reader's own bug on a strange file
        message = ("failed", type(exc).__name__)
    conn.send(message)
    conn.close()


class Sandbox:
    """Extracts files in child processes, ``concurrency`` at a time."""

    def __init__(
        self,
        *,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
        concurrency: int = 2,
    ) -> None:
        self.timeout_seconds = timeout_seconds
        self.memory_bytes = memory_bytes
        self._slots = asyncio.Semaphore(concurrency)
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(PRELOAD)

    def warm_up(self) -> None:
        """Start the fork server now (blocking, about a second) rather than
        on the first file."""
        self._run_blocking("text/plain", b"warm-up")

    async def extract(self, mime_type: str, content: bytes) -> Outcome:
        async with self._slots:
            return await asyncio.to_thread(self._run_blocking, mime_type, content)

    def _run_blocking(self, mime_type: str, content: bytes) -> Outcome:
        receiver, sender = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=_child,
            args=(sender, mime_type, content, self.memory_bytes),
            daemon=True,
        )
        process.start()
        sender.close()
        try:
            if not receiver.poll(self.timeout_seconds):
                return Outcome(
                    error=f"reading the file took longer than {self.timeout_seconds:g} seconds"
                )
            try:
                kind, value = receiver.recv()
            except EOFError:
                log.warning("a file reader process died (exit code %s)", process.exitcode)
                return Outcome(error="the file could not be read (its reader crashed)")
        finally:
            receiver.close()
            if process.is_alive():
                process.kill()
            process.join(5)
            process.close()
        if kind == "ok":
            text, truncated = value
            return Outcome(text=text, truncated=truncated)
        if kind == "unreadable":
            return Outcome(error=str(value))
        log.warning("a file reader failed with %s on a %s file", value, mime_type)
        return Outcome(error="the file could not be read")
