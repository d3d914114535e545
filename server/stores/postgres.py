"""SessionStore on PostgreSQL (``postgresql://USER@HOST/DB``): sessions in
the database teams already back up, replicate and query.

Its schema and migrations are ``pg_schema``'s (applied by ``open``), its
pool and error mapping ``pg_client``'s, its webhook outbox ``pg_outbox``,
its A2A records ``pg_tasks``, push configs ``pg_push`` and what leases
need of it ``pg_leases``.

Shared by every server of a mesh: a session's owner is the server whose
lease token its row carries (``pg_leases``: member leases and owner swaps
on the database's clock, as ``server.mesh.leases`` needs), and a commit is
fenced by it, so a server that lost a session can never commit a turn to it.

Every write is one transaction. A commit locks its session's row (FOR
UPDATE): a commit and a delete of the session serialize, so a late commit
never brings a deleted session back; a turn's status row decides between
its commit and ``abandon_turn`` (whichever inserts it first wins). Times
are this server's clock (``time.time()``), as the other stores' are.
"""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg

from turnmesh.runtime.errors import AlreadyExists, NotFound
from turnmesh.runtime.principals import (
    ANONYMOUS,
    PRINCIPAL_PATTERN,
    principal_of,
    public_id,
    scoped,
)
from turnmesh.server.stores import pg_schema, pg_tasks
from turnmesh.server.stores.base import (
    IDEMPOTENCY_KEYS_PER_SESSION,
    TURN_RECORDS_PER_SESSION,
    SessionRecord,
    TurnAbandoned,
    TurnCommits,
    session_quota_exceeded,
)
from turnmesh.server.stores.listing import Page, Position, position
from turnmesh.server.stores.pg_client import (
    pool,
    settings,
    unavailable_when_down,
)
from turnmesh.server.stores.pg_leases import PostgresLeases
from turnmesh.server.stores.pg_outbox import PostgresOutbox
from turnmesh.server.stores.pg_push import PostgresPushConfigs
from turnmesh.v1 import event_pb2, message_pb2

# Transaction-scoped locks on a principal (two-key form: its own key space):
# creates racing at a quota count one at a time.
PRINCIPAL_LOCKS = 0x746D

# Rows one statement of the expiry pass deletes at most.
PRUNE_BATCH = 5_000
READ_COLUMNS = (
    "session_id, agent_name, created_at, last_activity, metadata, message_count,"
    " pause, webhook_url, owner"
)
# Every table keyed by session but the session's own row, emptied (one
# statement: the CTEs all run). Run after the row is deleted, in a later
# statement of the same transaction: READ COMMITTED gives it a snapshot taken
# once every writer holding the row (a commit's FOR UPDATE, a record's FOR
# SHARE) has finished, so nothing such a writer added is left behind.
DELETE_CHILDREN = """
WITH m AS (DELETE FROM messages WHERE session_id = %(s)s),
     c AS (DELETE FROM checkpoints WHERE session_id = %(s)s),
     e AS (DELETE FROM events WHERE session_id = %(s)s),
     k AS (DELETE FROM idempotency_keys WHERE session_id = %(s)s),
     st AS (DELETE FROM turn_status WHERE session_id = %(s)s),
     r AS (DELETE FROM turn_records WHERE session_id = %(s)s),
     p AS (DELETE FROM a2a_push_configs WHERE session_id = %(s)s)
DELETE FROM a2a_tasks WHERE session_id = %(s)s
"""
Connection = psycopg.AsyncConnection[tuple[Any, ...]]


