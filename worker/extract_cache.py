"""Texts of the files a worker already read, so a file attached again (the
same bytes, for the same reader) is not read again.

Keyed by (principal, SHA-256, reader version): never shared across
principals, since a hit (an answer without a reader's seconds) would tell one
caller that another sent the same file (without API keys every caller is
the anonymous principal, who shares every session id already). The reader
version (``files.extract.reader_version``) names the reader and its
libraries, so a new reader never serves an old reader's text.

Only texts are kept. A failure says nothing the next read must repeat: a time
limit, a full queue, a cancelled turn or the worker's memory limit depend on
the moment and the settings; the refusals that depend on the file alone
(encrypted, damaged, a zip bomb) are mostly quick to repeat, and the
``Outcome`` does not tell the two kinds apart.

Bounded in entries and in bytes, least recently used out first. Concurrent
reads of one key share one reader (single flight), which runs as long as one
of them still waits: a cancelled turn leaves it to the others, and the last
one to leave stops it.
"""

from __future__ import annotations

import asyncio
import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from turnmesh.files import Outcome
from turnmesh.runtime import metrics

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_ENTRIES", "ExtractCache", "Key", "entry_bytes"]

# A full text is at most 200,000 characters (up to 800 KB as a str): 64 MiB
# keeps at least 80 of those, and thousands of short ones.
DEFAULT_MAX_ENTRIES = 4096
DEFAULT_MAX_BYTES = 64 * 2**20
# The key's strings, the Outcome and the dict's node, about.
ENTRY_OVERHEAD_BYTES = 512

# principal, SHA-256 (hex), reader version
Key = tuple[str, str, str]


def entry_bytes(outcome: Outcome) -> int:
    """What one cached text holds in memory: the str itself (1, 2 or 4 bytes a
    character, by its widest), plus the entry around it."""
    return sys.getsizeof(outcome.text) + ENTRY_OVERHEAD_BYTES


@dataclass(eq=False)
class _Flight:
    """One read in progress, and how many callers wait for it."""

    task: asyncio.Task[Outcome]
    waiters: int = 0


class ExtractCache:
    # An OrderedDict, as in history_cache.py: cachetools is not a dependency,
    # and its caches would need the same single-flight code around them.
    def __init__(
        self, max_entries: int = DEFAULT_MAX_ENTRIES, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self._entries: OrderedDict[Key, tuple[Outcome, int]] = OrderedDict()
        self._flights: dict[Key, _Flight] = {}
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self.bytes = 0

    @property
    def entries(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Key) -> bool:
        return key in self._entries

    async def read(self, key: Key, reader: Callable[[], Awaitable[Outcome]]) -> Outcome:
        """The cached text of ``key``, the outcome of a read of it already
        running, or of ``reader()`` (kept if it is a text)."""
        cached = self._entries.get(key)
        if cached is not None:
            self._entries.move_to_end(key)
            metrics.WORKER_FILE_TEXT_CACHE.labels("hit").inc()
            return cached[0]
        flight = self._flights.get(key)
        if flight is None:
            metrics.WORKER_FILE_TEXT_CACHE.labels("miss").inc()
            task = asyncio.create_task(self._fill(key, reader), name="file-read")
            task.add_done_callback(_retrieve)
            flight = self._flights[key] = _Flight(task)
        else:
            metrics.WORKER_FILE_TEXT_CACHE.labels("shared").inc()
        flight.waiters += 1
        try:
            # Shielded: cancelling this caller must not cancel the others' read.
            return await asyncio.shield(flight.task)
        finally:
            flight.waiters -= 1
            if not flight.waiters and not flight.task.done():
                # Nobody wants it any more: stop the reader (the sandbox kills
                # its process), and let the next caller start afresh.
                flight.task.cancel()
                if self._flights.get(key) is flight:
                    del self._flights[key]

    async def _fill(self, key: Key, reader: Callable[[], Awaitable[Outcome]]) -> Outcome:
        try:
            outcome = await reader()
        finally:
            flight = self._flights.get(key)
            if flight is not None and flight.task is asyncio.current_task():
                del self._flights[key]
        if not outcome.error:
            self._put(key, outcome)
        return outcome

    def _put(self, key: Key, outcome: Outcome) -> None:
        size = entry_bytes(outcome)
        if size > self._max_bytes or not self._max_entries:
            return  # one larger than the whole cache is not kept
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        self._entries[key] = (outcome, size)
        self.bytes += size
        while len(self._entries) > self._max_entries or self.bytes > self._max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.bytes -= dropped


def _retrieve(task: asyncio.Task[Outcome]) -> None:
    """Mark a failed read's exception as seen: its callers may all have left."""
    if not task.cancelled():
        task.exception()
