"""SessionStore on SQLite: one node, sessions survive a restart of the server.

One server per file: the store holds an exclusive lock (flock) on the
database file itself while open, so a second server on the same file, by
any path, symlink or hard link (a lock is the file's, not its name's),
refuses to start (StoreInUse) instead of silently running two owners of
every session; and on ``PATH.lock``, which servers before this one locked.
The descriptors stay open for the store's life: closing a descriptor of the
database would drop SQLite's own (POSIX) locks on it.

WAL mode; every statement runs on one dedicated thread (sqlite3 connections
belong to their thread), so the event loop never blocks on disk. A turn is
one transaction; history rows are appended, never rewritten.

Sessions are keyed by scoped id (``runtime.principals``); each row also keeps
its principal and its creation time in nanoseconds, indexed together, so a
principal's listing is one keyset range scan (``stores.listing``).

Its file's layout and migrations are ``sqlite_schema``'s; its webhook
outbox is ``sqlite_outbox``.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import sqlite3
import time
from collections.abc import Callable
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
from turnmesh.server.stores import sqlite_tasks
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
from turnmesh.server.stores.sqlite_outbox import SqliteOutbox
from turnmesh.server.stores.sqlite_push import SqlitePushConfigs
from turnmesh.server.stores.sqlite_schema import bring_up_to_date, transaction
from turnmesh.v1 import event_pb2, message_pb2

T = TypeVar("T")

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
        self._locks = [_lock_file(f"{path}.lock", path)] if path != ":memory:" else []
        if path != ":memory:":
            try:
                self._locks.append(_lock_file(path, path))
            except BaseException:
                os.close(self._locks[0])
                raise
        self._event_ttl = event_ttl_seconds
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite")
        self._db: sqlite3.Connection | None = None
        try:
            self._executor.submit(self._open).result()
        except BaseException:
            # Not opened (a file of a newer layout, say): leave the file free.
            self._executor.shutdown(wait=True)
            self._unlock()
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
            bring_up_to_date(db, self._path, self._legacy_principal)
            sqlite_tasks.create(db)
        except BaseException:
            db.close()
            raise
        self._db = db

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
            with transaction(db):
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
            with transaction(db):
                deleted = db.execute(
                    "DELETE FROM sessions WHERE session_id = ?", (session_id,)
                ).rowcount
                for table in (
                    "messages",
                    "events",
                    "idempotency_keys",
                    "turn_status",
                    "turn_records",
                    "a2a_push_configs",
                ):
                    db.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))
                sqlite_tasks.delete(db, session_id)
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
            with transaction(db):
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
            with transaction(db):
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
            with transaction(db):
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
            with transaction(db):
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
            with transaction(db):
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

    async def put_task(
        self, session_id: str, task_id: str, record: bytes, created_at: float
    ) -> bool:
        return await self._run(
            lambda db: sqlite_tasks.put(db, session_id, task_id, record, created_at)
        )

    async def get_task(self, session_id: str, task_id: str) -> bytes | None:
        return await self._run(lambda db: sqlite_tasks.get(db, session_id, task_id))

    async def list_tasks(
        self, principal: str, before: Position | None, limit: int
    ) -> Page[tuple[str, bytes]]:
        return await self._run(lambda db: sqlite_tasks.listed(db, principal, before, limit))

    def outbox(self) -> SqliteOutbox:
        return SqliteOutbox(self._run)

    def push_configs(self) -> SqlitePushConfigs:
        return SqlitePushConfigs(self._run)

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
        self._unlock()

    def _unlock(self) -> None:
        """Once SQLite has closed the file (its POSIX locks go with any
        descriptor of it that closes)."""
        for fd in self._locks:
            os.close(fd)
        self._locks = []


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


def _lock_file(path: str, store: str) -> int:
    """An exclusive lock on the file at ``path`` (made if missing: an empty
    file is a new database), held while the returned descriptor is open (the
    kernel drops it if the process dies)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreInUse(
            f"the SQLite store {store} is in use by another server;"
            " SQLite serves one server (use Redis to run several)"
        ) from None
    return fd


def _count_of(db: sqlite3.Connection, principal: str) -> int:
    return int(
        db.execute("SELECT COUNT(*) FROM sessions WHERE principal = ?", (principal,)).fetchone()[0]
    )


def _insert_events(
    db: sqlite3.Connection, session_id: str, turn_id: str, events: list[event_pb2.Event]
) -> None:
    written = time.time()
    db.executemany(
        "INSERT OR REPLACE INTO events VALUES (?, ?, ?, ?, ?)",
        [(session_id, turn_id, e.seq, written, e.SerializeToString()) for e in events],
    )
