"""SessionStore on SQLite: one node, sessions survive a restart of the server.

One server per file: the store holds an exclusive lock on ``PATH.lock`` while
open, so a second server on the same file refuses to start (StoreInUse)
instead of silently running two owners of every session.

WAL mode; every statement runs on one dedicated thread (sqlite3 connections
belong to their thread), so the event loop never blocks on disk. A turn is
one transaction; history rows are appended, never rewritten.

Sessions are keyed by scoped id (``runtime.principals``); each row also keeps
its principal and its creation time in nanoseconds, indexed together, so a
principal's listing is one keyset range scan (``server.listing``).

``PRAGMA user_version`` is the layout (``SCHEMA_VERSION`` is today's): 0 is
a file from before principals (or a new, empty one), 1 added principals, 2 a
session's pause, 3 turn records, 4 the webhook outbox and a session's
webhook URL, 5 the outbox's owners by their earliest notice (fair claims), 6
when each idempotency key was written (they are kept for the event-log window),
7 the agent's checkpoint of a pause, in a column apart from the pause (read
only by the turn that answers it).
Opening an older file brings it up to date in one transaction; a version-0
file's sessions get those columns and go to ``legacy_principal``, which,
unless anonymous, also prefixes their ids in every table.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import sqlite3
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from turnmesh.runtime.errors import AlreadyExists, NotFound
from turnmesh.runtime.principals import (
    ANONYMOUS,
    PRINCIPAL_PATTERN,
    principal_of,
    public_id,
    scoped,
)
from turnmesh.server.stores.base import (
    IDEMPOTENCY_KEYS_PER_SESSION,
    TURN_RECORDS_PER_SESSION,
    SessionRecord,
    StoreInUse,
    TurnAbandoned,
    TurnCommits,
    session_quota_exceeded,
)
from turnmesh.server.stores.listing import Page, Position, position
from turnmesh.server.webhooks.outbox import Delivery, capped_owners
from turnmesh.v1 import event_pb2, message_pb2

T = TypeVar("T")

SCHEMA_VERSION = 7
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
    owner TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS webhook_outbox_by_due ON webhook_outbox (due);
CREATE INDEX IF NOT EXISTS webhook_outbox_by_owner_due ON webhook_outbox (owner, due);
CREATE TABLE IF NOT EXISTS webhook_owners (
    owner TEXT PRIMARY KEY,
    head REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS webhook_owners_by_head ON webhook_owners (head);
"""
# Every table keyed by session id: a version-0 file's ids are renamed in all.
SESSION_TABLES = (
    "sessions",
    "messages",
    "events",
    "turn_status",
    "idempotency_keys",
    "turn_records",
)
SESSION_COLUMNS = "session_id, agent_name, created_at, last_activity, metadata, message_count"
# What a record is read from (a pause is written by a create that seeds one,
# and by commits).
READ_COLUMNS = f"{SESSION_COLUMNS}, pause, webhook_url"


