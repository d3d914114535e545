"""The SQLite store's file: its tables (``SCHEMA``), its layout version and
the moves that bring an older file up to date (``bring_up_to_date``), and
``transaction``, the one every write of the store and its outbox runs in.

``PRAGMA user_version`` is the layout (``SCHEMA_VERSION`` is today's): 0 is
a file from before principals (or a new, empty one), 1 added principals, 2 a
session's pause, 3 turn records, 4 the webhook outbox and a session's
webhook URL, 5 the outbox's owners by their earliest notice (fair claims), 6
when each idempotency key was written (they are kept for the event-log window),
7 the agent's checkpoint of a pause, in a column apart from the pause (read
only by the turn that answers it), 8 a notice's own headers in the outbox and
A2A tasks' push notification configs (``a2a_push_configs``).
Opening an older file brings it up to date in one transaction; a version-0
file's sessions get those columns and go to ``legacy_principal``, which,
unless anonymous, also prefixes their ids in every table.
"""

from __future__ import annotations

import sqlite3
import time

from turnmesh.runtime.principals import ANONYMOUS
from turnmesh.server.stores.listing import position

SCHEMA_VERSION = 8
# Statements, not a script: executescript would commit the open transaction.
SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    agent_name TEXT NOT NULL,
    created_at REAL NOT NULL,
    last_activity REAL NOT NULL,
    metadata TEXT NOT NULL,
    message_count INTEGER NOT NULL,
    principal TEXT NOT NULL,
    created_ns INTEGER NOT NULL,
    pause BLOB,
    webhook_url TEXT,
    checkpoint BLOB
);
CREATE INDEX IF NOT EXISTS sessions_by_activity ON sessions (last_activity);
CREATE INDEX IF NOT EXISTS sessions_by_principal
    ON sessions (principal, created_ns, session_id);
