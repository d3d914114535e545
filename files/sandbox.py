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
import contextlib
import logging
import multiprocessing
import os
import resource
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from turnmesh.files.fair import (
    DEFAULT_QUEUE_BYTES,
    DEFAULT_QUEUE_FILES,
    FairLimits,
    FairScheduler,
    QueueFull,
)
from turnmesh.runtime import metrics
from turnmesh.runtime.principals import ANONYMOUS

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 30.0
# How often a waiting reader checks whether its turn was cancelled.
POLL_SECONDS = 0.05
DEFAULT_MEMORY_BYTES = 2 * 1024 * 1024 * 1024
PRELOAD = [
    # The main module once, in the fork server, not in every reader (a worker
    # started by the `turnmesh` script would re-run it per file).
    "__main__",
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
    # Its own process group: killing the group also ends a tesseract it started.
    os.setpgrp()
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


def _kill_group(pid: int | None) -> None:
    """SIGKILL the reader and anything it started (a reader that finished
    has no group left, which is fine)."""
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class Sandbox:
    """Extracts files in child processes, ``concurrency`` at a time, the
    slots shared fairly among principals and their turns (``fair``)."""

    def __init__(
        self,
        *,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
        concurrency: int = 2,
        queue_files: int = DEFAULT_QUEUE_FILES,
        queue_bytes: int = DEFAULT_QUEUE_BYTES,
    ) -> None:
        self.timeout_seconds = timeout_seconds
        self.memory_bytes = memory_bytes
        self.scheduler = FairScheduler(
            FairLimits(slots=concurrency, queue_files=queue_files, queue_bytes=queue_bytes)
        )
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(PRELOAD)

    def warm_up(self) -> None:
        """Start the fork server now (blocking, about a second) rather than
        on the first file."""
        self._run_blocking("text/plain", b"warm-up")

    async def extract(
        self, mime_type: str, content: bytes, *, principal: str = ANONYMOUS, turn: str = ""
    ) -> Outcome:
        """The file's text once ``turn`` of ``principal`` gets a slot (or why
        it may not wait for one; callers naming no turn share one, and its
        bounds); cancelling this (the turn was cancelled) leaves the queue or
        kills the reader, at once."""
        stop = threading.Event()
        try:
            async with self.scheduler.slot(principal, turn, len(content)) as waited:
                metrics.FILE_QUEUE_SECONDS.observe(waited)
                try:
                    return await asyncio.to_thread(self._run_blocking, mime_type, content, stop)
                except asyncio.CancelledError:
                    stop.set()
                    raise
        except QueueFull as full:
            metrics.FILE_QUEUE_REFUSED.labels(full.limit).inc()
            return Outcome(error=str(full))

    def _run_blocking(
        self, mime_type: str, content: bytes, stop: threading.Event | None = None
    ) -> Outcome:
        receiver, sender = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=_child,
            args=(sender, mime_type, content, self.memory_bytes),
            daemon=True,
        )
        process.start()
        sender.close()
        deadline = time.monotonic() + self.timeout_seconds
        try:
            while not receiver.poll(min(POLL_SECONDS, max(0.0, deadline - time.monotonic()))):
                if stop is not None and stop.is_set():
                    return Outcome(error="cancelled")
                if time.monotonic() >= deadline:
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
            _kill_group(process.pid)
            if process.is_alive():  # killed before it made its group
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
