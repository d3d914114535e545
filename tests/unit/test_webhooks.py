"""Webhook delivery (server.webhooks.sender) to a real HTTP receiver on loopback:
Standard Webhooks signatures that its own library verifies, retries with the
same id until a 2xx, giving up, the allow-list and the outbox's bound."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Collection, Mapping

import pytest
from standardwebhooks import Webhook

from tests.support.webhooks import SECRET, receiving
from turnmesh.runtime.errors import InvalidArgument
from turnmesh.server.webhooks.outbox import Delivery, MemoryOutbox
from turnmesh.server.webhooks.sender import WebhookSender
from turnmesh.server.webhooks.settings import WebhookSettings, check_destination


def _settings(**kw: object) -> WebhookSettings:
    base: dict[str, object] = {
        "allow": ("http://127.0.0.1",),
        "secret": SECRET,
        "first_retry_seconds": 0.01,
        "max_retry_seconds": 0.05,
        "max_attempts": 4,
    }
    return WebhookSettings(**{**base, **kw})  # type: ignore[arg-type]


class WatchedOutbox(MemoryOutbox):
    """Says when it holds nothing more (every notice delivered or given up)."""

    def __init__(self) -> None:
        super().__init__()
        self.empty = asyncio.Event()

    async def settle(self, delivery: Delivery, retry_at: float | None) -> None:
        await super().settle(delivery, retry_at)
        if await self.next_due() is None:
            self.empty.set()


async def _settled(outbox: WatchedOutbox) -> None:
    await asyncio.wait_for(outbox.empty.wait(), 30)


async def test_a_notice_is_signed_and_retried_with_its_id_until_delivered() -> None:
    async with receiving() as receiver:
        receiver.script = [500, 503]
        outbox = WatchedOutbox()
        sender = WebhookSender(_settings(allow=(receiver.url,)), outbox)
        sender.start()
        try:
            notice_id = await sender.send(
                receiver.url, "turn.finished", {"session_id": "s1", "turn_id": "t1"}
            )
            await receiver.requests(3)
            await _settled(outbox)
        finally:
            await sender.stop()
        assert len(receiver.seen) == 3  # two failures, then delivered; no more
        verifier = Webhook(SECRET)
        for headers, body in receiver.seen:
            assert headers["webhook-id"] == notice_id
            payload = verifier.verify(body, headers)  # raises if the signature is wrong
            assert payload["type"] == "turn.finished"
            assert payload["data"] == {"session_id": "s1", "turn_id": "t1"}
        # A tampered body fails the receiver's check.
        headers, body = receiver.seen[-1]
        with pytest.raises(Exception, match="No matching signature"):
            verifier.verify(body.replace(b"t1", b"t2"), headers)


async def test_a_receiver_that_keeps_failing_is_given_up() -> None:
    async with receiving() as receiver:
        receiver.script = [500] * 10
        outbox = WatchedOutbox()
        sender = WebhookSender(_settings(max_attempts=3, allow=(receiver.url,)), outbox)
        sender.start()
        try:
            await sender.send(receiver.url, "turn.failed", {"turn_id": "t1"})
            await _settled(outbox)
        finally:
            await sender.stop()
        assert len(receiver.seen) == 3


async def test_410_gone_stops_at_once() -> None:
    async with receiving() as receiver:
        receiver.script = [410, 200]
        outbox = WatchedOutbox()
        sender = WebhookSender(_settings(allow=(receiver.url,)), outbox)
        sender.start()
        try:
            await sender.send(receiver.url, "turn.waiting", {"turn_id": "t1"})
            await _settled(outbox)
        finally:
            await sender.stop()
        assert len(receiver.seen) == 1


async def test_an_unreachable_receiver_is_retried_without_blocking_sends() -> None:
    outbox = WatchedOutbox()
    # Nothing listens on port 9 of loopback: each attempt fails at once.
    sender = WebhookSender(_settings(max_attempts=2, allow=("http://127.0.0.1:9",)), outbox)
    sender.start()
    try:
        ids = [await sender.send("http://127.0.0.1:9/hook", "turn.finished", {}) for _ in range(5)]
        assert all(ids) and len(set(ids)) == 5
        await _settled(outbox)
    finally:
        await sender.stop()


class CountedOutbox(WatchedOutbox):
    """Counts how often the sender asks it anything."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    async def claim(
        self,
        now: float,
        lease_seconds: float,
        limit: int,
        busy: Mapping[str, int] | None = None,
        per_owner: int | None = None,
    ) -> list[Delivery]:
        self.asked += 1
        return await super().claim(now, lease_seconds, limit, busy, per_owner)

    async def next_due(self, skip: Collection[str] = ()) -> float | None:
        self.asked += 1
        return await super().next_due(skip)


