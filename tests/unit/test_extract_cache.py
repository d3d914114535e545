"""The worker's cache of file texts (``worker/extract_cache.py``): hits per
principal, SHA-256 and reader version, its bounds, one read for concurrent
callers, and what it does not keep. Readers are fakes driven by events (no
timing); ``read_files`` is driven with a fake sandbox to check the key it builds."""

from __future__ import annotations

import asyncio
import importlib.metadata
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from turnmesh.agent.builtin.echo import EchoAgent
from turnmesh.files import ALLOWED_MIME_TYPES, Outcome, Sandbox
from turnmesh.files import extract as ex
from turnmesh.runtime.principals import ANONYMOUS
from turnmesh.v1 import message_pb2
from turnmesh.worker import WorkerConfig, WorkerServicer
from turnmesh.worker.attachments import read_files
from turnmesh.worker.extract_cache import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_ENTRIES,
    ExtractCache,
    Key,
    entry_bytes,
)

TEXT = Outcome(text="the vault code is 7391")


def key(name: str, principal: str = "alice") -> Key:
    return (principal, name, "text/1")


class Reader:
    """A fake reader: counts its calls, and holds each until ``gate`` is set
    (when given); ``result`` is returned, or raised if an exception."""

    def __init__(
        self, result: Outcome | Exception = TEXT, *, gate: asyncio.Event | None = None
    ) -> None:
        self.result = result
        self.gate = gate
        self.calls = 0
        self.started = asyncio.Event()
        self.stopped = asyncio.Event()  # cancelled while reading

    async def __call__(self) -> Outcome:
        self.calls += 1
        self.started.set()
        try:
            if self.gate is not None:
                await self.gate.wait()
        except asyncio.CancelledError:
            self.stopped.set()
            raise
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def counted(result: str) -> float:
    value = REGISTRY.get_sample_value("turnmesh_worker_file_text_cache_total", {"result": result})
    return value or 0.0


# --- hits and misses ---------------------------------------------------------


async def test_the_same_key_is_read_once_then_served_from_the_cache() -> None:
    cache, reader = ExtractCache(), Reader()
    hits, misses = counted("hit"), counted("miss")
    assert await cache.read(key("a"), reader) == TEXT
    assert await cache.read(key("a"), reader) == TEXT
    assert reader.calls == 1
    assert (counted("hit") - hits, counted("miss") - misses) == (1, 1)


async def test_another_principal_another_sha_or_reader_version_is_a_miss() -> None:
    cache, reader = ExtractCache(), Reader()
    await cache.read(("alice", "sha", "pdf/1/pypdf-7.1.1"), reader)
    await cache.read(("bob", "sha", "pdf/1/pypdf-7.1.1"), reader)
    await cache.read(("alice", "other", "pdf/1/pypdf-7.1.1"), reader)
    await cache.read(("alice", "sha", "pdf/1/pypdf-7.2.0"), reader)
    await cache.read(("alice", "sha", "pdf/2/pypdf-7.1.1"), reader)
    assert reader.calls == 5
    await cache.read(("bob", "sha", "pdf/1/pypdf-7.1.1"), reader)
    assert reader.calls == 5


# --- bounds --------------------------------------------------------------------


async def test_past_the_entry_limit_the_least_recently_used_goes() -> None:
    cache, reader = ExtractCache(max_entries=2), Reader()
    await cache.read(key("a"), reader)
    await cache.read(key("b"), reader)
    await cache.read(key("a"), reader)  # a hit: a is now the most recent
    await cache.read(key("c"), reader)
    assert (key("a") in cache, key("b") in cache, key("c") in cache) == (True, False, True)
    assert cache.entries == 2
    assert cache.bytes == 2 * entry_bytes(TEXT)


