"""The PostgreSQL store's A2A push notification configs (table
``a2a_push_configs``, ``pg_schema``; the contract is ``push_configs``).
A put runs in one transaction with its session's row share-locked, so a
delete of the session waits for it and takes its configs along."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import psycopg_pool

from turnmesh.server.stores.pg_client import unavailable_when_down
from turnmesh.server.stores.push_configs import PUSH_TASKS_PER_SESSION, session_gone

Connection = psycopg.AsyncConnection[tuple[Any, ...]]
Pool = psycopg_pool.AsyncConnectionPool[Connection]


@unavailable_when_down
class PostgresPushConfigs:
    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def put(
        self,
        session_id: str,
        task_id: str,
        config_id: str,
        config: bytes,
        *,
        limit: int,
        ttl_seconds: float,
    ) -> bool:
        at = time.time()
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT 1 FROM sessions WHERE session_id = %s FOR SHARE", (session_id,)
            )
            if await cur.fetchone() is None:
                raise session_gone(session_id)
            await conn.execute(
                "DELETE FROM a2a_push_configs WHERE session_id = %s AND expire_at < %s",
                (session_id, at),
            )
            cur = await conn.execute(
                "SELECT count(*) FROM a2a_push_configs"
                " WHERE session_id = %s AND task_id = %s AND config_id <> %s",
                (session_id, task_id, config_id),
            )
            row = await cur.fetchone()
            if row is not None and row[0] >= limit:
                return False
            await conn.execute(
                "INSERT INTO a2a_push_configs VALUES (%s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (session_id, task_id, config_id) DO UPDATE"
                " SET data = excluded.data, created_at = excluded.created_at,"
                " expire_at = excluded.expire_at",
                (session_id, task_id, config_id, at, at + ttl_seconds, config),
            )
            # The session's most recently configured tasks stay.
            await conn.execute(
                "DELETE FROM a2a_push_configs WHERE session_id = %(s)s AND task_id IN"
                " (SELECT task_id FROM a2a_push_configs WHERE session_id = %(s)s"
                " GROUP BY task_id ORDER BY max(created_at) DESC, task_id DESC OFFSET %(n)s)",
                {"s": session_id, "n": PUSH_TASKS_PER_SESSION},
            )
        return True

    async def of_task(self, session_id: str, task_id: str) -> list[bytes]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT data FROM a2a_push_configs WHERE session_id = %s AND task_id = %s"
                " AND expire_at >= %s ORDER BY config_id",
                (session_id, task_id, time.time()),
            )
            rows = await cur.fetchall()
        return [bytes(row[0]) for row in rows]

    async def delete(self, session_id: str, task_id: str, config_id: str) -> bool:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "DELETE FROM a2a_push_configs"
                " WHERE session_id = %s AND task_id = %s AND config_id = %s AND expire_at >= %s",
                (session_id, task_id, config_id, time.time()),
            )
            return cur.rowcount > 0