@unavailable_when_down
class PostgresStore(TurnCommits, PostgresLeases):
    def __init__(
        self, url: str, event_ttl_seconds: float, legacy_principal: str = ANONYMOUS
    ) -> None:
        # No sessions from before principals can be here: nothing to give it.
        if not PRINCIPAL_PATTERN.fullmatch(legacy_principal):
            raise ValueError(f"not a principal name: {legacy_principal!r}")
        self._url = url
        self._settings = settings(url)
        self._pool = pool(self._settings)
        self._event_ttl = event_ttl_seconds

    @property
    def shared(self) -> bool:
        return True

    async def open(self) -> None:
        """Connect and apply pending migrations (once, under a lock, whichever
        server starts first)."""
        await self._pool.open(wait=True, timeout=self._settings.checkout_seconds)
        async with self._pool.connection() as conn:
            await pg_schema.migrate(conn)

    # Sessions ---------------------------------------------------------------

    async def create(
        self,
        record: SessionRecord,
        messages: list[message_pb2.Message] | None = None,
        quota: int | None = None,
    ) -> None:
        initial = list(messages or [])
        principal = principal_of(record.session_id)
        async with self._pool.connection() as conn, conn.transaction():
            if quota is not None:
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (PRINCIPAL_LOCKS, principal)
                )
                if await _count_of(conn, principal) >= quota:
                    raise session_quota_exceeded(quota)
            cur = await conn.execute(
                f"INSERT INTO sessions ({READ_COLUMNS}, principal, created_ns)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (session_id) DO NOTHING",
                (
                    record.session_id,
                    record.agent_name,
                    record.created_at,
                    record.last_activity,
                    json.dumps(record.metadata),
                    len(initial),
                    record.pause or None,
                    record.webhook_url or None,
                    record.owner,
                    principal,
                    position(record.created_at, record.session_id)[0],
                ),
            )
            if cur.rowcount == 0:
                raise AlreadyExists(f"session {public_id(record.session_id)!r} already exists")
            if initial:
                await _insert_messages(conn, record.session_id, 0, initial)
        record.message_count = len(initial)

    async def get(self, session_id: str) -> SessionRecord | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {READ_COLUMNS} FROM sessions WHERE session_id = %s", (session_id,)
            )
            row = await cur.fetchone()
        return None if row is None else _record(row)

    async def delete(self, session_id: str) -> bool:
        async with self._pool.connection() as conn, conn.transaction():
            # The row first: this waits for any writer holding it; the rest
            # then sees what those writers committed (DELETE_CHILDREN).
            cur = await conn.execute(
                "DELETE FROM sessions WHERE session_id = %(s)s RETURNING 1", {"s": session_id}
            )
            gone = await cur.fetchone() is not None
            await conn.execute(DELETE_CHILDREN, {"s": session_id})
            return gone

    async def history(self, session_id: str, start: int = 0) -> list[message_pb2.Message]:
        async with self._pool.connection() as conn:
            # One statement, one snapshot: the session and its messages agree.
            cur = await conn.execute(
                "SELECT EXISTS (SELECT 1 FROM sessions WHERE session_id = %(s)s),"
                " ARRAY(SELECT data FROM messages WHERE session_id = %(s)s"
                " AND position >= %(start)s ORDER BY position)",
                {"s": session_id, "start": start},
            )
            row = await cur.fetchone()
        if row is None or not row[0]:
            raise NotFound(f"session {public_id(session_id)!r} not found")
        return [message_pb2.Message.FromString(data) for data in row[1]]

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
        committed = await self._commit_in_transaction(
            session_id, messages, final_event, now, fence, pause, checkpoint
        )
        if committed is None:
            raise TurnAbandoned(final_event.run_id if final_event else "")
        if not committed:
            raise NotFound(f"session {public_id(session_id)!r} not found")

    async def _commit_in_transaction(
        self,
        session_id: str,
        messages: list[message_pb2.Message],
        final_event: event_pb2.Event | None,
        now: float,
        fence: str,
        pause: bytes | None,
        checkpoint: bytes | None,
    ) -> bool | None:
        """True: committed; False: no session; None: void (nothing written).

        Three round trips, pipelined: BEGIN with the session's row locked;
        every write at once (the turn's status among them: a turn abandoned
        meanwhile is rare, so its writes are rolled back rather than waited
        for); COMMIT."""
        try:
            async with (
                self._pool.connection() as conn,
                conn.pipeline() as pipeline,
                conn.transaction(),
            ):
                cur = await conn.execute(
                    "SELECT message_count, owner FROM sessions WHERE session_id = %s FOR UPDATE",
                    (session_id,),
                )
                row = await cur.fetchone()  # sends BEGIN and this together
                if row is None:
                    return False
                start, owner = row
                if fence and owner != fence:
                    return None
                claimed = None
                if final_event is not None:
                    claimed = await conn.execute(
                        "INSERT INTO turn_status VALUES (%s, %s, 'committed', %s)"
                        " ON CONFLICT (session_id, turn_id) DO UPDATE SET status = 'committed'"
                        " WHERE turn_status.status <> 'abandoned' RETURNING status",
                        (session_id, final_event.run_id, time.time()),
                    )
                if messages:
                    await _insert_messages(conn, session_id, start, messages)
                await conn.execute(
                    "UPDATE sessions SET message_count = %s, last_activity = %s,"
                    " pause = CASE WHEN %s THEN %s ELSE pause END WHERE session_id = %s",
                    (start + len(messages), now, pause is not None, pause or None, session_id),
                )
                if checkpoint:
                    await conn.execute(
                        "INSERT INTO checkpoints VALUES (%s, %s)"
                        " ON CONFLICT (session_id) DO UPDATE SET data = excluded.data",
                        (session_id, checkpoint),
                    )
                elif checkpoint is not None:
                    await conn.execute(
                        "DELETE FROM checkpoints WHERE session_id = %s", (session_id,)
                    )
                if final_event is not None:
                    await _insert_events(conn, session_id, final_event.run_id, [final_event])
                await pipeline.sync()
                if claimed is not None and await claimed.fetchone() is None:
                    raise _Abandoned  # rolls every write back
        except _Abandoned:
            return None
        return True

    async def checkpoint(self, session_id: str) -> bytes:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT data FROM checkpoints WHERE session_id = %s", (session_id,)
            )
            row = await cur.fetchone()
        return bytes(row[0]) if row else b""

    async def abandon_turn(self, session_id: str, turn_id: str) -> bool:
        async with self._pool.connection() as conn:
            # A commit in flight holds the row: this waits for it, then sees it.
            cur = await conn.execute(
                "INSERT INTO turn_status VALUES (%s, %s, 'abandoned', %s)"
                " ON CONFLICT (session_id, turn_id) DO UPDATE SET status = turn_status.status"
                " RETURNING status",
                (session_id, turn_id, time.time()),
            )
            row = await cur.fetchone()
        return row is not None and row[0] == "abandoned"

    async def touch(self, session_id: str, now: float) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(
                "UPDATE sessions SET last_activity = %s WHERE session_id = %s", (now, session_id)
            )

    async def idle_sessions(self, last_activity_before: float) -> list[str]:
        at = time.time()
        async with self._pool.connection() as conn:
            # What outlived its window is pruned on the same schedule, in
            # bounded batches: a backlog never runs into the statement timeout.
            for table, column, before in (
                ("events", "written_at", at - self._event_ttl),
                ("turn_status", "written_at", at - self._event_ttl),
                ("idempotency_keys", "written_at", at - self._event_ttl),
                ("turn_records", "expire_at", at),
                ("a2a_push_configs", "expire_at", at),
            ):
                while True:
                    cur = await conn.execute(
                        f"DELETE FROM {table} WHERE ctid IN (SELECT ctid FROM {table}"
                        f" WHERE {column} < %s LIMIT %s)",
                        (before, PRUNE_BATCH),
                    )
                    if cur.rowcount < PRUNE_BATCH:
                        break
            cur = await conn.execute(
                "SELECT session_id FROM sessions WHERE last_activity < %s",
                (last_activity_before,),
            )
            return [row[0] for row in await cur.fetchall()]

    async def count(self) -> int:
        async with self._pool.connection() as conn:
            # Kept by a trigger (schema steps 3 and 5): not a scan of every session.
            cur = await conn.execute("SELECT coalesce(sum(sessions), 0) FROM session_counts")
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def list_sessions(
        self, principal: str, before: Position | None, limit: int
    ) -> Page[SessionRecord]:
        # A principal's ids share its prefix, so ordering by the scoped id
        # (bytewise: COLLATE "C") orders by the public id, as positions do.
        where = "principal = %s"
        args: list[str | int] = [principal]
        if before is not None:
            where += " AND (created_ns, session_id) < (%s, %s)"
            args += [before[0], scoped(principal, before[1])]
        limit = max(limit, 0)
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {READ_COLUMNS}, created_ns FROM sessions WHERE {where}"
                " ORDER BY created_ns DESC, session_id DESC LIMIT %s",
                (*args, limit + 1),  # one more: are there others below the page?
            )
            rows = await cur.fetchall()
        items = [((int(row[9]), public_id(row[0])), _record(row)) for row in rows[:limit]]
        return Page(items, items[-1][0] if len(rows) > limit and items else None)

    async def count_of(self, principal: str) -> int:
        async with self._pool.connection() as conn:
            return await _count_of(conn, principal)

    # Events and keys ----------------------------------------------------------

    @property
    def persists_events(self) -> bool:
        return True

    async def append_events(
        self, session_id: str, turn_id: str, events: list[event_pb2.Event]
    ) -> None:
        async with self._pool.connection() as conn, conn.transaction():
            await _insert_events(conn, session_id, turn_id, events)

    async def read_events(self, session_id: str, turn_id: str) -> list[event_pb2.Event] | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT data FROM events WHERE session_id = %s AND turn_id = %s ORDER BY seq",
                (session_id, turn_id),
            )
            rows = await cur.fetchall()
        if not rows:
            return None
        return [event_pb2.Event.FromString(row[0]) for row in rows]

    async def get_key(self, session_id: str, key: str) -> str | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT turn_id FROM idempotency_keys WHERE session_id = %s AND key = %s"
                " AND written_at >= %s",
                (session_id, key, time.time() - self._event_ttl),
            )
            row = await cur.fetchone()
        return str(row[0]) if row else None

    async def set_key(self, session_id: str, key: str, turn_id: str) -> None:
        at = time.time()
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO idempotency_keys (session_id, key, turn_id, written_at)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (session_id, key) DO UPDATE"
                " SET turn_id = excluded.turn_id, written_at = excluded.written_at,"
                " seq = excluded.seq",
                (session_id, key, turn_id, at),
            )
            # The session's past the window, then past the bound (newest kept).
            await conn.execute(
                "DELETE FROM idempotency_keys WHERE session_id = %s AND written_at < %s",
                (session_id, at - self._event_ttl),
            )
            await conn.execute(
                "DELETE FROM idempotency_keys WHERE session_id = %(s)s AND key IN"
                " (SELECT key FROM idempotency_keys WHERE session_id = %(s)s"
                " ORDER BY written_at DESC, seq DESC OFFSET %(n)s)",
                {"s": session_id, "n": IDEMPOTENCY_KEYS_PER_SESSION},
            )

    async def put_turn(
        self, session_id: str, turn_id: str, record: bytes, *, ended: bool, ttl_seconds: float
    ) -> bool:
        at = time.time()
        async with self._pool.connection() as conn, conn.transaction():
            # FOR SHARE: a delete of the session waits for this write, then
            # takes the record with it.
            if not await _session_held(conn, session_id):
                return False
            cur = await conn.execute(
                "INSERT INTO turn_records VALUES (%s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (session_id, turn_id) DO UPDATE SET data = excluded.data,"
                " ended = excluded.ended, expire_at = excluded.expire_at"
                " WHERE NOT turn_records.ended",
                (session_id, turn_id, at, at + ttl_seconds, ended, record),
            )
            written = cur.rowcount > 0
            await conn.execute(
                "DELETE FROM turn_records WHERE session_id = %(s)s AND turn_id IN"
                " (SELECT turn_id FROM turn_records WHERE session_id = %(s)s"
                " ORDER BY created_at DESC, turn_id DESC OFFSET %(n)s)",
                {"s": session_id, "n": TURN_RECORDS_PER_SESSION},
            )
        return written

    async def get_turn(self, session_id: str, turn_id: str) -> bytes | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT data FROM turn_records WHERE session_id = %s AND turn_id = %s"
                " AND expire_at >= %s",
                (session_id, turn_id, time.time()),
            )
            row = await cur.fetchone()
        return bytes(row[0]) if row else None

    async def open_turns(
        self, limit: int, cursor: int = 0
    ) -> tuple[list[tuple[str, str]], int | None]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT session_id, turn_id FROM turn_records WHERE NOT ended"
                " AND expire_at >= %s ORDER BY created_at, session_id, turn_id"
                " LIMIT %s OFFSET %s",
                (time.time(), limit + 1, cursor),
            )
            rows = await cur.fetchall()
        more = len(rows) > limit
        return [(row[0], row[1]) for row in rows[:limit]], cursor + limit if more else None

    # A2A task records, the webhook outbox, push configs -----------------------

    async def put_task(
        self, session_id: str, task_id: str, record: bytes, created_at: float
    ) -> bool:
        async with self._pool.connection() as conn, conn.transaction():
            if not await _session_held(conn, session_id):
                return False
            await pg_tasks.put(conn, session_id, task_id, record, created_at)
        return True

    async def get_task(self, session_id: str, task_id: str) -> bytes | None:
        async with self._pool.connection() as conn:
            return await pg_tasks.get(conn, session_id, task_id)

    async def list_tasks(
        self, principal: str, before: Position | None, limit: int
    ) -> Page[tuple[str, bytes]]:
        async with self._pool.connection() as conn:
            return await pg_tasks.listed(conn, principal, before, limit)

    def outbox(self) -> PostgresOutbox:
        return PostgresOutbox(self._pool)

    def push_configs(self) -> PostgresPushConfigs:
        return PostgresPushConfigs(self._pool)

    async def close(self) -> None:
        await self._pool.close()