async def test_a_sender_with_every_slot_busy_waits_without_asking_the_outbox() -> None:
    async with receiving() as receiver:
        receiver.hold = asyncio.Event()
        outbox = CountedOutbox()
        sender = WebhookSender(_settings(allow=(receiver.url,), concurrency=1), outbox)
        sender.start()
        try:
            for n in range(3):  # one in flight, two due behind it
                await sender.send(receiver.url, "turn.finished", {"n": n})
            await receiver.requests(1)
            asked = outbox.asked
            for _ in range(200):  # the loop runs many times: the sender must not
                await asyncio.sleep(0)
            assert outbox.asked == asked
            receiver.hold.set()
            await receiver.requests(3)
            await _settled(outbox)
        finally:
            receiver.hold.set()
            await sender.stop()
        assert len(receiver.seen) == 3


async def test_a_notice_this_server_may_not_send_is_tried_then_given_up() -> None:
    outbox = WatchedOutbox()
    # Queued by a server whose allow-list admitted it; this one's does not.
    await outbox.add(Delivery("m1", "http://127.0.0.2/hook", b"{}"), limit=10)
    sender = WebhookSender(_settings(max_attempts=3, allow=("http://127.0.0.1:9",)), outbox)
    sender.start()
    try:
        await _settled(outbox)
    finally:
        await sender.stop()
    assert await outbox.next_due() is None


async def test_the_outbox_is_bounded_and_a_full_one_drops_the_notice() -> None:
    outbox = WatchedOutbox()
    sender = WebhookSender(_settings(max_pending=3), outbox)  # not started: nothing drains
    try:
        sent = [await sender.send("http://127.0.0.1:9/hook", "turn.finished", {}) for _ in range(5)]
    finally:
        await sender.stop()
    assert [s is not None for s in sent] == [True, True, True, False, False]


async def test_a_claimed_notice_is_held_for_its_lease_only() -> None:
    outbox = MemoryOutbox()
    await outbox.add(Delivery("m1", "http://x/", b"{}", due=10.0), limit=10)
    assert [d.id for d in await outbox.claim(now=10.0, lease_seconds=30.0, limit=5)] == ["m1"]
    assert await outbox.claim(now=20.0, lease_seconds=30.0, limit=5) == []  # held
    # Its holder died: due again once the lease ends.
    assert [d.id for d in await outbox.claim(now=41.0, lease_seconds=30.0, limit=5)] == ["m1"]


class Streamer:
    """A receiver on loopback that answers 200 with a chunked body of its
    own making: each chunk written, until the body ends or the sender hangs
    up (``cut_short``). Plain asyncio: aiohttp would buffer for it."""

    def __init__(self, chunk: bytes, chunks: int, pause: float = 0.0) -> None:
        self.chunk, self.chunks, self.pause = chunk, chunks, pause
        self.connections = 0
        self.sent = 0
        self.cut_short = False
        self.done = asyncio.Event()
        self.url = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await reader.readuntil(b"\r\n\r\n")  # the head; the body is not needed
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for _ in range(self.chunks):
                writer.write(b"%x\r\n%s\r\n" % (len(self.chunk), self.chunk))
                await writer.drain()
                self.sent += len(self.chunk)
                if self.pause:
                    await asyncio.sleep(self.pause)  # the trickle itself, not a wait for it
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            self.cut_short = True
        finally:
            writer.close()
            self.done.set()


