"""Webhooks: a POST to the caller's URL when a turn finishes, fails or starts
waiting for the client, signed as Standard Webhooks specifies
(https://www.standardwebhooks.com: ``webhook-id``, ``webhook-timestamp`` and
``webhook-signature: v1,<base64 HMAC-SHA256>``), so any of its libraries
verifies them.

Delivery is at least once and never in a turn's way: a notice is written to
an outbox (``Outbox``: the session store's where it has one, so it survives
a restart), and ``WebhookSender`` delivers from it in the background, retrying
with exponential backoff until the receiver answers 2xx, answers 410, or the
attempts run out. A notice keeps its id across attempts (the idempotency key
receivers drop repeats by); each attempt is signed anew with its own time.
The outbox is bounded: past its limit a new notice is dropped (counted), never
the turn.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import functools
import json
import logging
import random
import re
import time
import unicodedata
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import httpx
from standardwebhooks import Webhook

from turnmesh.runtime import metrics
from turnmesh.runtime.errors import FieldViolation, InvalidArgument
from turnmesh.runtime.ids import new_id

__all__ = [
    "MAX_NOTICE_BYTES",
    "Delivery",
    "MemoryOutbox",
    "Outbox",
    "OutboxUnavailable",
    "WebhookSender",
    "WebhookSettings",
    "allowed",
    "capped_owners",
    "check_destination",
    "notice",
    "settings_from",
]

log = logging.getLogger(__name__)

MAX_URL_CHARS = 2048
# A notice's body, at most: a turn's is cut to fit (``turn_records.bounded``),
# so the outbox holds at most its count of these.
MAX_NOTICE_BYTES = 64 * 1024
# The memory store's outbox holds at most this many bytes of bodies.
MAX_MEMORY_OUTBOX_BYTES = 64 * 2**20
# Of a receiver's answer, read at most (beyond httpx's own buffer of one
# network read, 64 KiB): its status is all a delivery needs.
MAX_RESPONSE_BYTES = 4096


@dataclass(frozen=True)
class WebhookSettings:
    """Where webhooks may go and how hard they are tried."""

    # Allowed destinations: URL prefixes (scheme://host[:port][/path]); none
    # allowed, no webhooks.
    allow: Sequence[str] = ()
    # The signing secret, Standard Webhooks' form ("whsec_" + base64).
    secret: str = ""
    max_attempts: int = 8
    first_retry_seconds: float = 1.0
    max_retry_seconds: float = 600.0
    timeout_seconds: float = 10.0
    # Notices waiting in the outbox, at most; of one principal's turns, at
    # most (one tenant's failing receiver cannot crowd the others out).
    max_pending: int = 10_000
    max_pending_per_owner: int = 1_000
    # Deliveries in flight at once, from this server; of one principal's
    # turns, at most (one tenant's slow or failing receiver cannot hold
    # every slot: the others' notices are claimed past its own).
    concurrency: int = 8
    max_in_flight_per_owner: int = 2


def settings_from(
    allow: str | None,
    secret_file: str | None,
    max_attempts: int = 8,
    first_retry_seconds: float = 1.0,
    timeout_seconds: float = 10.0,
) -> WebhookSettings:
    """The server's webhook settings from its flags; ValueError, in words
    for the operator, if they cannot work."""
    prefixes = tuple(p.strip() for p in (allow or "").split(",") if p.strip())
    for prefix in prefixes:
        parts = urlsplit(prefix)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--webhook-allow: {prefix!r} is not an http(s) URL prefix")
    secret = ""
    if prefixes:
        if not secret_file:
            raise ValueError("--webhook-allow needs --webhook-secret-file (the signing secret)")
        try:
            with open(secret_file, encoding="utf-8") as file:
                secret = file.read().strip()
        except OSError as exc:
            raise ValueError(f"--webhook-secret-file: {exc.strerror}: {secret_file}") from None
        try:
            Webhook(secret)
        except Exception:
            raise ValueError(
                "--webhook-secret-file: not a Standard Webhooks secret (whsec_<base64>)"
            ) from None
    return WebhookSettings(
        allow=prefixes,
        secret=secret,
        max_attempts=max_attempts,
        first_retry_seconds=first_retry_seconds,
        timeout_seconds=timeout_seconds,
    )


def check_destination(url: str, allow: Sequence[str], field_name: str) -> str:
    """The webhook URL, if the server's allow-list lets notices go there."""
    problem = _problem(url, allow)
    if problem:
        raise InvalidArgument([FieldViolation(field_name, problem)])
    return url


