"""The SQLite store's move to principals: a file written before them (layout
version 0) is given to the legacy principal once, in one transaction, and
keeps every session's history, events, turn status and idempotency keys."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from turnmesh.server.stores import open_store, sqlite_schema
from turnmesh.server.stores.base import SessionRecord
from turnmesh.server.stores.listing import position
from turnmesh.v1 import event_pb2, message_pb2

# The layout before principals, as released: what version-0 files hold.
OLD_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    agent_name TEXT NOT NULL,
    created_at REAL NOT NULL,
    last_activity REAL NOT NULL,
    metadata TEXT NOT NULL,
    message_count INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_by_activity ON sessions (last_activity);
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
    PRIMARY KEY (session_id, key)
);
"""

SID = "s-old"
CREATED = 1700000000.123456789


def _message(role: str, content: str) -> message_pb2.Message:
    return message_pb2.Message(role=role, content=content, turn_id="T1")


FINAL = event_pb2.Event(type=event_pb2.RUN_FINISHED, seq=2, thread_id=SID, run_id="T1")


def _old_file(path: Path, created: list[float] | None = None) -> None:
    """A version-0 file: one session with a committed turn T1 (or, given
    ``created``, bare sessions created at those times)."""
    db = sqlite3.connect(path)
    try:
        db.executescript(OLD_SCHEMA)
        with db:
            if created is None:
                _old_session(db)
            else:
                db.executemany(
                    "INSERT INTO sessions VALUES (?, 'demo', ?, ?, '{}', 0)",
                    [(f"s-{i}", at, at) for i, at in enumerate(created)],
                )
    finally:
        db.close()


def _old_session(db: sqlite3.Connection) -> None:
    db.execute(
        "INSERT INTO sessions VALUES (?, 'demo', ?, ?, ?, 2)",
        (SID, CREATED, CREATED + 1, '{"k": "v"}'),
    )
    db.executemany(
        "INSERT INTO messages VALUES (?, ?, ?)",
        [
            (SID, 0, _message("user", "hi").SerializeToString()),
            (SID, 1, _message("assistant", "hello").SerializeToString()),
        ],
    )
    started = event_pb2.Event(type=event_pb2.RUN_STARTED, seq=1, run_id="T1")
    db.executemany(
        "INSERT INTO events VALUES (?, 'T1', ?, ?, ?)",
        [(SID, e.seq, CREATED + 1, e.SerializeToString()) for e in (started, FINAL)],
    )
    db.execute("INSERT INTO turn_status VALUES (?, 'T1', 'committed', ?)", (SID, CREATED + 1))
    db.execute("INSERT INTO idempotency_keys VALUES (?, 'key-1', 'T1')", (SID,))


def _raw(path: Path) -> tuple[int, list[str]]:
    """The file's layout version and every row and definition in it."""
    db = sqlite3.connect(path)
    try:
        return db.execute("PRAGMA user_version").fetchone()[0], list(db.iterdump())
    finally:
        db.close()


