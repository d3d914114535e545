"""A2A task records in the PostgreSQL store (table ``a2a_tasks``,
``pg_schema``), each principal's indexed in listing order (creation
nanoseconds, task id). Each function runs on the caller's connection, in
its transaction."""

from __future__ import annotations

from typing import Any

import psycopg

from turnmesh.runtime.principals import principal_of
from turnmesh.server.stores.base import TASK_RECORDS_PER_PRINCIPAL, TASK_RECORDS_PER_SESSION
from turnmesh.server.stores.listing import Page, Position

Connection = psycopg.AsyncConnection[tuple[Any, ...]]


async def put(
    conn: Connection, session_id: str, task_id: str, record: bytes, created_at: float
) -> None:
    """Inside the caller's transaction, its session row held."""
    principal = principal_of(session_id)
    await conn.execute(
        "INSERT INTO a2a_tasks VALUES (%s, %s, %s, %s, %s)"
        " ON CONFLICT (session_id, task_id) DO UPDATE SET data = excluded.data",
        (session_id, task_id, principal, int(created_at * 1e9), record),
    )
    await conn.execute(
        "DELETE FROM a2a_tasks WHERE session_id = %(s)s AND task_id IN"
        " (SELECT task_id FROM a2a_tasks WHERE session_id = %(s)s"
        " ORDER BY created_ns DESC, task_id DESC OFFSET %(n)s)",
        {"s": session_id, "n": TASK_RECORDS_PER_SESSION},
    )
    await conn.execute(
        "DELETE FROM a2a_tasks WHERE (session_id, task_id) IN"
        " (SELECT session_id, task_id FROM a2a_tasks WHERE principal = %s"
        " ORDER BY created_ns DESC, task_id DESC OFFSET %s)",
        (principal, TASK_RECORDS_PER_PRINCIPAL),
    )


async def get(conn: Connection, session_id: str, task_id: str) -> bytes | None:
    cur = await conn.execute(
        "SELECT data FROM a2a_tasks WHERE session_id = %s AND task_id = %s", (session_id, task_id)
    )
    row = await cur.fetchone()
    return bytes(row[0]) if row else None


async def listed(
    conn: Connection, principal: str, before: Position | None, limit: int
) -> Page[tuple[str, bytes]]:
    if limit < 1:
        return Page([], None)
    where = "principal = %s"
    args: list[str | int] = [principal]
    if before is not None:
        where += " AND (created_ns, task_id) < (%s, %s)"
        args += [before[0], before[1]]
    cur = await conn.execute(
        f"SELECT created_ns, task_id, session_id, data FROM a2a_tasks WHERE {where}"
        " ORDER BY created_ns DESC, task_id DESC LIMIT %s",
        (*args, limit + 1),
    )
    rows = await cur.fetchall()
    items = [((int(n), str(t)), (str(s), bytes(d))) for n, t, s, d in rows[:limit]]
    return Page(items, items[-1][0] if len(rows) > limit else None)