CREATE TABLE IF NOT EXISTS messages (
    session_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (session_id, position)
);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    written_at REAL NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (session_id, turn_id, seq)
);
CREATE INDEX IF NOT EXISTS events_by_age ON events (written_at);
CREATE TABLE IF NOT EXISTS turn_status (
    session_id TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    status TEXT NOT NULL,
    written_at REAL NOT NULL,
    PRIMARY KEY (session_id, turn_id)
);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    session_id TEXT NOT NULL,
    key TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    written_at REAL NOT NULL,
    PRIMARY KEY (session_id, key)
);
CREATE INDEX IF NOT EXISTS idempotency_keys_by_age ON idempotency_keys (written_at);
CREATE TABLE IF NOT EXISTS turn_records (
    session_id TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    expire_at REAL NOT NULL,
    ended INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (session_id, turn_id)
);
CREATE INDEX IF NOT EXISTS turn_records_by_expiry ON turn_records (expire_at);
CREATE INDEX IF NOT EXISTS turn_records_open ON turn_records (ended, created_at);
CREATE TABLE IF NOT EXISTS webhook_outbox (
    id TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    body BLOB NOT NULL,
    attempts INTEGER NOT NULL,
    due REAL NOT NULL,
    owner TEXT NOT NULL,
    headers TEXT
);
CREATE INDEX IF NOT EXISTS webhook_outbox_by_due ON webhook_outbox (due);
CREATE INDEX IF NOT EXISTS webhook_outbox_by_owner_due ON webhook_outbox (owner, due);
CREATE TABLE IF NOT EXISTS webhook_owners (
    owner TEXT PRIMARY KEY,
    head REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS webhook_owners_by_head ON webhook_owners (head);
CREATE TABLE IF NOT EXISTS a2a_push_configs (
    session_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    config_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    expire_at REAL NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (session_id, task_id, config_id)
);
CREATE INDEX IF NOT EXISTS a2a_push_configs_by_expiry ON a2a_push_configs (expire_at);
"""
# Every table keyed by session id: a version-0 file's ids are renamed in all.
SESSION_TABLES = (
    "sessions",
    "messages",
    "events",
    "turn_status",
    "idempotency_keys",
    "turn_records",
    "a2a_push_configs",
)


def bring_up_to_date(db: sqlite3.Connection, path: str, legacy_principal: str) -> None:
    """Bring the file at ``path`` to ``SCHEMA_VERSION`` in one transaction
    (a new one gets the schema); RuntimeError if it is of a newer layout."""
    with transaction(db):
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise RuntimeError(
                f"the SQLite store {path} has layout {version}, from a newer"
                f" turnmesh (this one knows up to {SCHEMA_VERSION})"
            )
        if version < SCHEMA_VERSION:
            if _has_table(db, "sessions"):
                if version == 0:
                    _migrate_from_0(db, legacy_principal)
                if version < 2:
                    # Layout 2: what a session waits for from the client.
                    db.execute("ALTER TABLE sessions ADD COLUMN pause BLOB")
                if version < 4:
                    # Layout 4: where its turns' ends are notified.
                    db.execute("ALTER TABLE sessions ADD COLUMN webhook_url TEXT")
                if version < 7 and not _has_column(db, "sessions", "checkpoint"):
                    # Layout 7: the agent's checkpoint, apart from its
                    # pause (one written before stays in the pause).
                    db.execute("ALTER TABLE sessions ADD COLUMN checkpoint BLOB")
            if (
                version < 6
                and _has_table(db, "idempotency_keys")
                and not _has_column(db, "idempotency_keys", "written_at")
            ):
                # Layout 6: when each key was written. Those of before
                # count from now: kept one more window, never less.
                db.execute(
                    "ALTER TABLE idempotency_keys ADD COLUMN written_at REAL NOT NULL DEFAULT 0"
                )
                db.execute("UPDATE idempotency_keys SET written_at = ?", (time.time(),))
            if (
                version < 8
                and _has_table(db, "webhook_outbox")
                and not _has_column(db, "webhook_outbox", "headers")
            ):
                # Layout 8: a notice's own headers (an A2A push's).
                db.execute("ALTER TABLE webhook_outbox ADD COLUMN headers TEXT")
            # Layouts 3 to 8: turn records, the webhook outbox and its
            # owners, the keys by age, push configs: the schema's tables
            # and indexes.
            for statement in filter(str.strip, SCHEMA.split(";")):
                db.execute(statement)
            if version == 4:
                # Layout 5: the outbox's owners by their earliest notice
                # (fair claims); its index by owner alone is covered now.
                db.execute("DROP INDEX IF EXISTS webhook_outbox_by_owner")
                db.execute(
                    "INSERT INTO webhook_owners"
                    " SELECT owner, MIN(due) FROM webhook_outbox GROUP BY owner"
                )
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _has_table(db: sqlite3.Connection, name: str) -> bool:
    found = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
    ).fetchone()
    return found is not None


def _has_column(db: sqlite3.Connection, table: str, column: str) -> bool:
    return any(row[1] == column for row in db.execute(f"PRAGMA table_info({table})"))


def _migrate_from_0(db: sqlite3.Connection, legacy_principal: str) -> None:
    """Give a version-0 file's sessions their principal and creation
    nanoseconds (inside the caller's transaction)."""
    # ADD COLUMN ... NOT NULL needs a default; every insert names both.
    db.execute("ALTER TABLE sessions ADD COLUMN principal TEXT NOT NULL DEFAULT ''")
    db.execute("ALTER TABLE sessions ADD COLUMN created_ns INTEGER NOT NULL DEFAULT 0")
    # In Python, so the nanoseconds are exactly those new sessions get.
    rows = db.execute("SELECT session_id, created_at FROM sessions").fetchall()
    db.executemany(
        "UPDATE sessions SET principal = ?, created_ns = ? WHERE session_id = ?",
        [(legacy_principal, position(at, sid)[0], sid) for sid, at in rows],
    )
    if legacy_principal != ANONYMOUS:
        # Version-0 ids never hold "/", so no renamed id can meet an old one.
        # Files from before some tables existed lack them (created after this).
        for table in filter(lambda t: _has_table(db, t), SESSION_TABLES):
            db.execute(
                f"UPDATE {table} SET session_id = ? || '/' || session_id", (legacy_principal,)
            )


class transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._db.execute("ROLLBACK" if exc_type else "COMMIT")
