"""The SQLite store's webhook outbox: notices in the store's file (tables
``webhook_outbox`` and ``webhook_owners``, ``sqlite_schema``), run on the
store's thread, in its transactions.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Protocol, TypeVar

from turnmesh.server.stores.sqlite_schema import transaction
from turnmesh.server.webhooks.outbox import Delivery, capped_owners

T = TypeVar("T")


class Run(Protocol):
    """``SqliteStore._run``: runs a function on the store's connection, on its
    thread. The outbox is given this, not the store, so it needs no import of it."""

    def __call__(self, fn: Callable[[sqlite3.Connection], T]) -> Awaitable[T]: ...


class SqliteOutbox:
    """Webhook notices in the store's file: they outlive a restart.
    ``webhook_owners`` keeps each owner's earliest due time (its head), so a
    claim reads owners in that order and a few notices of each."""

    def __init__(self, run: Run) -> None:
        self._run = run

    async def add(self, delivery: Delivery, limit: int, owner_limit: int | None = None) -> bool:
        def add(db: sqlite3.Connection) -> bool:
            with transaction(db):
                kept = "SELECT 1 FROM webhook_outbox WHERE id = ?"
                if db.execute(kept, (delivery.id,)).fetchone() is not None:
                    return True  # kept already, as it is
                waiting = db.execute("SELECT COUNT(*) FROM webhook_outbox").fetchone()[0]
                if waiting >= limit:
                    return False
                if owner_limit is not None:
                    of_owner = db.execute(
                        "SELECT COUNT(*) FROM webhook_outbox WHERE owner = ?", (delivery.owner,)
                    ).fetchone()[0]
                    if of_owner >= owner_limit:
                        return False
                db.execute(
                    "INSERT INTO webhook_outbox (id, url, body, attempts, due, owner, headers)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        delivery.id,
                        delivery.url,
                        delivery.body,
                        delivery.attempts,
                        delivery.due,
                        delivery.owner,
                        json.dumps(delivery.headers) if delivery.headers else None,
                    ),
                )
                db.execute(
                    "INSERT INTO webhook_owners VALUES (?, ?)"
                    " ON CONFLICT DO UPDATE SET head = MIN(head, excluded.head)",
                    (delivery.owner, delivery.due),
                )
            return True

        return await self._run(add)

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

        def claim(db: sqlite3.Connection) -> list[Delivery]:
            out: list[Delivery] = []
            with transaction(db):
                # Each owner due and below its cap has a notice for us: these suffice.
                owners = db.execute(
                    "SELECT owner FROM webhook_owners WHERE head <= ? ORDER BY head LIMIT ?",
                    (now, limit + capped),
                ).fetchall()
                for (owner,) in owners:
                    room = limit - len(out)
                    if per_owner is not None:
                        room = min(room, per_owner - busy.get(owner, 0))
                    if room <= 0:
                        continue
                    rows = db.execute(
                        "SELECT id, url, body, attempts, headers FROM webhook_outbox"
                        " WHERE owner = ? AND due <= ? ORDER BY due LIMIT ?",
                        (owner, now, room),
                    ).fetchall()
                    db.executemany(
                        "UPDATE webhook_outbox SET due = ? WHERE id = ?",
                        [(now + lease_seconds, row[0]) for row in rows],
                    )
                    _head_of(db, owner)
                    out += [
                        Delivery(
                            row[0],
                            row[1],
                            bytes(row[2]),
                            row[3],
                            now + lease_seconds,
                            owner,
                            json.loads(row[4]) if row[4] else {},
                        )
                        for row in rows
                    ]
            return out

        return await self._run(claim)

    async def settle(self, delivery: Delivery, retry_at: float | None) -> None:
        def settle(db: sqlite3.Connection) -> None:
            with transaction(db):
                row = db.execute(
                    "SELECT owner FROM webhook_outbox WHERE id = ?", (delivery.id,)
                ).fetchone()
                if row is None:
                    return
                if retry_at is None:
                    db.execute("DELETE FROM webhook_outbox WHERE id = ?", (delivery.id,))
                else:
                    db.execute(
                        "UPDATE webhook_outbox SET attempts = ?, due = ? WHERE id = ?",
                        (delivery.attempts, retry_at, delivery.id),
                    )
                _head_of(db, row[0])

        await self._run(settle)

    async def next_due(self, skip: Collection[str] = ()) -> float | None:
        rows = await self._run(
            lambda db: db.execute(
                "SELECT owner, head FROM webhook_owners ORDER BY head LIMIT ?", (len(skip) + 1,)
            ).fetchall()
        )
        return next((float(head) for owner, head in rows if owner not in skip), None)


def _head_of(db: sqlite3.Connection, owner: str) -> None:
    """The owner's head again, after its notices changed (inside the
    caller's transaction)."""
    head = db.execute("SELECT MIN(due) FROM webhook_outbox WHERE owner = ?", (owner,)).fetchone()[0]
    if head is None:
        db.execute("DELETE FROM webhook_owners WHERE owner = ?", (owner,))
    else:
        db.execute("UPDATE webhook_owners SET head = ? WHERE owner = ?", (head, owner))