async def test_past_the_byte_limit_the_least_recently_used_go() -> None:
    small, large = Outcome(text="s" * 100), Outcome(text="l" * 1_000)
    cache = ExtractCache(max_bytes=2 * entry_bytes(small) + 10)
    await cache.read(key("a"), Reader(small))
    await cache.read(key("b"), Reader(small))
    assert cache.bytes == 2 * entry_bytes(small)
    await cache.read(key("a"), Reader(small))  # a hit
    await cache.read(key("c"), Reader(small))
    assert (key("a") in cache, key("b") in cache, key("c") in cache) == (True, False, True)
    # Larger than the whole cache: returned, not kept, and nothing else is dropped.
    assert await cache.read(key("big"), Reader(large)) == large
    assert key("big") not in cache
    assert cache.entries == 2
    assert cache.bytes == 2 * entry_bytes(small)


async def test_wider_characters_count_their_bytes() -> None:
    # A str takes 1, 2 or 4 bytes a character: what is counted is what it holds.
    assert entry_bytes(Outcome(text="é" * 1000)) < entry_bytes(Outcome(text="€" * 1000))
    assert entry_bytes(Outcome(text="€" * 1000)) < entry_bytes(Outcome(text="😀" * 1000))
    assert entry_bytes(Outcome(text="😀" * 1000)) > 4000


async def test_zero_entries_keeps_nothing() -> None:
    cache, reader = ExtractCache(max_entries=0), Reader()
    await cache.read(key("a"), reader)
    await cache.read(key("a"), reader)
    assert (reader.calls, cache.entries, cache.bytes) == (2, 0, 0)


# --- single flight -------------------------------------------------------------


async def test_concurrent_reads_of_one_key_share_one_read() -> None:
    cache, gate = ExtractCache(), asyncio.Event()
    reader = Reader(gate=gate)
    shared = counted("shared")
    first = asyncio.create_task(cache.read(key("a"), reader))
    second = asyncio.create_task(cache.read(key("a"), reader))
    await reader.started.wait()
    gate.set()
    assert list(await asyncio.gather(first, second)) == [TEXT, TEXT]
    assert reader.calls == 1
    assert counted("shared") - shared == 1
    assert key("a") in cache


async def test_a_cancelled_caller_leaves_the_read_to_the_others() -> None:
    cache, gate = ExtractCache(), asyncio.Event()
    reader = Reader(gate=gate)
    first = asyncio.create_task(cache.read(key("a"), reader))
    second = asyncio.create_task(cache.read(key("a"), reader))
    await reader.started.wait()
    first.cancel()  # the caller that started the read
    with pytest.raises(asyncio.CancelledError):
        await first
    gate.set()
    assert await second == TEXT
    assert (reader.calls, reader.stopped.is_set()) == (1, False)
    assert key("a") in cache


async def test_the_last_caller_leaving_stops_the_read_and_the_next_starts_afresh() -> None:
    cache, gate = ExtractCache(), asyncio.Event()
    reader = Reader(gate=gate)
    callers = [asyncio.create_task(cache.read(key("a"), reader)) for _ in range(2)]
    await reader.started.wait()
    for caller in callers:
        caller.cancel()
    await asyncio.gather(*callers, return_exceptions=True)
    async with asyncio.timeout(30):  # a guard only: it is set within a loop turn or two
        await reader.stopped.wait()  # cancelled, as the sandbox kills its process
    assert key("a") not in cache
    gate.set()
    assert await cache.read(key("a"), reader) == TEXT
    assert reader.calls == 2


# --- what is not kept ------------------------------------------------------------


async def test_a_failure_is_not_kept() -> None:
    cache = ExtractCache()
    refused = Reader(Outcome(error="reading the file took longer than 30 seconds"))
    assert (await cache.read(key("a"), refused)).error
    assert (await cache.read(key("a"), refused)).error
    assert (refused.calls, cache.entries) == (2, 0)
    # A truncated text is a text (the readers' limits are part of their version).
    truncated = Reader(Outcome(text="x" * 10, truncated=True))
    await cache.read(key("b"), truncated)
    await cache.read(key("b"), truncated)
    assert truncated.calls == 1


