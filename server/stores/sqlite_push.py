"""The SQLite store's A2A push notification configs (table
``a2a_push_configs``, ``sqlite_schema``), run on the store's thread, in its
transactions (the contract is ``push_configs``)."""

from __future__ import annotations

import sqlite3
import time

from turnmesh.server.stores.push_configs import PUSH_TASKS_PER_SESSION, session_gone
from turnmesh.server.stores.sqlite_outbox import Run
from turnmesh.server.stores.sqlite_schema import transaction


class SqlitePushConfigs:
    def __init__(self, run: Run) -> None:
        self._run = run

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
        def put(db: sqlite3.Connection) -> bool | None:
            at = time.time()
            with transaction(db):
                if (
                    db.execute(
                        "SELECT 1 FROM sessions WHERE session_id = ?", (session_id,)
                    ).fetchone()
                    is None
                ):
                    return None
                db.execute(
                    "DELETE FROM a2a_push_configs WHERE session_id = ? AND expire_at < ?",
                    (session_id, at),
                )
                others = db.execute(
                    "SELECT COUNT(*) FROM a2a_push_configs"
                    " WHERE session_id = ? AND task_id = ? AND config_id != ?",
                    (session_id, task_id, config_id),
                ).fetchone()[0]
                if others >= limit:
                    return False
                db.execute(
                    "INSERT INTO a2a_push_configs VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO UPDATE"
                    " SET data = excluded.data, created_at = excluded.created_at,"
                    " expire_at = excluded.expire_at",
                    (session_id, task_id, config_id, at, at + ttl_seconds, config),
                )
                # The session's most recently configured tasks stay.
                db.execute(
                    "DELETE FROM a2a_push_configs WHERE session_id = ? AND task_id IN"
                    " (SELECT task_id FROM a2a_push_configs WHERE session_id = ?"
                    " GROUP BY task_id ORDER BY MAX(created_at) DESC, task_id DESC"
                    " LIMIT -1 OFFSET ?)",
                    (session_id, session_id, PUSH_TASKS_PER_SESSION),
                )
            return True

        written = await self._run(put)
        if written is None:
            raise session_gone(session_id)
        return written

    async def of_task(self, session_id: str, task_id: str) -> list[bytes]:
        rows = await self._run(
            lambda db: db.execute(
                "SELECT data FROM a2a_push_configs WHERE session_id = ? AND task_id = ?"
                " AND expire_at >= ? ORDER BY config_id",
                (session_id, task_id, time.time()),
            ).fetchall()
        )
        return [bytes(row[0]) for row in rows]

    async def delete(self, session_id: str, task_id: str, config_id: str) -> bool:
        def delete(db: sqlite3.Connection) -> bool:
            with transaction(db):
                gone: int = db.execute(
                    "DELETE FROM a2a_push_configs"
                    " WHERE session_id = ? AND task_id = ? AND config_id = ? AND expire_at >= ?",
                    (session_id, task_id, config_id, time.time()),
                ).rowcount
            return gone > 0

        return await self._run(delete)