def allowed(url: str, allow: Sequence[str]) -> bool:
    return not _problem(url, allow)


# Path segments a client or the receiver's server may normalise away (httpx
# does), which would take a request out of the allowed prefix:
# "/team-a/../admin" is "/admin".
_DOT_SEGMENTS = frozenset({".", ".."})
# Percent-encoded "/" and "\\": servers that decode them before they route
# make "/team-a/..%2fadmin" the "/admin" that the prefix check never saw.
_ENCODED_SEPARATORS = re.compile(r"%(2f|5c)", re.IGNORECASE)


def _problem(url: str, allow: Sequence[str]) -> str:
    if len(url) > MAX_URL_CHARS:
        return f"at most {MAX_URL_CHARS} characters"
    if "\\" in url or any(c.isspace() or not c.isprintable() for c in url):
        return "must not hold spaces, control characters or backslashes"
    if not url.isascii():
        # Sent percent-encoded, and normalised by some servers: two
        # fullwidth dots (U+FF0E) are ".." to them.
        return "must hold only ASCII characters (percent-encode the others)"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not one
        httpx.URL(url)  # what the sender will make of it
    except (ValueError, httpx.InvalidURL):
        return "must be an http or https URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http or https URL"
    if parts.username or parts.password:
        return "must not carry credentials"
    if _ENCODED_SEPARATORS.search(parts.path):
        return "must not hold percent-encoded slashes or backslashes (%2F, %5C) in its path"
    if any(_dot_segment(segment) for segment in parts.path.split("/")):
        return "must not hold . or .. path segments"
    if not any(_under(url, prefix) for prefix in allow):
        if not allow:
            return "is not a destination this server sends webhooks to (its allow-list is empty)"
        return "is not a destination this server sends webhooks to (see its allow-list)"
    return ""


def _dot_segment(segment: str) -> bool:
    """Whether a server could read the segment as "." or "..": decoded once
    or more ("%252e" is "%2e" is "."), in compatibility form (fullwidth dots
    are dots), or before a ";" parameter (some servers read "..;" as "..")."""
    for _ in range(4):  # each decoding level in turn; more would be absurd
        plain = unicodedata.normalize("NFKC", segment)
        if plain.split(";", 1)[0] in _DOT_SEGMENTS or "/" in plain or "\\" in plain:
            return True
        decoded = unquote(segment)
        if decoded == segment:
            return False
        segment = decoded
    return True  # still encoded after that: nothing a sender means


def _under(url: str, prefix: str) -> bool:
    # A prefix that ends at a host must end there: an allowed
    # "https://hooks.example.com" admits its paths on the default port, never
    # "https://hooks.example.com.evil" nor "https://hooks.example.com:6379"
    # (a port must be named: "https://hooks.example.com:8443").
    if not url.startswith(prefix):
        return False
    rest = url[len(prefix) :]
    return prefix.endswith("/") or rest == "" or rest[0] in "/?#"


def notice(
    kind: str, data: Mapping[str, Any], notice_id: str = "", truncated: bool = False
) -> tuple[str, bytes]:
    """A notice's id (a new one unless given) and body: ``{"type",
    "timestamp", "data"}`` (kind: ``turn.finished``, ``turn.failed``...),
    and ``"truncated": true`` when ``data`` was cut to fit."""
    notice_id = notice_id or f"msg_{new_id()}"
    body: dict[str, Any] = {
        "type": kind,
        "timestamp": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "data": dict(data),
    }
    if truncated:
        body["truncated"] = True
    return notice_id, json.dumps(body, separators=(",", ":")).encode()


class OutboxUnavailable(Exception):
    """The outbox could not be written (not full: failing): the notice is
    not queued, and whoever sent it must be able to send it again."""


@dataclass
class Delivery:
    """A notice in the outbox: where it goes, and its attempts so far."""

    id: str
    url: str
    body: bytes
    attempts: int = 0
    due: float = field(default_factory=time.time)
    # The principal whose turn it tells of (its share of the outbox).
    owner: str = ""


def capped_owners(busy: Mapping[str, int], per_owner: int | None) -> int:
    """How many owners have ``per_owner`` deliveries in flight already."""
    return sum(1 for n in busy.values() if per_owner is not None and n >= per_owner)


