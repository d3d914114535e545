"""The PostgreSQL store's schema: versioned steps (``STEPS``), applied in
order, each once, recorded in ``turnmesh_schema`` (version, name, when).

``migrate`` applies the pending steps in one transaction under a
transaction-scoped advisory lock (``pg_advisory_xact_lock``): servers that
start together queue on it, the first applies, the others find nothing
pending. A step that fails rolls the whole migration back. ``pending``
only reads (``turnmesh store migrate --check``).

Ids are ``COLLATE "C"`` (bytewise), so listings order ties exactly as the
other stores do, whatever the database's locale. Floats are Unix seconds as
the store contract passes them (``double precision`` round-trips them);
``created_ns`` the listing position (``stores.listing``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from psycopg import AsyncConnection, errors, sql

from turnmesh.server.stores import pg_leases

# The advisory lock migrations take: a constant of this store's own
# ("tm" "schema" in ASCII), apart from the server lock (``postgres``).
MIGRATION_LOCK = 0x746D_7363_6865_6D61

# (version, name, statements): a step is never edited once released; a
# change is a new step.
# Sessions counted as they are made and deleted, by a trigger in the same
# transaction: `--max-sessions` is checked on every create, and count(*) over
# the table grows with it. The trigger comes first: it locks the table, so no
# session is made between the backfill and the count taking over.
SESSION_COUNTS = """
CREATE TABLE session_counts (
    principal text COLLATE "C" PRIMARY KEY,
    sessions bigint NOT NULL
);
CREATE FUNCTION turnmesh_count_sessions() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO session_counts (principal, sessions) VALUES (NEW.principal, 1)
        ON CONFLICT (principal) DO UPDATE SET sessions = session_counts.sessions + 1;
    ELSE
        UPDATE session_counts SET sessions = sessions - 1 WHERE principal = OLD.principal;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER sessions_counted AFTER INSERT OR DELETE ON sessions
    FOR EACH ROW EXECUTE FUNCTION turnmesh_count_sessions();
INSERT INTO session_counts (principal, sessions)
    SELECT principal, count(*) FROM sessions GROUP BY principal;
"""

# Step 3's count rows, one per principal, were one row for every create and
# delete of a keyless mesh (all of it the anonymous principal's): each held
# its row's lock to its commit, so creates queued on it. Each principal's
# count is now SESSION_COUNT_SHARDS rows (the session id's hash picks one),
# recounted from the sessions under a lock that keeps creates and deletes
# out meanwhile. The outbox's size, read on every add under the outbox
# lock, was a count(*) over it (a backlog made each add slower as it grew):
# now rows per owner kept by a trigger, counted from the outbox once here.
SESSION_COUNT_SHARDS = 16
COUNTS_SHARDED = f"""
LOCK TABLE session_counts IN ACCESS EXCLUSIVE MODE;
LOCK TABLE sessions IN SHARE ROW EXCLUSIVE MODE;
LOCK TABLE webhook_outbox IN SHARE ROW EXCLUSIVE MODE;
DROP TABLE session_counts;
CREATE TABLE session_counts (
    principal text COLLATE "C" NOT NULL,
    shard smallint NOT NULL,
    sessions bigint NOT NULL,
    PRIMARY KEY (principal, shard)
);
CREATE OR REPLACE FUNCTION turnmesh_count_sessions() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO session_counts (principal, shard, sessions)
        VALUES (NEW.principal, hashtext(NEW.session_id) & {SESSION_COUNT_SHARDS - 1}, 1)
        ON CONFLICT (principal, shard) DO UPDATE SET sessions = session_counts.sessions + 1;
    ELSE
        UPDATE session_counts SET sessions = sessions - 1
        WHERE principal = OLD.principal
            AND shard = hashtext(OLD.session_id) & {SESSION_COUNT_SHARDS - 1};
    END IF;
    RETURN NULL;
END $$;
INSERT INTO session_counts (principal, shard, sessions)
    SELECT principal, hashtext(session_id) & {SESSION_COUNT_SHARDS - 1}, count(*)
    FROM sessions GROUP BY 1, 2;
