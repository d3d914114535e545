"""The PostgreSQL store's webhook outbox: notices in the store's database
(tables ``webhook_outbox`` and ``webhook_owners``, ``pg_schema``).
``webhook_owners`` keeps each owner's earliest due time (its head), so a
claim reads owners in that order and a few notices of each.

Every write takes one transaction-scoped advisory lock (``OUTBOX_LOCK``):
writes of the outbox serialize, as SQLite's do, so the bounds hold and a
notice is never claimed twice within its lease, without row locks spread
over two tables. They are a few short statements each, per notice.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

import psycopg
import psycopg_pool

from turnmesh.server.stores.pg_client import unavailable_when_down
from turnmesh.server.webhooks.outbox import Delivery, capped_owners

# "tm" "outbox" in ASCII.
OUTBOX_LOCK = 0x746D_6F75_7462_6F78
Connection = psycopg.AsyncConnection[tuple[Any, ...]]
Pool = psycopg_pool.AsyncConnectionPool[Connection]


@unavailable_when_down
class PostgresOutbox:
    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def add(self, delivery: Delivery, limit: int, owner_limit: int | None = None) -> bool:
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (OUTBOX_LOCK,))
            cur = await conn.execute("SELECT 1 FROM webhook_outbox WHERE id = %s", (delivery.id,))
            if await cur.fetchone() is not None:
                return True  # kept already, as it is
            # Kept by a trigger (schema step 5): a row per owner, not a scan.
            cur = await conn.execute(
                "SELECT coalesce(sum(waiting), 0),"
                " coalesce(sum(waiting) FILTER (WHERE owner = %s), 0) FROM webhook_counts",
                (delivery.owner,),
            )
            row = await cur.fetchone()
            waiting, of_owner = row if row else (0, 0)
            if waiting >= limit or (owner_limit is not None and of_owner >= owner_limit):
                return False
            await conn.execute(
                "INSERT INTO webhook_outbox (id, url, body, attempts, due, owner, headers)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s)",
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
            await conn.execute(
                "INSERT INTO webhook_owners VALUES (%s, %s) ON CONFLICT (owner)"
                " DO UPDATE SET head = LEAST(webhook_owners.head, excluded.head)",
                (delivery.owner, delivery.due),
            )
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
        until = now + lease_seconds
        out: list[Delivery] = []
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (OUTBOX_LOCK,))
            # Each owner due and below its cap has a notice for us: these suffice.
            cur = await conn.execute(
                "SELECT owner FROM webhook_owners WHERE head <= %s ORDER BY head, owner LIMIT %s",
                (now, limit + capped),
            )
            for (owner,) in await cur.fetchall():
                room = limit - len(out)
                if per_owner is not None:
                    room = min(room, per_owner - busy.get(owner, 0))
                if room <= 0:
                    continue
                cur = await conn.execute(
                    "WITH picked AS (SELECT id, due FROM webhook_outbox"
                    " WHERE owner = %(owner)s AND due <= %(now)s ORDER BY due, id LIMIT %(room)s),"
                    " held AS (UPDATE webhook_outbox o SET due = %(until)s FROM picked"
                    " WHERE o.id = picked.id"
                    " RETURNING o.id, o.url, o.body, o.attempts, o.headers, picked.due AS was)"
                    " SELECT id, url, body, attempts, headers FROM held ORDER BY was, id",
                    {"until": until, "owner": owner, "now": now, "room": room},
                )
                rows = await cur.fetchall()
                await _head_of(conn, owner)
                out += [
                    Delivery(
                        row[0],
                        row[1],
                        bytes(row[2]),
                        row[3],
                        until,
                        owner,
                        json.loads(row[4]) if row[4] else {},
                    )
                    for row in rows
                ]
        return out

    async def settle(self, delivery: Delivery, retry_at: float | None) -> None:
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (OUTBOX_LOCK,))
            if retry_at is None:
                cur = await conn.execute(
                    "DELETE FROM webhook_outbox WHERE id = %s RETURNING owner", (delivery.id,)
                )
            else:
                cur = await conn.execute(
                    "UPDATE webhook_outbox SET attempts = %s, due = %s WHERE id = %s"
                    " RETURNING owner",
                    (delivery.attempts, retry_at, delivery.id),
                )
            row = await cur.fetchone()
            if row is not None:
                await _head_of(conn, row[0])

    async def next_due(self, skip: Collection[str] = ()) -> float | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT owner, head FROM webhook_owners ORDER BY head, owner LIMIT %s",
                (len(skip) + 1,),
            )
            rows = await cur.fetchall()
        return next((float(head) for owner, head in rows if owner not in skip), None)


async def _head_of(conn: Connection, owner: str) -> None:
    """The owner's head again, after its notices changed (inside the
    caller's transaction)."""
    cur = await conn.execute("SELECT min(due) FROM webhook_outbox WHERE owner = %s", (owner,))
    row = await cur.fetchone()
    if row is None or row[0] is None:
        await conn.execute("DELETE FROM webhook_owners WHERE owner = %s", (owner,))
    else:
        await conn.execute("UPDATE webhook_owners SET head = %s WHERE owner = %s", (row[0], owner))