class Outbox(Protocol):
    """Where notices wait to be delivered (each store has one)."""

    async def add(self, delivery: Delivery, limit: int, owner_limit: int | None = None) -> bool:
        """Keep the notice (one with its id kept already stays as it is);
        False (nothing kept) if ``limit`` are waiting, or ``owner_limit`` of
        its owner's."""

    async def claim(
        self,
        now: float,
        lease_seconds: float,
        limit: int,
        busy: Mapping[str, int] | None = None,
        per_owner: int | None = None,
    ) -> list[Delivery]:
        """At most ``limit`` notices due by ``now``, each held for
        ``lease_seconds`` (a server that dies holding one leaves it due again
        after that), with their owners. Fair by owner: owners are taken by
        their earliest due notice, and of each at most ``per_owner`` (None:
        no cap) less the deliveries ``busy`` says it has in flight here, so
        an owner at its cap is passed over, however many of its notices are
        due first. A claim looks at no more than ``limit`` plus the owners at
        their cap, and reads at most ``limit`` notices."""

    async def settle(self, delivery: Delivery, retry_at: float | None) -> None:
        """Delivered or given up (``retry_at`` None: gone), or due again then."""

    async def next_due(self, skip: Collection[str] = ()) -> float | None:
        """When the earliest notice of an owner not in ``skip`` (those at
        their cap here) is due, if any waits."""


class MemoryOutbox:
    """The memory store's outbox: lost with the process, as its sessions are."""

    def __init__(self, max_bytes: int = MAX_MEMORY_OUTBOX_BYTES) -> None:
        self._waiting: dict[str, Delivery] = {}
        self._owners: Counter[str] = Counter()
        # Each owner's notices as (due, id), in order; and the owners as
        # (their earliest due, owner), in order: a claim reads only the heads
        # of the owners it takes from.
        self._queues: dict[str, list[tuple[float, str]]] = {}
        self._heads: list[tuple[float, str]] = []
        # The bodies it holds, in bytes: in this process's memory, so bounded
        # below what the count and each body's bound allow (625 MiB).
        self._bytes = 0
        self._max_bytes = max_bytes

    async def add(self, delivery: Delivery, limit: int, owner_limit: int | None = None) -> bool:
        if delivery.id in self._waiting:
            return True
        if len(self._waiting) >= limit or self._bytes + len(delivery.body) > self._max_bytes:
            return False
        if owner_limit is not None and self._owners[delivery.owner] >= owner_limit:
            return False
        kept = dataclasses.replace(delivery)  # its due time is our index's key: ours alone
        self._waiting[kept.id] = kept
        self._owners[kept.owner] += 1
        self._bytes += len(kept.body)
        self._queue(kept)
        return True

    async def claim(
        self,
        now: float,
        lease_seconds: float,
        limit: int,
        busy: Mapping[str, int] | None = None,
        per_owner: int | None = None,
    ) -> list[Delivery]:
        busy = busy or {}
        capped = capped_owners(busy, per_owner)
        # Each owner due and below its cap has a notice for us: these suffice.
        owners = [owner for head, owner in self._heads[: limit + capped] if head <= now]
        out: list[Delivery] = []
        for owner in owners:
            room = limit - len(out)
            if per_owner is not None:
                room = min(room, per_owner - busy.get(owner, 0))
            due = [self._waiting[i] for at, i in self._queues[owner][: max(room, 0)] if at <= now]
            for delivery in due:
                self._unqueue(delivery)
                delivery.due = now + lease_seconds
                self._queue(delivery)
                out.append(dataclasses.replace(delivery))
        return out

    async def settle(self, delivery: Delivery, retry_at: float | None) -> None:
        if (kept := self._waiting.get(delivery.id)) is None:
            return
        self._unqueue(kept)
        if retry_at is None:
            del self._waiting[kept.id]
            self._bytes -= len(kept.body)
            self._owners[kept.owner] -= 1
            if self._owners[kept.owner] <= 0:
                del self._owners[kept.owner]
        else:
            kept.attempts, kept.due = delivery.attempts, retry_at
            self._queue(kept)

    async def next_due(self, skip: Collection[str] = ()) -> float | None:
        return next((at for at, owner in self._heads if owner not in skip), None)

    def _queue(self, delivery: Delivery) -> None:
        queue = self._queues.setdefault(delivery.owner, [])
        before = queue[0][0] if queue else None
        bisect.insort(queue, (delivery.due, delivery.id))
        self._head_moved(delivery.owner, before, queue[0][0])

    def _unqueue(self, delivery: Delivery) -> None:
        queue = self._queues[delivery.owner]
        before = queue[0][0]
        del queue[bisect.bisect_left(queue, (delivery.due, delivery.id))]
        self._head_moved(delivery.owner, before, queue[0][0] if queue else None)
        if not queue:
            del self._queues[delivery.owner]

    def _head_moved(self, owner: str, before: float | None, after: float | None) -> None:
        if before == after:
            return
        if before is not None:
            del self._heads[bisect.bisect_left(self._heads, (before, owner))]
        if after is not None:
            bisect.insort(self._heads, (after, owner))


