"""A2A task records in the SQLite store: one table, made when the store is
opened if missing (a table of its own: no layout move), each principal's
records indexed in listing order (creation nanoseconds, task id). Each
function runs on the store's one connection thread (``SqliteStore._run``)."""

from __future__ import annotations

import sqlite3

from turnmesh.runtime.principals import principal_of
from turnmesh.server.stores.base import TASK_RECORDS_PER_PRINCIPAL, TASK_RECORDS_PER_SESSION
from turnmesh.server.stores.listing import Page, Position
from turnmesh.server.stores.sqlite_schema import transaction

TABLE = """
CREATE TABLE IF NOT EXISTS a2a_tasks (
    session_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    principal TEXT NOT NULL,
    created_ns INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (session_id, task_id)
)"""
INDEX = (
    "CREATE INDEX IF NOT EXISTS a2a_tasks_by_principal"
    " ON a2a_tasks (principal, created_ns, task_id)"
)


def create(db: sqlite3.Connection) -> None:
    with transaction(db):
        db.execute(TABLE)
        db.execute(INDEX)


def put(
    db: sqlite3.Connection,
    session_id: str,
    task_id: str,
    record: bytes,
    created_at: float,
) -> bool:
    principal = principal_of(session_id)
    with transaction(db):
        if (
            db.execute("SELECT 1 FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
            is None
        ):
            return False
        db.execute(
            "INSERT INTO a2a_tasks VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT DO UPDATE SET data = excluded.data",
            (session_id, task_id, principal, int(created_at * 1e9), record),
        )
        db.execute(
            "DELETE FROM a2a_tasks WHERE session_id = ? AND task_id IN"
            " (SELECT task_id FROM a2a_tasks WHERE session_id = ?"
            " ORDER BY created_ns DESC, task_id DESC LIMIT -1 OFFSET ?)",
            (session_id, session_id, TASK_RECORDS_PER_SESSION),
        )
        db.execute(
            "DELETE FROM a2a_tasks WHERE rowid IN (SELECT rowid FROM a2a_tasks"
            " WHERE principal = ? ORDER BY created_ns DESC, task_id DESC LIMIT -1 OFFSET ?)",
            (principal, TASK_RECORDS_PER_PRINCIPAL),
        )
    return True


def get(db: sqlite3.Connection, session_id: str, task_id: str) -> bytes | None:
    row = db.execute(
        "SELECT data FROM a2a_tasks WHERE session_id = ? AND task_id = ?", (session_id, task_id)
    ).fetchone()
    return bytes(row[0]) if row else None


def delete(db: sqlite3.Connection, session_id: str) -> None:
    """In the session's delete transaction."""
    db.execute("DELETE FROM a2a_tasks WHERE session_id = ?", (session_id,))


def listed(
    db: sqlite3.Connection, principal: str, before: Position | None, limit: int
) -> Page[tuple[str, bytes]]:
    if limit < 1:
        return Page([], None)
    if before is None:
        rows = db.execute(
            "SELECT created_ns, task_id, session_id, data FROM a2a_tasks WHERE principal = ?"
            " ORDER BY created_ns DESC, task_id DESC LIMIT ?",
            (principal, limit + 1),
        ).fetchall()
    else:
        rows = db.execute(
            "SELECT created_ns, task_id, session_id, data FROM a2a_tasks WHERE principal = ?"
            " AND (created_ns, task_id) < (?, ?)"
            " ORDER BY created_ns DESC, task_id DESC LIMIT ?",
            (principal, before[0], before[1], limit + 1),
        ).fetchall()
    items = [((int(n), str(t)), (str(s), bytes(d))) for n, t, s, d in rows[:limit]]
    return Page(items, items[-1][0] if len(rows) > limit else None)