@contextlib.asynccontextmanager
async def streaming(streamer: Streamer) -> AsyncIterator[Streamer]:
    server = await asyncio.start_server(streamer.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    streamer.url = f"http://127.0.0.1:{port}/hook"
    try:
        yield streamer
    finally:
        server.close()
        await server.wait_closed()


async def _deliver_one(receiver: Streamer, timeout_seconds: float) -> None:
    """One notice sent to the receiver until the outbox settled it and the
    receiver's answer ended."""
    outbox = WatchedOutbox()
    settings = _settings(allow=(receiver.url,), timeout_seconds=timeout_seconds)
    sender = WebhookSender(settings, outbox)
    sender.start()
    try:
        await sender.send(receiver.url, "turn.finished", {"turn_id": "t1"})
        await _settled(outbox)
        await asyncio.wait_for(receiver.done.wait(), 60)
    finally:
        await sender.stop()


async def test_a_huge_answer_is_not_read() -> None:
    """A receiver answering 200 with 64 MiB: the sender reads a few KiB of it
    and hangs up (it once read it all into memory)."""
    async with streaming(Streamer(b"x" * 2**20, 64)) as receiver:
        await _deliver_one(receiver, timeout_seconds=60)
    assert receiver.cut_short
    # What the kernel's socket buffers took before the sender hung up, at most.
    assert receiver.sent < 32 * 2**20
    assert receiver.connections == 1  # delivered (its status was 200): not retried


async def test_an_answer_trickled_past_the_deadline_is_cut_off() -> None:
    """A byte every 10 ms never trips a per-read timeout; the attempt's own
    deadline (1 s, inside the 3 s lease) ends it, so the notice is never
    claimed again while it is being delivered."""
    async with streaming(Streamer(b"x", 2_000, pause=0.01)) as receiver:
        await _deliver_one(receiver, timeout_seconds=1.0)
    assert receiver.cut_short and receiver.sent < 2_000
    assert receiver.connections == 1


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("ftp://127.0.0.1/hook", "http or https"),
        ("http:///hook", "http or https"),
        ("http://user:pw@127.0.0.1/hook", "credentials"),
        ("http://127.0.0.1.evil.example/hook", "allow-list"),
        ("https://127.0.0.1/hook", "allow-list"),  # another scheme is another origin
        ("http://127.0.0.1/" + "x" * 3000, "at most"),
        ("http://127.0.0.1:6379/", "allow-list"),  # a port the prefix does not name
        ("http://127.0.0.1:abc/", "http or https"),  # not a port
        ("http://[x/hook", "http or https"),
        ("http://127.0.0.1/hook\t", "control characters"),
        ("http://127.0.0.1/a b", "spaces"),
        ("http://127.0.0.1\\@evil.example/", "backslashes"),
        ("http://127.0.0.1/ok/../admin", ". or .."),
        ("http://127.0.0.1/ok/%2E%2e/admin", ". or .."),
        # Encoded separators and dots a receiver's server may decode or
        # normalise before it routes: each leaves the allowed prefix there.
        ("https://hooks.example.com/team-a/..%2f/x", "percent-encoded slashes"),
        ("https://hooks.example.com/team-a/%2e%2e%2fx", "percent-encoded slashes"),
        ("https://hooks.example.com/team-a/..%2F..%2Fx", "percent-encoded slashes"),
        ("https://hooks.example.com/team-a/..%5cx", "percent-encoded slashes"),
        ("https://hooks.example.com/team-a/%5C..%5Cx", "percent-encoded slashes"),
        ("https://hooks.example.com/team-a/\uff0e\uff0e/x", "only ASCII"),
        ("https://hooks.example.com/team-a/caf\u00e9", "only ASCII"),
        ("https://hooks.example.com/team-a/%EF%BC%8E%EF%BC%8E/x", "escapes of ASCII"),  # U+FF0E
        # IIS's %u escapes and overlong UTF-8 are dots and slashes to some.
        ("https://hooks.example.com/team-a/%u002e%u002e/x", "escapes of ASCII"),
        ("https://hooks.example.com/team-a/%U002E%U002E/x", "escapes of ASCII"),
        ("https://hooks.example.com/team-a/%c0%ae%c0%ae/x", "escapes of ASCII"),
        ("https://hooks.example.com/team-a/..%c0%af/x", "escapes of ASCII"),
        ("https://hooks.example.com/team-a/%e0%80%ae/x", "escapes of ASCII"),
        ("https://hooks.example.com/team-a/50%", "escapes of ASCII"),
        ("https://hooks.example.com/team-a/%252e%252e/x", ". or .."),  # decoded twice
        ("https://hooks.example.com/team-a/%252f/x", ". or .."),  # a "/" decoded twice
        ("https://hooks.example.com/team-a/..;/x", ". or .."),  # "..;" is ".." to some
        ("https://hooks.example.com/team-a/%2e/x", ". or .."),
        ("https://hooks.example.com/team-a/.", ". or .."),
    ],
)
def test_destinations_outside_the_allow_list_are_refused(url: str, problem: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        check_destination(url, ("http://127.0.0.1", "https://hooks.example.com/team-a/"), "f")
    (violation,) = refused.value.violations
    assert violation.field == "f" and problem in violation.description
    with pytest.raises(InvalidArgument) as refused:
        check_destination(url, ("http://127.0.0.1",), "webhook_url")
    (violation,) = refused.value.violations
    assert violation.field == "webhook_url" and problem in violation.description


def test_allowed_destinations_pass() -> None:
    allow = ("http://127.0.0.1", "http://127.0.0.1:8080", "https://hooks.example.com/team-a/")
    assert check_destination("http://127.0.0.1/x?y=1", allow, "f")
    assert check_destination("http://127.0.0.1:8080/x", allow, "f").startswith("http://127")
    with pytest.raises(InvalidArgument):
        check_destination("http://127.0.0.1:80801/x", allow, "f")
    assert check_destination("https://hooks.example.com/team-a/in", allow, "f")
    # Encoded characters that are neither dots nor separators stay allowed,
    # in the path and anywhere in the query (it never leaves the prefix).
    assert check_destination("https://hooks.example.com/team-a/a%20b/%7Euser", allow, "f")
    assert check_destination("https://hooks.example.com/team-a/in?next=%2F..%2Fx", allow, "f")
    assert check_destination("https://hooks.example.com/team-a/in;v=1/...x/.hidden", allow, "f")
    with pytest.raises(InvalidArgument):
        check_destination("https://hooks.example.com/team-b/in", allow, "f")
    with pytest.raises(InvalidArgument, match="allow-list is empty"):
        check_destination("http://127.0.0.1/x", (), "f")


def test_webhooks_need_a_secret() -> None:
    with pytest.raises(ValueError, match="secret"):
        WebhookSender(WebhookSettings(allow=("http://127.0.0.1",)), MemoryOutbox())
    with pytest.raises(ValueError, match="at least 1"):
        WebhookSender(_settings(max_in_flight_per_owner=0), MemoryOutbox())


def test_a_notice_body_is_compact_json() -> None:
    from turnmesh.server.webhooks.outbox import notice

    notice_id, body = notice("turn.finished", {"turn_id": "t1"})
    assert notice_id.startswith("msg_")
    parsed = json.loads(body)
    assert parsed["type"] == "turn.finished" and parsed["timestamp"].endswith("Z")
    assert b" " not in body


async def test_one_owner_cannot_fill_the_outbox() -> None:
    outbox = WatchedOutbox()
    sender = WebhookSender(_settings(max_pending=10, max_pending_per_owner=2), outbox)
    try:  # not started: nothing drains
        url = "http://127.0.0.1:9/hook"
        flood = [await sender.send(url, "turn.finished", {}, owner="acme") for _ in range(4)]
        other = await sender.send(url, "turn.finished", {}, owner="globex")
    finally:
        await sender.stop()
    assert [n is not None for n in flood] == [True, True, False, False]
    assert other is not None


async def test_a_notice_past_its_byte_bound_is_dropped() -> None:
    from turnmesh.server.webhooks.outbox import MAX_NOTICE_BYTES

    outbox = WatchedOutbox()
    sender = WebhookSender(_settings(), outbox)  # not started: nothing drains
    try:
        url = "http://127.0.0.1:9/hook"
        fits = await sender.send(url, "turn.finished", {"x": "a" * (MAX_NOTICE_BYTES - 1000)})
        over = await sender.send(url, "turn.finished", {"x": "a" * MAX_NOTICE_BYTES})
    finally:
        await sender.stop()
    assert fits is not None and over is None


async def test_the_memory_outbox_is_bounded_in_bytes() -> None:
    outbox = MemoryOutbox(max_bytes=10_000)
    kept = [await outbox.add(Delivery(f"m{n}", "http://x/", b"x" * 4_000), 100) for n in range(3)]
    assert kept == [True, True, False]
    (first, _) = await outbox.claim(float("inf"), 30, 10)
    await outbox.settle(first, None)  # delivered: its bytes are free again
    assert await outbox.add(Delivery("m3", "http://x/", b"x" * 4_000), 100)