class SqliteStore(TurnCommits):
    def __init__(
        self, path: str, event_ttl_seconds: float, legacy_principal: str = ANONYMOUS
    ) -> None:
        if not path:
            raise ValueError("sqlite store needs a path: sqlite:PATH")
        if not PRINCIPAL_PATTERN.fullmatch(legacy_principal):
            raise ValueError(f"not a principal name: {legacy_principal!r}")
        self._legacy_principal = legacy_principal
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        # An in-memory database is this process's alone: nothing to lock.
        self._lock = _lock_file(f"{path}.lock") if path != ":memory:" else None
        self._event_ttl = event_ttl_seconds
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite")
        self._db: sqlite3.Connection | None = None
        try:
            self._executor.submit(self._open).result()
        except BaseException:
            # Not opened (a file of a newer layout, say): leave the file free.
            self._executor.shutdown(wait=True)
            if self._lock is not None:
                os.close(self._lock)
            raise

    @property
    def shared(self) -> bool:
        return False

    async def open(self) -> None:
        return None

    def _open(self) -> None:
        db = sqlite3.connect(self._path, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            self._bring_up_to_date(db)
        except BaseException:
            db.close()
            raise
        self._db = db

    def _bring_up_to_date(self, db: sqlite3.Connection) -> None:
        with _transaction(db):
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise RuntimeError(
                    f"the SQLite store {self._path} has layout {version}, from a newer"
                    f" turnmesh (this one knows up to {SCHEMA_VERSION})"
                )
            if version < SCHEMA_VERSION:
                if _has_table(db, "sessions"):
                    if version == 0:
                        _migrate_from_0(db, self._legacy_principal)
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
                # Layouts 3 to 6: turn records, the webhook outbox and its
                # owners, the keys by age: tables and indexes of the schema's.
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

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            assert self._db is not None
            return fn(self._db)

        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    # Sessions ---------------------------------------------------------------

    async def create(
        self,
        record: SessionRecord,
        messages: list[message_pb2.Message] | None = None,
        quota: int | None = None,
    ) -> None:
        initial = list(messages or [])
        principal = principal_of(record.session_id)

        def create(db: sqlite3.Connection) -> None:
            with _transaction(db):
                if quota is not None and _count_of(db, principal) >= quota:
                    raise session_quota_exceeded(quota)
                try:
                    db.execute(
                        f"INSERT INTO sessions ({READ_COLUMNS}, principal, created_ns)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            record.session_id,
                            record.agent_name,
                            record.created_at,
                            record.last_activity,
                            json.dumps(record.metadata),
                            len(initial),
                            record.pause or None,
                            record.webhook_url or None,
                            principal,
                            position(record.created_at, record.session_id)[0],
                        ),
                    )
                except sqlite3.IntegrityError as exc:
                    raise AlreadyExists(
                        f"session {public_id(record.session_id)!r} already exists"
                    ) from exc
                db.executemany(
                    "INSERT INTO messages VALUES (?, ?, ?)",
                    [(record.session_id, i, m.SerializeToString()) for i, m in enumerate(initial)],
                )

        await self._run(create)
        record.message_count = len(initial)

    async def get(self, session_id: str) -> SessionRecord | None:
        row = await self._run(
            lambda db: db.execute(
                f"SELECT {READ_COLUMNS} FROM sessions WHERE session_id = ?", (session_id,)
            ).fetchone()
        )
        return None if row is None else _record(row)

    async def delete(self, session_id: str) -> bool:
        def delete(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                deleted = db.execute(
                    "DELETE FROM sessions WHERE session_id = ?", (session_id,)
                ).rowcount
                for table in (
                    "messages",
                    "events",
                    "idempotency_keys",
                    "turn_status",
                    "turn_records",
                ):
                    db.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))
            return deleted > 0

        return await self._run(delete)

    async def history(self, session_id: str, start: int = 0) -> list[message_pb2.Message]:
        def history(db: sqlite3.Connection) -> list[bytes] | None:
            if (
                db.execute("SELECT 1 FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
                is None
            ):
                return None
            rows = db.execute(
                "SELECT data FROM messages WHERE session_id = ? AND position >= ?"
                " ORDER BY position",
                (session_id, start),
            ).fetchall()
            return [r[0] for r in rows]

        rows = await self._run(history)
        if rows is None:
            raise NotFound(f"session {public_id(session_id)!r} not found")
        return [message_pb2.Message.FromString(r) for r in rows]

    async def _commit(
        self,
        session_id: str,
        messages: list[message_pb2.Message],
        final_event: event_pb2.Event | None,
        now: float,
        fence: str = "",
        pause: bytes | None = None,
        checkpoint: bytes | None = None,
    ) -> None:
        # One server per file (the lock): no other owner to fence against.
        def commit(db: sqlite3.Connection) -> bool | None:
            with _transaction(db):
                row = db.execute(
                    "SELECT message_count FROM sessions WHERE session_id = ?", (session_id,)
                ).fetchone()
                if row is None:
                    return False
                if final_event is not None:
                    claimed = db.execute(
                        "INSERT INTO turn_status VALUES (?, ?, 'committed', ?) "
                        "ON CONFLICT DO UPDATE SET status = 'committed' "
                        "WHERE status != 'abandoned' RETURNING status",
                        (session_id, final_event.run_id, time.time()),
                    ).fetchone()
                    if claimed is None:
                        return None  # abandoned: write nothing
                start = row[0]
                db.executemany(
                    "INSERT INTO messages VALUES (?, ?, ?)",
                    [
                        (session_id, start + i, m.SerializeToString())
                        for i, m in enumerate(messages)
                    ],
                )
                db.execute(
                    "UPDATE sessions SET message_count = ?, last_activity = ? WHERE session_id = ?",
                    (start + len(messages), now, session_id),
                )
                if pause is not None:
                    db.execute(
                        "UPDATE sessions SET pause = ? WHERE session_id = ?",
                        (pause or None, session_id),
                    )
                if checkpoint is not None:
                    db.execute(
                        "UPDATE sessions SET checkpoint = ? WHERE session_id = ?",
                        (checkpoint or None, session_id),
                    )
                if final_event is not None:
                    _insert_events(db, session_id, final_event.run_id, [final_event])
            return True

        committed = await self._run(commit)
        if committed is None:
            raise TurnAbandoned(final_event.run_id if final_event else "")
        if not committed:
            raise NotFound(f"session {public_id(session_id)!r} not found")

    async def checkpoint(self, session_id: str) -> bytes:
        row = await self._run(
            lambda db: db.execute(
                "SELECT checkpoint FROM sessions WHERE session_id = ?", (session_id,)
            ).fetchone()
        )
        return bytes(row[0]) if row and row[0] else b""

    async def abandon_turn(self, session_id: str, turn_id: str) -> bool:
        def abandon(db: sqlite3.Connection) -> bool:
            with _transaction(db):
                row = db.execute(
                    "INSERT INTO turn_status VALUES (?, ?, 'abandoned', ?) "
                    "ON CONFLICT DO UPDATE SET status = status RETURNING status",
                    (session_id, turn_id, time.time()),
                ).fetchone()
            return bool(row[0] == "abandoned")

        return await self._run(abandon)

    async def touch(self, session_id: str, now: float) -> None:
        await self._run(
            lambda db: db.execute(
                "UPDATE sessions SET last_activity = ? WHERE session_id = ?", (now, session_id)
            )
        )

    async def idle_sessions(self, last_activity_before: float) -> list[str]:
        def idle(db: sqlite3.Connection) -> list[str]:
            # Events are pruned on the same schedule as idle sessions.
            db.execute("DELETE FROM events WHERE written_at < ?", (time.time() - self._event_ttl,))
            db.execute(
                "DELETE FROM turn_status WHERE written_at < ?", (time.time() - self._event_ttl,)
            )
            db.execute(
                "DELETE FROM idempotency_keys WHERE written_at < ?",
                (time.time() - self._event_ttl,),
            )
            db.execute("DELETE FROM turn_records WHERE expire_at < ?", (time.time(),))
            rows = db.execute(
                "SELECT session_id FROM sessions WHERE last_activity < ?", (last_activity_before,)
            ).fetchall()
            return [r[0] for r in rows]

        return await self._run(idle)

    async def count(self) -> int:
        return int(
            await self._run(lambda db: db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0])
        )

    async def list_sessions(
        self, principal: str, before: Position | None, limit: int
    ) -> Page[SessionRecord]:
        # A principal's ids share its prefix, so ordering by the scoped id
        # orders by the public id, as positions do.
        where = "principal = ?"
        args: list[str | int] = [principal]
        if before is not None:
            where += " AND (created_ns, session_id) < (?, ?)"
            args += [before[0], scoped(principal, before[1])]
        limit = max(limit, 0)
        rows = await self._run(
            lambda db: db.execute(
                f"SELECT {READ_COLUMNS}, created_ns FROM sessions WHERE {where}"
                " ORDER BY created_ns DESC, session_id DESC LIMIT ?",
                (*args, limit + 1),  # one more: are there others below the page?
            ).fetchall()
        )
        items = [((row[8], public_id(row[0])), _record(row)) for row in rows[:limit]]
        return Page(items, items[-1][0] if len(rows) > limit and items else None)

    async def count_of(self, principal: str) -> int:
        return await self._run(lambda db: _count_of(db, principal))

    # Events and keys ----------------------------------------------------------

    @property
    def persists_events(self) -> bool:
        return True

    async def append_events(
        self, session_id: str, turn_id: str, events: list[event_pb2.Event]
    ) -> None:
        def append(db: sqlite3.Connection) -> None:
            with _transaction(db):
                _insert_events(db, session_id, turn_id, events)

        await self._run(append)

    async def read_events(self, session_id: str, turn_id: str) -> list[event_pb2.Event] | None:
        rows = await self._run(
            lambda db: db.execute(
                "SELECT data FROM events WHERE session_id = ? AND turn_id = ? ORDER BY seq",
                (session_id, turn_id),
            ).fetchall()
        )
        if not rows:
            return None
        return [event_pb2.Event.FromString(r[0]) for r in rows]

    async def get_key(self, session_id: str, key: str) -> str | None:
        row = await self._run(
            lambda db: db.execute(
                "SELECT turn_id FROM idempotency_keys WHERE session_id = ? AND key = ?"
                " AND written_at >= ?",
                (session_id, key, time.time() - self._event_ttl),
            ).fetchone()
        )
        return row[0] if row else None

    async def set_key(self, session_id: str, key: str, turn_id: str) -> None:
        def set_key(db: sqlite3.Connection) -> None:
            at = time.time()
            with _transaction(db):
                db.execute(
                    "INSERT OR REPLACE INTO idempotency_keys VALUES (?, ?, ?, ?)",
                    (session_id, key, turn_id, at),
                )
                # The session's past the window, then past the bound (the
                # primary key's index reads the session's; at most one over).
                db.execute(
                    "DELETE FROM idempotency_keys WHERE session_id = ? AND written_at < ?",
                    (session_id, at - self._event_ttl),
                )
                db.execute(
                    "DELETE FROM idempotency_keys WHERE session_id = ? AND key IN"
                    " (SELECT key FROM idempotency_keys WHERE session_id = ?"
                    " ORDER BY written_at DESC, rowid DESC LIMIT -1 OFFSET ?)",
                    (session_id, session_id, IDEMPOTENCY_KEYS_PER_SESSION),
                )

        await self._run(set_key)

    async def put_turn(
        self, session_id: str, turn_id: str, record: bytes, *, ended: bool, ttl_seconds: float
    ) -> bool:
        def put(db: sqlite3.Connection) -> bool:
            at = time.time()
            with _transaction(db):
                if (
                    db.execute(
                        "SELECT 1 FROM sessions WHERE session_id = ?", (session_id,)
                    ).fetchone()
                    is None
                ):
                    return False
                written = db.execute(
                    "INSERT INTO turn_records VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO UPDATE"
                    " SET data = excluded.data, ended = excluded.ended,"
                    " expire_at = excluded.expire_at WHERE ended = 0",
                    (session_id, turn_id, at, at + ttl_seconds, int(ended), record),
                ).rowcount
                db.execute(
                    "DELETE FROM turn_records WHERE session_id = ? AND turn_id IN"
                    " (SELECT turn_id FROM turn_records WHERE session_id = ?"
                    " ORDER BY created_at DESC, turn_id DESC LIMIT -1 OFFSET ?)",
                    (session_id, session_id, TURN_RECORDS_PER_SESSION),
                )
            return written > 0

        return await self._run(put)

    async def get_turn(self, session_id: str, turn_id: str) -> bytes | None:
        row = await self._run(
            lambda db: db.execute(
                "SELECT data FROM turn_records WHERE session_id = ? AND turn_id = ?"
                " AND expire_at >= ?",
                (session_id, turn_id, time.time()),
            ).fetchone()
        )
        return bytes(row[0]) if row else None

    def outbox(self) -> SqliteOutbox:
        return SqliteOutbox(self)

    async def open_turns(
        self, limit: int, cursor: int = 0
    ) -> tuple[list[tuple[str, str]], int | None]:
        rows = await self._run(
            lambda db: db.execute(
                "SELECT session_id, turn_id FROM turn_records WHERE ended = 0 AND expire_at >= ?"
                " ORDER BY created_at, session_id, turn_id LIMIT ? OFFSET ?",
                (time.time(), limit + 1, cursor),
            ).fetchall()
        )
        more = len(rows) > limit
        return [(row[0], row[1]) for row in rows[:limit]], cursor + limit if more else None

    async def close(self) -> None:
        def close(db: sqlite3.Connection) -> None:
            db.close()

        await self._run(close)
        self._executor.shutdown(wait=True)
        if self._lock is not None:
            os.close(self._lock)


