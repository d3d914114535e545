"""Webhooks: a POST to the caller's URL when a turn finishes, fails or starts
waiting for the client, signed as Standard Webhooks specifies
(https://www.standardwebhooks.com: ``webhook-id``, ``webhook-timestamp`` and
``webhook-signature: v1,<base64 HMAC-SHA256>``), so any of its libraries
verifies them.

``WebhookSender`` puts notices in the store's outbox (``outbox``) and
delivers from it in the background, retrying with exponential backoff until
the receiver answers 2xx, answers 410, or the attempts run out; each attempt
is signed anew with its own time.

Whose notice it is: each names its principal, in its body (``principal``,
covered by the signature) and in a ``webhook-principal`` header (a copy, to
pick the secret by before the body is verified). A principal's keys-file
lines may name its own destinations and secret (``settings.Trust``), read
again at each check and each attempt, so a reload applies to what is queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import httpx
from standardwebhooks import Webhook

from turnmesh.runtime import metrics
from turnmesh.server.webhooks.outbox import (
    MAX_NOTICE_BYTES,
    Delivery,
    Outbox,
    OutboxUnavailable,
    notice,
)
from turnmesh.server.webhooks.settings import (
    NO_TRUST,
    Trust,
    WebhookSettings,
    allowed,
    check_destination,
)

__all__ = ["WebhookSender"]

log = logging.getLogger(__name__)

# Of a receiver's answer, read at most (beyond httpx's own buffer of one
# network read, 64 KiB): its status is all a delivery needs.
MAX_RESPONSE_BYTES = 4096
# The header naming a notice's principal (its body's ``principal`` is the
# signed one).
PRINCIPAL_HEADER = "webhook-principal"


class WebhookSender:
    """Delivers the outbox's notices, in the background, with retries."""

    def __init__(
        self,
        settings: WebhookSettings,
        outbox: Outbox,
        transport: httpx.AsyncBaseTransport | None = None,
        trust: Trust = NO_TRUST,
    ) -> None:
        if settings.allow and not settings.secret:
            raise ValueError("webhooks need a signing secret")
        if settings.max_in_flight_per_owner < 1:
            raise ValueError("max_in_flight_per_owner must be at least 1")
        self.settings = settings
        self.outbox = outbox
        self.trust = trust
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
        """Webhooks are on with the server's secret (principals may have
        their own; the server's signs the others')."""
        return bool(self.settings.secret)

    def destinations(self, principal: str) -> tuple[Sequence[str], bool]:
        """Where the principal's webhooks may go, and whether that is its
        own list (the keys file's) rather than the server's."""
        own = self.trust.webhook_trust(principal).allow
        return (self.settings.allow, False) if own is None else (own, True)

    def allows(self, principal: str, url: str) -> bool:
        return self.enabled and allowed(url, self.destinations(principal)[0])

    def check(self, principal: str, url: str, field_name: str) -> None:
        """InvalidArgument naming ``field_name`` unless the principal's
        webhooks may go to ``url``."""
        allow, own = self.destinations(principal)
        check_destination(url, allow, field_name, own)

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
        ``owner``: the principal whose notice it is, named in it, and whose
        share of the outbox it counts against); its id, or None if the
        outbox is full or the body is over ``MAX_NOTICE_BYTES`` (the notice
        is dropped, counted; ``truncated``: the caller cut ``data`` to fit).
        OutboxUnavailable if the outbox failed: nothing is queued, and the
        caller decides how the notice is sent again (the turn goes on either
        way)."""
        notice_id, body = notice(kind, data, notice_id, truncated, owner)
        return await self.queue(Delivery(notice_id, url, body, owner=owner), kind)

    async def queue(self, delivery: Delivery, kind: str) -> str | None:
        """Put a notice made whole by its caller in the outbox (an A2A push:
        its own body and headers), as ``send`` does; its id, or None if
        dropped; OutboxUnavailable if the outbox failed."""
        notice_id = delivery.id
        if len(delivery.body) > MAX_NOTICE_BYTES:
            log.warning("webhook %s for %s dropped: %d bytes", notice_id, kind, len(delivery.body))
            metrics.WEBHOOKS.labels("dropped").inc()
            return None
        try:
            kept = await self.outbox.add(
                delivery, self.settings.max_pending, self.settings.max_pending_per_owner
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
        if self.allows(delivery.owner, delivery.url):
            status = await self._post(delivery)
        else:
            # Queued by a server whose allow-list admits it (a mesh whose
            # servers' lists differ, for a while), or before a keys file
            # took the URL off its principal's list: an attempt that failed
            # here, left for a server that may send it.
            log.info("webhook %s: its URL is not on its principal's allow-list here", delivery.id)
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
        if delivery.owner:  # "" only for a notice queued before owners were kept
            headers[PRINCIPAL_HEADER] = delivery.owner
        # Its own (an A2A push's token and Authorization): never logged.
        headers.update(delivery.headers)
        secret = self.trust.webhook_trust(delivery.owner).secret or self.settings.secret
        headers["webhook-signature"] = _signer(secret).sign(
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


@functools.lru_cache(maxsize=1024)
def _signer(secret: str) -> Webhook:
    """The signer of a secret (its base64 decoded once, not per attempt):
    one per principal with its own secret, bounded."""
    return Webhook(secret)


async def _skim(response: httpx.Response) -> None:
    """Read at most ``MAX_RESPONSE_BYTES`` of a receiver's answer: a short
    one is read whole, so its connection is kept for the next notice; a
    longer one is left unread (the connection is closed), never held."""
    read = 0
    async for chunk in response.aiter_raw():
        read += len(chunk)
        if read > MAX_RESPONSE_BYTES:
            return