class _Abandoned(Exception):
    """Raised inside a commit's transaction to roll it back."""


def _record(row: tuple[Any, ...]) -> SessionRecord:
    return SessionRecord(
        row[0],
        row[1],
        row[2],
        row[3],
        json.loads(row[4]),
        row[5],
        pause=bytes(row[6]) if row[6] else b"",
        webhook_url=row[7] or "",
        owner=row[8],
    )


async def _count_of(conn: Connection, principal: str) -> int:
    cur = await conn.execute(
        "SELECT coalesce(sum(sessions), 0) FROM session_counts WHERE principal = %s",
        (principal,),
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def _session_held(conn: Connection, session_id: str) -> bool:
    """Whether the session exists, its row share-locked to the transaction."""
    cur = await conn.execute(
        "SELECT 1 FROM sessions WHERE session_id = %s FOR SHARE", (session_id,)
    )
    return await cur.fetchone() is not None


async def _insert_messages(
    conn: Connection, session_id: str, start: int, messages: list[message_pb2.Message]
) -> None:
    async with conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO messages VALUES (%s, %s, %s)",
            [(session_id, start + i, m.SerializeToString()) for i, m in enumerate(messages)],
        )


async def _insert_events(
    conn: Connection, session_id: str, turn_id: str, events: list[event_pb2.Event]
) -> None:
    written = time.time()
    async with conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO events VALUES (%s, %s, %s, %s, %s) ON CONFLICT"
            " (session_id, turn_id, seq) DO UPDATE SET written_at = excluded.written_at,"
            " data = excluded.data",
            [(session_id, turn_id, e.seq, written, e.SerializeToString()) for e in events],
        )