CREATE TABLE webhook_counts (
    owner text COLLATE "C" PRIMARY KEY,
    waiting bigint NOT NULL
);
CREATE FUNCTION turnmesh_count_webhooks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO webhook_counts (owner, waiting) VALUES (NEW.owner, 1)
        ON CONFLICT (owner) DO UPDATE SET waiting = webhook_counts.waiting + 1;
    ELSE
        UPDATE webhook_counts SET waiting = waiting - 1 WHERE owner = OLD.owner;
        DELETE FROM webhook_counts WHERE owner = OLD.owner AND waiting = 0;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER webhooks_counted AFTER INSERT OR DELETE ON webhook_outbox
    FOR EACH ROW EXECUTE FUNCTION turnmesh_count_webhooks();
INSERT INTO webhook_counts (owner, waiting)
    SELECT owner, count(*) FROM webhook_outbox GROUP BY owner;
"""

STEPS: list[tuple[int, str, str]] = [
    (
        1,
        "sessions, histories, events, keys, turn records, outbox, tasks",
        """
CREATE TABLE sessions (
    session_id text COLLATE "C" PRIMARY KEY,
    agent_name text NOT NULL,
    created_at double precision NOT NULL,
    last_activity double precision NOT NULL,
    metadata text NOT NULL,
    message_count integer NOT NULL,
    principal text COLLATE "C" NOT NULL,
    created_ns bigint NOT NULL,
    owner text NOT NULL DEFAULT '',
    pause bytea,
    webhook_url text
);
-- Idle expiry scans by activity; a principal's listing is one keyset range.
CREATE INDEX sessions_by_activity ON sessions (last_activity);
CREATE INDEX sessions_by_principal ON sessions (principal, created_ns, session_id);
-- Apart from the record (up to 16 MiB, read only by the turn that answers
-- the pause): every read of the record stays small.
CREATE TABLE checkpoints (
    session_id text COLLATE "C" PRIMARY KEY,
    data bytea NOT NULL
);
CREATE TABLE messages (
    session_id text COLLATE "C" NOT NULL,
    position integer NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (session_id, position)
);
CREATE TABLE events (
    session_id text COLLATE "C" NOT NULL,
    turn_id text COLLATE "C" NOT NULL,
    seq bigint NOT NULL,
    written_at double precision NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (session_id, turn_id, seq)
);
CREATE INDEX events_by_age ON events (written_at);
-- A turn's fate: 'committed' or 'abandoned', whichever came first.
CREATE TABLE turn_status (
    session_id text COLLATE "C" NOT NULL,
    turn_id text COLLATE "C" NOT NULL,
    status text NOT NULL,
    written_at double precision NOT NULL,
    PRIMARY KEY (session_id, turn_id)
);
CREATE INDEX turn_status_by_age ON turn_status (written_at);
-- seq orders keys written in the same instant (a rewrite takes a new one).
CREATE SEQUENCE idempotency_key_seq;
CREATE TABLE idempotency_keys (
    session_id text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    turn_id text NOT NULL,
    written_at double precision NOT NULL,
    seq bigint NOT NULL DEFAULT nextval('idempotency_key_seq'),
    PRIMARY KEY (session_id, key)
);
CREATE INDEX idempotency_keys_by_age ON idempotency_keys (written_at);
CREATE TABLE turn_records (
    session_id text COLLATE "C" NOT NULL,
    turn_id text COLLATE "C" NOT NULL,
    created_at double precision NOT NULL,
    expire_at double precision NOT NULL,
    ended boolean NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (session_id, turn_id)
);
CREATE INDEX turn_records_by_expiry ON turn_records (expire_at);
-- Open turns, oldest first (settled after a server is lost): few rows.
CREATE INDEX turn_records_open ON turn_records (created_at, session_id, turn_id)
    WHERE NOT ended;
