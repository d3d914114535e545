"""Decoding large request bodies without holding a server's event loop.

JSON parsing and base64 decoding are each one call into C that holds the GIL
from start to end: parsing a 96 MiB JSON body holds it for about a second,
and a thread does not help (the loop waits for the GIL all the same). So a
JSON body of ``OFFLOAD_BYTES`` or more is parsed in a child process (the loop
pays only for copying the bytes there and the result back), base64 of that
size is decoded in a thread a chunk at a time (the GIL changes hands between
chunks), and work that releases the GIL (hashing) runs in a thread. Smaller
inputs are handled inline: the hop would cost more than they do.

Standard library only: the child processes import this module (and
``runtime.memory``) and no more.
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import json
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from turnmesh.runtime.memory import tune_allocator

T = TypeVar("T")

# From here up, work moves off the loop (a thread hop costs about 50 us, a
# child process about a millisecond; 256 KiB of JSON parses in about 2 ms).
OFFLOAD_BYTES = 256 * 1024
# Deeper than any request of the compatibility APIs needs; far below
# Python's recursion limit.
MAX_JSON_DEPTH = 64
# Values (objects, arrays, strings, numbers) in one body: far more than any
# request of those APIs holds (1,000 messages of a few parts each), and few
# enough that the parsed body crosses back from the child in milliseconds.
MAX_JSON_VALUES = 200_000
# Child processes parsing large bodies at once (more wait their turn).
DECODE_PROCESSES = 2
# Base64 characters decoded per call (a multiple of 4): about a millisecond.
BASE64_CHUNK = 1024 * 1024


class BodyError(ValueError):
    """Why a body is refused, in words fit for the caller."""


def decode_json(data: bytes) -> dict[str, Any]:
    """A JSON object, checked as ``check_values`` does; BodyError if it is not one."""
    # Parsing builds every value before any can be counted (a body of empty
    # objects takes about 28 times its size), so count what could start a
    # value first: each one past the first follows a ',' or opens a '{' or '['.
    # Base64 holds none of them; text rarely enough that twice the bound is
    # never reached by a body check_values would accept.
    starts = data.count(b",") + data.count(b"{") + data.count(b"[")
    if starts > 2 * MAX_JSON_VALUES:
        raise BodyError(f"holds more than {MAX_JSON_VALUES} values")
    value = _loads(data)
    if not isinstance(value, dict):
        raise BodyError("must be a JSON object")
    check_values(value)
    return value


def _loads(data: bytes) -> Any:
    """``json.loads``, its failures as BodyError."""
    try:
        return json.loads(data or b"{}")
    except json.JSONDecodeError as exc:
        # The parser's own phrase ("Expecting value") and where: no internals.
        why = f"not valid JSON: {exc.msg} at character {exc.pos}"
    except UnicodeDecodeError as exc:
        why = f"not valid JSON: not UTF-8 text (at byte {exc.start})"
    except RecursionError:
        why = f"nested deeper than {MAX_JSON_DEPTH} levels"
    except MemoryError:
        why = "too large to decode"
    except ValueError:  # an integer past Python's 4,300 digits (its text names sys calls)
        why = "not valid JSON: a number of more than 4,300 digits"
    # Raised here, not while handling the parser's exception, which it would
    # keep (as __context__) with the whole document (its .doc, its frames)
    # for as long as the refusal is kept.
    raise BodyError(why)


def check_values(data: dict[str, Any]) -> None:
    """Refuse what JSON allows but a request cannot use: nesting past
    MAX_JSON_DEPTH, more than MAX_JSON_VALUES values, and lone surrogates
    (``"\\ud800"``), which no protobuf string and no UTF-8 can carry.
    Iterative: no recursion to exhaust."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    seen = 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if seen > MAX_JSON_VALUES:
            raise BodyError(f"holds more than {MAX_JSON_VALUES} values")
        if depth > MAX_JSON_DEPTH:
            raise BodyError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(value, dict):
            stack.extend((k, depth) for k in value)
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
        elif isinstance(value, str) and not value.isascii():
            # isascii reads a flag, no copy: base64 file bodies skip the encode.
            try:
                value.encode()
            except UnicodeEncodeError:
                raise BodyError("holds a lone surrogate (\\ud800-\\udfff)") from None


def b64decode(value: str, start: int = 0) -> bytes:
    """``value[start:]`` as strict base64 (its alphabet only, padding only at
    the end), decoded BASE64_CHUNK characters per call, never copied whole.
    binascii.Error (a ValueError) if it is not."""
    if len(value) - start <= BASE64_CHUNK:
        return binascii.a2b_base64(value[start:], strict_mode=True)
    chunks = []
    for at in range(start, len(value), BASE64_CHUNK):
        chunk = value[at : at + BASE64_CHUNK]
        if chunk.endswith("=") and at + BASE64_CHUNK < len(value):
            raise binascii.Error("padding before the end")
        chunks.append(binascii.a2b_base64(chunk, strict_mode=True))
    return b"".join(chunks)


async def sized(size: int, work: Callable[..., T], *args: Any) -> T:
    """``work(*args)``: inline when ``size`` is small, else in a thread (for
    work that releases the GIL, or gives it up between small steps)."""
    if size < OFFLOAD_BYTES:
        return work(*args)
    return await asyncio.to_thread(work, *args)


def _start_child(parent: int) -> None:
    """In a child: hand large blocks back as the server does, and exit once
    the server is gone, even killed (the pool's queue never tells a child
    so: the child holds its writing end too)."""
    tune_allocator()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class _Decoders:
    """The child processes that parse large JSON bodies, started on first use."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _submit(self, data: bytes) -> Future[dict[str, Any]]:
        # In a thread: starting a child process blocks.
        with self._lock:
            if self._pool is not None:
                try:
                    return self._pool.submit(decode_json, data)
                except BrokenProcessPool:  # a child died (killed from outside)
                    self._pool.shutdown(wait=False, cancel_futures=True)
            # spawn: a child shares nothing with this process's gRPC state
            # (nor the fork server the file readers configure).
            self._pool = ProcessPoolExecutor(
                DECODE_PROCESSES,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_child,
                initargs=(os.getpid(),),
            )
            return self._pool.submit(decode_json, data)

    async def parse(self, data: bytes) -> dict[str, Any]:
        try:
            try:
                return await asyncio.wrap_future(await asyncio.to_thread(self._submit, data))
            except BrokenProcessPool:
                # Its child died while parsing: once more, in a new one.
                return await asyncio.wrap_future(await asyncio.to_thread(self._submit, data))
        finally:
            self._flush()

    def _flush(self) -> None:
        """The pool's feeder thread keeps the last call it pickled for a
        child (a local it overwrites only with the next one), so the last
        large body stayed in memory until another came: a call of nothing
        takes its place."""
        with self._lock:
            if self._pool is None:
                return
            with contextlib.suppress(BrokenProcessPool, RuntimeError):  # broken, or shut down
                self._pool.submit(int)


_decoders = _Decoders()


async def parse_json(data: bytes) -> dict[str, Any]:
    """A JSON object body, parsed off the loop when it is large. BodyError
    if it is not acceptable; BrokenProcessPool if no child could parse it."""
    if len(data) < OFFLOAD_BYTES:
        return decode_json(data)
    return await _decoders.parse(data)
