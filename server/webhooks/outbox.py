"""Where webhook notices wait: the ``Outbox`` contract every store's outbox
keeps, the notice it holds (``notice``, ``Delivery``), and the memory store's
``MemoryOutbox``.

Delivery is at least once and never in a turn's way: a notice is written to
an outbox (the session store's where it has one, so it survives a restart)
and delivered from it in the background (``sender``). A notice keeps
its id across attempts (the idempotency key receivers drop repeats by). The
outbox is bounded: past its limit a new notice is dropped (counted), never
the turn.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import time
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from turnmesh.runtime.ids import new_id

__all__ = [
    "MAX_NOTICE_BYTES",
    "Delivery",
    "MemoryOutbox",
    "Outbox",
    "OutboxUnavailable",
    "capped_owners",
    "notice",
]

# A notice's body, at most: a turn's is cut to fit (``turn_records.bounded``),
# so the outbox holds at most its count of these.
MAX_NOTICE_BYTES = 64 * 1024
# The memory store's outbox holds at most this many bytes of bodies.
MAX_MEMORY_OUTBOX_BYTES = 64 * 2**20


def notice(
    kind: str,
    data: Mapping[str, Any],
    notice_id: str = "",
    truncated: bool = False,
    principal: str = "",
) -> tuple[str, bytes]:
    """A notice's id (a new one unless given) and body: ``{"type",
    "timestamp", "principal", "data"}`` (kind: ``turn.finished``,
    ``turn.failed``...; ``principal``: whose turn it tells of, when known,
    in the body so the signature covers it), and ``"truncated": true`` when
    ``data`` was cut to fit."""
    notice_id = notice_id or f"msg_{new_id()}"
    body: dict[str, Any] = {
        "type": kind,
        "timestamp": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }
    if principal:
        body["principal"] = principal
    body["data"] = dict(data)
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
    # Headers of its own, sent beside the signature's (an A2A push's token
    # and Authorization: secrets, so never in its repr).
    headers: dict[str, str] = field(default_factory=dict, repr=False)


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