class WebhookSender:
    """Delivers the outbox's notices, in the background, with retries."""

    def __init__(
        self,
        settings: WebhookSettings,
        outbox: Outbox,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if settings.allow and not settings.secret:
            raise ValueError("webhooks need a signing secret")
        if settings.max_in_flight_per_owner < 1:
            raise ValueError("max_in_flight_per_owner must be at least 1")
        self.settings = settings
        self.outbox = outbox
        self._signer = Webhook(settings.secret) if settings.allow else None
        self._client = httpx.AsyncClient(
            timeout=settings.timeout_seconds, follow_redirects=False, transport=transport
        )
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._in_flight: set[asyncio.Task[None]] = set()
        # Deliveries in flight, by owner (its share of the slots).
        self._in_flight_of: Counter[str] = Counter()

    @property
    def enabled(self) -> bool:
        return bool(self.settings.allow)

    def start(self) -> None:
        if self._task is None and self.enabled:
            self._task = asyncio.create_task(self._run(), name="webhooks")

    async def stop(self) -> None:
        """Stop delivering; what is left waits in the outbox (a durable one
        is delivered after the restart, or by another server)."""
        tasks = [t for t in (self._task, *self._in_flight) if t is not None]
        for task in tasks:
            task.cancel()  # a delivery cut short stays in the outbox: sent again
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None
        await self._client.aclose()

    async def send(
        self,
        url: str,
        kind: str,
        data: Mapping[str, Any],
        notice_id: str = "",
        owner: str = "",
        truncated: bool = False,
    ) -> str | None:
        """Put a notice in the outbox (``notice_id``: its id, when the caller
        makes the same notice more than once; the outbox keeps one;
        ``owner``: the principal it counts against); its id, or None if the
        outbox is full or the body is over ``MAX_NOTICE_BYTES`` (the notice
        is dropped, counted; ``truncated``: the caller cut ``data`` to fit).
        OutboxUnavailable if the outbox failed: nothing is queued, and the
        caller decides how the notice is sent again (the turn goes on either
        way)."""
        notice_id, body = notice(kind, data, notice_id, truncated)
        if len(body) > MAX_NOTICE_BYTES:
            log.warning("webhook %s for %s dropped: %d bytes", notice_id, kind, len(body))
            metrics.WEBHOOKS.labels("dropped").inc()
            return None
        try:
            kept = await self.outbox.add(
                Delivery(notice_id, url, body, owner=owner),
                self.settings.max_pending,
                self.settings.max_pending_per_owner,
            )
        except Exception as exc:  # whatever the store raised: it holds nothing
            log.warning("webhook %s for %s not queued: the outbox failed", notice_id, kind)
            metrics.WEBHOOKS.labels("unqueued").inc()
            raise OutboxUnavailable(f"the webhook outbox failed: {type(exc).__name__}") from exc
        if not kept:
            metrics.WEBHOOKS.labels("dropped").inc()
            return None
        metrics.WEBHOOKS.labels("queued").inc()
        self._wake.set()
        return notice_id

    def _lease_seconds(self) -> float:
        # An attempt ends by its deadline (``_post``), so a lease of three
        # deadlines ends only once its holder is gone (or stalled).
        return self.settings.timeout_seconds * 3

    async def _run(self) -> None:
        in_flight = self._in_flight
        while True:
            room = self.settings.concurrency - len(in_flight)
            if room <= 0:
                # Every slot busy: only a delivery that ends makes room (and
                # sets the event); the outbox is not asked until then.
                self._wake.clear()
                await self._wake.wait()
                continue
            claimed: list[Delivery] = []
            try:
                claimed = await self.outbox.claim(
                    time.time(),
                    self._lease_seconds(),
                    room,
                    dict(self._in_flight_of),  # a copy: SQLite reads it on its own thread
                    self.settings.max_in_flight_per_owner,
                )
            except Exception:
                log.warning("webhook outbox unreachable; trying again", exc_info=True)
            for delivery in claimed:
                self._in_flight_of[delivery.owner] += 1
                task = asyncio.create_task(self._deliver(delivery))
                in_flight.add(task)
                task.add_done_callback(functools.partial(self._delivered, delivery.owner))
            if claimed and len(claimed) == room:
                continue  # more may be due
            await self._sleep()

    def _delivered(self, owner: str, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._in_flight_of[owner] -= 1
        if self._in_flight_of[owner] <= 0:
            del self._in_flight_of[owner]
        self._wake.set()  # room for another

    async def _sleep(self) -> None:
        """Until a notice is added or settled, or the next one is due (of an
        owner below its cap: those at it wait for a delivery to end, which
        wakes this)."""
        self._wake.clear()
        cap = self.settings.max_in_flight_per_owner
        capped = {owner for owner, n in self._in_flight_of.items() if n >= cap}
        try:
            due = await self.outbox.next_due(capped)
        except Exception:
            due = None
        wait = 1.0 if due is None else max(0.0, min(due - time.time(), 1.0))
        # The outbox may be shared with other servers (or hold a lease that
        # ends): look again at least every second.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await self._wake.wait()

    async def _deliver(self, delivery: Delivery) -> None:
        delivery.attempts += 1
        if allowed(delivery.url, self.settings.allow):
            status = await self._post(delivery)
        else:
            # Queued by a server whose allow-list admits it (a mesh whose
            # servers' lists differ, for a while): an attempt that failed
            # here, left for a server that may send it.
            log.info("webhook %s: its URL is not on this server's allow-list", delivery.id)
            status = None
        if status is not None and 200 <= status < 300:
            outcome, retry_at = "delivered", None
        elif status == 410 or delivery.attempts >= self.settings.max_attempts:
            outcome, retry_at = "given_up", None
            log.warning(
                "webhook %s given up after %d attempts (last: %s)",
                delivery.id,
                delivery.attempts,
                status or "no answer",
            )
        else:
            outcome, retry_at = "retried", time.time() + self._backoff(delivery.attempts)
        metrics.WEBHOOKS.labels(outcome).inc()
        try:
            await self.outbox.settle(delivery, retry_at)
        except Exception:  # the lease ends and it is tried again: at least once
            log.warning("webhook %s not settled: the outbox failed", delivery.id)

    def _backoff(self, attempts: int) -> float:
        base = self.settings.first_retry_seconds * 2.0 ** (attempts - 1)
        # Full jitter over the upper half: receivers that failed together do
        # not get every retry at the same instant.
        return min(self.settings.max_retry_seconds, base) * random.uniform(0.5, 1.0)

    async def _post(self, delivery: Delivery) -> int | None:
        sent_at = datetime.now(UTC)
        headers = {
            "content-type": "application/json",
            "user-agent": "turnmesh-webhooks",
            "webhook-id": delivery.id,
            "webhook-timestamp": str(int(sent_at.timestamp())),
        }
        if self._signer is not None:
            headers["webhook-signature"] = self._signer.sign(
                delivery.id, sent_at, delivery.body.decode()
            )
        status: int | None = None
        try:
            # One deadline for the whole attempt (httpx's timeout is per
            # read: a body trickled a byte at a time never trips it), well
            # inside the claim's lease, so no other claim of the notice
            # starts while this one runs.
            async with asyncio.timeout(self.settings.timeout_seconds):
                async with self._client.stream(
                    "POST", delivery.url, content=delivery.body, headers=headers
                ) as response:
                    status = response.status_code  # the answer: the body says nothing more
                    await _skim(response)
        except TimeoutError:
            log.info(
                "webhook %s attempt %d: past its %gs deadline",
                delivery.id,
                delivery.attempts,
                self.settings.timeout_seconds,
            )
        except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:  # never left unsettled
            log.info(
                "webhook %s attempt %d: %s", delivery.id, delivery.attempts, type(exc).__name__
            )
        return status


async def _skim(response: httpx.Response) -> None:
    """Read at most ``MAX_RESPONSE_BYTES`` of a receiver's answer: a short
    one is read whole, so its connection is kept for the next notice; a
    longer one is left unread (the connection is closed), never held."""
    read = 0
    async for chunk in response.aiter_raw():
        read += len(chunk)
        if read > MAX_RESPONSE_BYTES:
            return
