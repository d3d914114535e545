"""What session leases need of the PostgreSQL store (``mesh.leases``'s
``LeaseStore``): a session's owner token, swapped only from the one
expected, and each member's lease and its hold on its address.

A lease is a row with an expiry, compared with the database's clock
(``now()``) when written and when read: every server measures a lease by
that one clock, so servers' clocks never meet. Not advisory locks: a
session-level lock belongs to one pooled connection, so it would be lost
when the pool replaces that connection (a restart of the database, a
health check), and outlive a frozen server for as long as its TCP
connection looks alive; a row with an expiry lapses on time whatever
happens to connections.
"""

from __future__ import annotations

from typing import Any

import psycopg
import psycopg_pool

Connection = psycopg.AsyncConnection[tuple[Any, ...]]
Pool = psycopg_pool.AsyncConnectionPool[Connection]

# Schema step 2 (``pg_schema``).
TABLES = """
CREATE TABLE member_leases (
    member_id text COLLATE "C" PRIMARY KEY,
    address text NOT NULL,
    expire_at timestamptz NOT NULL
);
CREATE TABLE address_holds (
    address text COLLATE "C" PRIMARY KEY,
    member_id text NOT NULL,
    expire_at timestamptz NOT NULL
);
"""
EXPIRY = "now() + %s * interval '1 millisecond'"


class PostgresLeases:
    _pool: Pool

    async def owner_of(self, session_id: str) -> str | None:
        """The session's owner token ("" if none); None if there is no session."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT owner FROM sessions WHERE session_id = %s", (session_id,)
            )
            row = await cur.fetchone()
        return None if row is None else str(row[0])

    async def owners_of(self, session_ids: list[str]) -> list[str | None]:
        """``owner_of`` for many sessions in one query (None: none, or no owner)."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT session_id, owner FROM sessions WHERE session_id = ANY(%s)",
                (session_ids,),
            )
            owners = {sid: owner for sid, owner in await cur.fetchall()}
        return [owners.get(sid) or None for sid in session_ids]

    async def swap_owner(self, session_id: str, expected: str, new: str) -> bool | None:
        """Make ``new`` the owner if ``expected`` still is: True if swapped,
        False if the owner changed meanwhile, None if there is no session."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "WITH swapped AS (UPDATE sessions SET owner = %(new)s"
                " WHERE session_id = %(s)s AND owner = %(expected)s RETURNING 1)"
                " SELECT EXISTS (SELECT 1 FROM swapped),"
                " EXISTS (SELECT 1 FROM sessions WHERE session_id = %(s)s)",
                {"s": session_id, "expected": expected, "new": new},
            )
            row = await cur.fetchone()
        assert row is not None
        swapped, exists = row
        return True if swapped else (False if exists else None)

    async def hold_member(self, member_id: str, address: str, ttl_ms: int) -> None:
        """Start or renew a member's lease (and its hold on its address)."""
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(
                f"INSERT INTO member_leases VALUES (%s, %s, {EXPIRY}) ON CONFLICT (member_id)"
                " DO UPDATE SET address = excluded.address, expire_at = excluded.expire_at",
                (member_id, address, ttl_ms),
            )
            await conn.execute(
                f"INSERT INTO address_holds VALUES (%s, %s, {EXPIRY}) ON CONFLICT (address)"
                " DO UPDATE SET member_id = excluded.member_id, expire_at = excluded.expire_at",
                (address, member_id, ttl_ms),
            )

    async def take_address(self, member_id: str, address: str, ttl_ms: int) -> str | None:
        """Hold ``address`` for this member; the member that held it before,
        if its hold had not lapsed (that process is gone: we bound its port)."""
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT member_id FROM address_holds WHERE address = %s AND expire_at > now()"
                " FOR UPDATE",
                (address,),
            )
            previous = await cur.fetchone()
            await conn.execute(
                f"INSERT INTO address_holds VALUES (%s, %s, {EXPIRY}) ON CONFLICT (address)"
                " DO UPDATE SET member_id = excluded.member_id, expire_at = excluded.expire_at",
                (address, member_id, ttl_ms),
            )
        return str(previous[0]) if previous else None

    async def member_lease(self, member_id: str) -> tuple[str, float] | None:
        """The member's address and the seconds its lease has left; None
        once it lapsed."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT address, extract(epoch FROM expire_at - now())::float8"
                " FROM member_leases WHERE member_id = %s AND expire_at > now()",
                (member_id,),
            )
            row = await cur.fetchone()
        return None if row is None else (str(row[0]), float(row[1]))

    async def drop_member(self, member_id: str) -> None:
        """End a member's lease now (it is leaving): its sessions can be taken."""
        async with self._pool.connection() as conn:
            await conn.execute("DELETE FROM member_leases WHERE member_id = %s", (member_id,))