async def test_a_reader_that_raises_fails_every_caller_and_is_not_kept() -> None:
    cache, gate = ExtractCache(), asyncio.Event()
    broken = Reader(RuntimeError("the fork server died"), gate=gate)
    callers = [asyncio.create_task(cache.read(key("a"), broken)) for _ in range(2)]
    await broken.started.wait()
    gate.set()
    results = await asyncio.gather(*callers, return_exceptions=True)
    assert [type(r) for r in results] == [RuntimeError, RuntimeError]
    assert key("a") not in cache
    assert await cache.read(key("a"), Reader()) == TEXT


# --- the key read_files builds -------------------------------------------------


class FakeSandbox(Sandbox):
    """Reads nothing: each file's text is its bytes; counts the reads."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[str, str]] = []

    async def extract(
        self, mime_type: str, content: bytes, *, principal: str = ANONYMOUS, turn: str = ""
    ) -> Outcome:
        self.reads.append((principal, turn))
        return Outcome(text=content.decode())


def _file(content: bytes, mime_type: str = "text/plain") -> message_pb2.File:
    return message_pb2.File(content=content, mime_type=mime_type, filename="f")


@pytest.fixture
def fresh_reader_versions() -> Iterator[None]:
    ex.reader_version.cache_clear()
    yield
    ex.reader_version.cache_clear()


@pytest.mark.usefixtures("fresh_reader_versions")
async def test_read_files_keys_by_principal_sha_and_reader_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sandbox, cache = FakeSandbox(), ExtractCache()
    note = _file(b"the vault code is 7391")
    _, first = await read_files(sandbox, cache, [note], principal="alice", turn="s t1")
    _, again = await read_files(sandbox, cache, [note], principal="alice", turn="s t2")
    assert sandbox.reads == [("alice", "s t1")]
    assert again == first  # same text, same SHA-256
    # Another principal's same bytes are read for it.
    _, bobs = await read_files(sandbox, cache, [note], principal="bob", turn="b t1")
    assert bobs[0].text == first[0].text
    assert len(sandbox.reads) == 2
    # Other bytes, and the same bytes under a new reader, are read.
    await read_files(sandbox, cache, [_file(b"other")], principal="alice", turn="s t3")
    monkeypatch.setattr(ex, "READER_REVISION", ex.READER_REVISION + 1)
    ex.reader_version.cache_clear()
    await read_files(sandbox, cache, [note], principal="alice", turn="s t4")
    assert len(sandbox.reads) == 4


async def test_one_file_attached_twice_in_a_turn_is_read_once() -> None:
    sandbox, cache = FakeSandbox(), ExtractCache()
    note = _file(b"twice")
    _, refs = await read_files(sandbox, cache, [note, note], principal="alice", turn="s t1")
    assert [r.text for r in refs] == ["twice", "twice"]
    assert len(sandbox.reads) == 1


# --- reader versions and settings ----------------------------------------------


@pytest.mark.usefixtures("fresh_reader_versions")
def test_every_accepted_type_has_a_reader_whose_version_names_its_libraries() -> None:
    assert set(ex.READERS) == ALLOWED_MIME_TYPES
    pypdf = importlib.metadata.version("pypdf")
    assert ex.reader_version("application/pdf") == f"pdf/{ex.READER_REVISION}/pypdf-{pypdf}"
    assert ex.reader_version("text/csv") == ex.reader_version("text/plain")
    assert ex.reader_version("image/png").startswith(f"ocr/{ex.READER_REVISION}/pillow-")


def test_the_workers_settings_default_to_the_caches_own() -> None:
    config = WorkerConfig()
    assert config.file_text_cache_entries == DEFAULT_MAX_ENTRIES
    assert config.file_text_cache_mb * 2**20 == DEFAULT_MAX_BYTES
    cache = ExtractCache()
    servicer = WorkerServicer(EchoAgent(), agent_name="echo", worker_id="w", file_texts=cache)
    assert servicer.file_texts is cache