async def test_a_version_0_file_goes_to_the_legacy_principal(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _old_file(path)
    store = open_store(f"sqlite:{path}", 600, legacy_principal="acme")
    await store.open()
    try:
        sid = f"acme/{SID}"
        record = await store.get(sid)
        assert record == SessionRecord(sid, "demo", CREATED, CREATED + 1, {"k": "v"}, 2)
        assert await store.get(SID) is None
        assert [m.content for m in await store.history(sid)] == ["hi", "hello"]
        events = await store.read_events(sid, "T1")
        assert events is not None and [e.seq for e in events] == [1, 2]
        assert await store.read_events(SID, "T1") is None
        assert await store.get_key(sid, "key-1") == "T1"
        assert await store.get_key(SID, "key-1") is None
        # T1's status moved too: it stays committed, so it cannot be abandoned.
        assert not await store.abandon_turn(sid, "T1")

        page = await store.list_sessions("acme", None, 10)
        assert [(at, r.session_id) for at, r in page.items] == [(position(CREATED, sid), sid)]
        assert page.frontier is None
        assert await store.count_of("acme") == 1
        assert await store.count_of("anonymous") == 0
        assert (await store.list_sessions("anonymous", None, 10)).items == []

        # The moved session takes new turns after its old ones.
        final = event_pb2.Event(type=event_pb2.RUN_FINISHED, seq=2, thread_id=sid, run_id="T2")
        await store.commit_turn(sid, [_message("user", "again")], final, CREATED + 2)
        assert [m.content for m in await store.history(sid)] == ["hi", "hello", "again"]
    finally:
        await store.close()
    assert _raw(path)[0] == sqlite_schema.SCHEMA_VERSION


async def test_a_file_from_before_some_tables_moves_too(tmp_path: Path) -> None:
    """Early files have no turn_status table (nor idempotency keys): the move
    renames what is there and the schema adds the rest."""
    path = tmp_path / "early.db"
    _old_file(path, created=[CREATED])
    db = sqlite3.connect(path)
    try:
        db.execute("DROP TABLE turn_status")
        db.execute("DROP TABLE idempotency_keys")
    finally:
        db.close()
    store = open_store(f"sqlite:{path}", 600, "acme")
    try:
        assert await store.get("acme/s-0") is not None
        assert await store.count_of("acme") == 1
        assert await store.abandon_turn("acme/s-0", "T9")  # the new table works
    finally:
        await store.close()


async def test_a_version_0_file_stays_anonymous_by_default(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _old_file(path)
    store = open_store(f"sqlite:{path}", 600)
    await store.open()
    try:
        record = await store.get(SID)
        assert record is not None and record.message_count == 2
        assert [m.content for m in await store.history(SID)] == ["hi", "hello"]
        assert await store.read_events(SID, "T1") == [
            event_pb2.Event(type=event_pb2.RUN_STARTED, seq=1, run_id="T1"),
            FINAL,
        ]
        assert await store.get_key(SID, "key-1") == "T1"
        assert not await store.abandon_turn(SID, "T1")
        page = await store.list_sessions("anonymous", None, 10)
        assert [(at, r.session_id) for at, r in page.items] == [(position(CREATED, SID), SID)]
        assert await store.count_of("anonymous") == 1
    finally:
        await store.close()


async def test_reopening_a_moved_or_new_file_changes_nothing(tmp_path: Path) -> None:
    old, new = tmp_path / "old.db", tmp_path / "new.db"
    _old_file(old)
    for path in (old, new):
        first = open_store(f"sqlite:{path}", 600, legacy_principal="acme")
        await first.close()
        before = _raw(path)
        assert before[0] == sqlite_schema.SCHEMA_VERSION
        # Another legacy principal changes nothing either: the move is done.
        again = open_store(f"sqlite:{path}", 600, legacy_principal="other")
        await again.close()
        assert _raw(path) == before
    assert any("acme/s-old" in line for line in _raw(old)[1])


async def test_a_failed_move_leaves_the_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    _old_file(path)
    before = _raw(path)
    # The last rename fails: every earlier change must be rolled back.
    monkeypatch.setattr(sqlite_schema, "SESSION_TABLES", (*sqlite_schema.SESSION_TABLES, "nope"))
    monkeypatch.setattr(sqlite_schema, "_has_table", lambda db, name: True)
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        open_store(f"sqlite:{path}", 600, legacy_principal="acme")
    assert _raw(path) == before
    monkeypatch.undo()
    store = open_store(f"sqlite:{path}", 600, legacy_principal="acme")  # the lock was freed
    try:
        assert await store.get(f"acme/{SID}") is not None
    finally:
        await store.close()


async def test_a_file_of_a_newer_layout_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    await open_store(f"sqlite:{path}", 600).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {sqlite_schema.SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(RuntimeError, match="newer turnmesh"):
        open_store(f"sqlite:{path}", 600)


# Awkward for binary floats, plus random times around now.
AWKWARD = [
    CREATED,
    0.1,
    0.3,
    1e-9,
    2.675,
    1234567890.9999999,
    1700000000.000000001,
    2**31 + 0.5,
    4102444800.987654321,
] + [random.Random(17).uniform(1.6e9, 1.9e9) for _ in range(500)]


async def test_created_ns_is_exactly_the_nanoseconds_of_a_position(tmp_path: Path) -> None:
    """Migrated and new rows alike hold ``int(created_at * 1e9)``, the first
    half of ``listing.position``: listing compares them with page tokens."""
    path = tmp_path / "old.db"
    _old_file(path, AWKWARD)
    store = open_store(f"sqlite:{path}", 600, legacy_principal="acme")
    try:
        for i, at in enumerate(AWKWARD):
            await store.create(SessionRecord(f"acme/new-{i}", "demo", at, at))
    finally:
        await store.close()
    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT session_id, created_at, created_ns FROM sessions").fetchall()
    finally:
        db.close()
    assert len(rows) == 2 * len(AWKWARD)
    for sid, at, ns in rows:
        assert at == AWKWARD[int(sid.rpartition("-")[2])]
        assert ns == int(at * 1e9) == position(at, sid)[0], sid