def _record(row: tuple[Any, ...]) -> SessionRecord:
    return SessionRecord(
        row[0],
        row[1],
        row[2],
        row[3],
        json.loads(row[4]),
        row[5],
        pause=row[6] or b"",
        webhook_url=row[7] or "",
    )


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


def _lock_file(path: str) -> int:
    """An exclusive lock on ``path``, held while the returned descriptor is
    open (the kernel drops it if the process dies)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreInUse(
            f"the SQLite store {path.removesuffix('.lock')} is in use by another server;"
            " SQLite serves one server (use Redis to run several)"
        ) from None
    return fd


def _count_of(db: sqlite3.Connection, principal: str) -> int:
    return int(
        db.execute("SELECT COUNT(*) FROM sessions WHERE principal = ?", (principal,)).fetchone()[0]
    )


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._db.execute("ROLLBACK" if exc_type else "COMMIT")


def _insert_events(
    db: sqlite3.Connection, session_id: str, turn_id: str, events: list[event_pb2.Event]
) -> None:
    written = time.time()
    db.executemany(
        "INSERT OR REPLACE INTO events VALUES (?, ?, ?, ?, ?)",
        [(session_id, turn_id, e.seq, written, e.SerializeToString()) for e in events],
    )


class SqliteOutbox:
    """Webhook notices in the store's file: they outlive a restart.
    ``webhook_owners`` keeps each owner's earliest due time (its head), so a
    claim reads owners in that order and a few notices of each."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store

    async def add(self, delivery: Delivery, limit: int, owner_limit: int | None = None) -> bool:
        def add(db: sqlite3.Connection) -> bool:
            with _transaction(db):
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
                    "INSERT INTO webhook_outbox VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        delivery.id,
                        delivery.url,
                        delivery.body,
                        delivery.attempts,
                        delivery.due,
                        delivery.owner,
                    ),
                )
                db.execute(
                    "INSERT INTO webhook_owners VALUES (?, ?)"
                    " ON CONFLICT DO UPDATE SET head = MIN(head, excluded.head)",
                    (delivery.owner, delivery.due),
                )
            return True

        return await self._store._run(add)

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
            with _transaction(db):
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
                        "SELECT id, url, body, attempts FROM webhook_outbox"
                        " WHERE owner = ? AND due <= ? ORDER BY due LIMIT ?",
                        (owner, now, room),
                    ).fetchall()
                    db.executemany(
                        "UPDATE webhook_outbox SET due = ? WHERE id = ?",
                        [(now + lease_seconds, row[0]) for row in rows],
                    )
                    _head_of(db, owner)
                    out += [
                        Delivery(row[0], row[1], bytes(row[2]), row[3], now + lease_seconds, owner)
                        for row in rows
                    ]
            return out

        return await self._store._run(claim)

    async def settle(self, delivery: Delivery, retry_at: float | None) -> None:
        def settle(db: sqlite3.Connection) -> None:
            with _transaction(db):
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

        await self._store._run(settle)

    async def next_due(self, skip: Collection[str] = ()) -> float | None:
        rows = await self._store._run(
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