CREATE TABLE webhook_outbox (
    id text COLLATE "C" PRIMARY KEY,
    url text NOT NULL,
    body bytea NOT NULL,
    attempts integer NOT NULL,
    due double precision NOT NULL,
    owner text COLLATE "C" NOT NULL,
    headers text
);
CREATE INDEX webhook_outbox_by_owner_due ON webhook_outbox (owner, due);
-- Each owner's earliest due notice: claims read owners in that order (fair).
CREATE TABLE webhook_owners (
    owner text COLLATE "C" PRIMARY KEY,
    head double precision NOT NULL
);
CREATE INDEX webhook_owners_by_head ON webhook_owners (head);
CREATE TABLE a2a_push_configs (
    session_id text COLLATE "C" NOT NULL,
    task_id text COLLATE "C" NOT NULL,
    config_id text COLLATE "C" NOT NULL,
    created_at double precision NOT NULL,
    expire_at double precision NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (session_id, task_id, config_id)
);
CREATE TABLE a2a_tasks (
    session_id text COLLATE "C" NOT NULL,
    task_id text COLLATE "C" NOT NULL,
    principal text COLLATE "C" NOT NULL,
    created_ns bigint NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (session_id, task_id)
);
CREATE INDEX a2a_tasks_by_principal ON a2a_tasks (principal, created_ns, task_id);
""",
    ),
    (2, "member leases and address holds", pg_leases.TABLES),
    (3, "session counts per principal", SESSION_COUNTS),
    # The expiry pass deletes push configs past their time: not a scan.
    (
        4,
        "push configs by expiry",
        "CREATE INDEX a2a_push_configs_by_expiry ON a2a_push_configs (expire_at);",
    ),
    (5, "session counts sharded, outbox counted", COUNTS_SHARDED),
]
LATEST = STEPS[-1][0]
LOCK_TIMEOUT = "2s"
MIGRATION_ATTEMPTS = 10
TABLE = "turnmesh_schema"


async def applied(conn: AsyncConnection[Any]) -> int:
    """The newest version applied (0: none, a new database)."""
    cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (TABLE,))
    row = await cur.fetchone()
    if row is None or not row[0]:
        return 0
    cur = await conn.execute(sql.SQL("SELECT max(version) FROM {}").format(sql.Identifier(TABLE)))
    row = await cur.fetchone()
    return int(row[0]) if row and row[0] is not None else 0


async def pending(conn: AsyncConnection[Any]) -> list[tuple[int, str]]:
    """The steps not applied yet, in order; RuntimeError if the database
    is of a newer turnmesh."""
    version = await applied(conn)
    _refuse_newer(version)
    return [(v, name) for v, name, _ in STEPS if v > version]


async def migrate(conn: AsyncConnection[Any]) -> list[tuple[int, str]]:
    """Apply the pending steps (the connection in autocommit mode): the ones
    applied, in order. A step that locks tables servers still write (a
    rolling upgrade: older servers run meanwhile) may meet them in a deadlock
    or wait past ``LOCK_TIMEOUT``; the whole migration is then rolled back and
    tried again, ``MIGRATION_ATTEMPTS`` times in all."""
    for attempt in range(1, MIGRATION_ATTEMPTS + 1):
        try:
            return await _migrate_once(conn)
        except (errors.DeadlockDetected, errors.LockNotAvailable):
            if attempt == MIGRATION_ATTEMPTS:
                raise
            await asyncio.sleep(0.2 * attempt)
    raise AssertionError("unreachable")


async def _migrate_once(conn: AsyncConnection[Any]) -> list[tuple[int, str]]:
    async with conn.transaction():
        # A step may rewrite or count a large table: not bound by the pool's
        # statement timeout (a server would fail to start on every try).
        await conn.execute("SET LOCAL statement_timeout = 0")
        # Servers starting together wait here for the one migrating, however long.
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        # A table lock's wait is bounded, though: writes queue behind it.
        await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'".encode())
        await conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (version integer PRIMARY KEY,"
                " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(sql.Identifier(TABLE))
        )
        version = await applied(conn)
        _refuse_newer(version)
        done: list[tuple[int, str]] = []
        for step, name, statements in STEPS:
            if step <= version:
                continue
            await conn.execute(statements.encode())  # several statements: simple query protocol
            await conn.execute(
                sql.SQL("INSERT INTO {} (version, name) VALUES (%s, %s)").format(
                    sql.Identifier(TABLE)
                ),
                (step, name),
            )
            done.append((step, name))
    return done


def _refuse_newer(version: int) -> None:
    if version > LATEST:
        raise RuntimeError(
            f"the PostgreSQL store has schema version {version}, from a newer turnmesh"
            f" (this one knows up to {LATEST})"
        )
