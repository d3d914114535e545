"""The SessionStore contract, on every backend: memory, SQLite, real Redis
and a real three-node Redis Cluster; and what only Redis does: keys that
cannot collide, owner tokens that fence commits, the move from the old
layout."""

from __future__ import annotations

import asyncio
import math
import os
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest
import redis.asyncio as redis

from tests.support.mesh import RedisServer, eventually
from tests.support.postgres import emptied
from tests.support.redis_cluster import RedisCluster
from tests.support.webhooks import SECRET, receiving
from turnmesh.runtime.errors import AlreadyExists, NotFound, SessionQuotaExceeded
from turnmesh.server.stores import memory as store_memory
from turnmesh.server.stores import open_store, pg_tasks, redis_keys, sqlite_schema
from turnmesh.server.stores import postgres as store_postgres
from turnmesh.server.stores import redis as store_redis
from turnmesh.server.stores import redis_tasks as store_redis_tasks
from turnmesh.server.stores import sqlite as store_sqlite
from turnmesh.server.stores import sqlite_tasks as store_sqlite_tasks
from turnmesh.server.stores import tasks as store_tasks
from turnmesh.server.stores.base import SessionRecord, SessionStore, StoreInUse, TurnAbandoned
from turnmesh.server.stores.memory import MemoryStore
from turnmesh.server.stores.redis import RedisStore
from turnmesh.server.webhooks.outbox import Delivery, Outbox
from turnmesh.server.webhooks.sender import WebhookSender
from turnmesh.server.webhooks.settings import WebhookSettings
from turnmesh.v1 import event_pb2, message_pb2

# A database of its own, emptied for each test: the records these tests
# write by hand are not the meshes' of other tests on the shared server.
DB = 7


@pytest.fixture(params=["memory", "sqlite", "redis", "redis-cluster", "postgres"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, redis_server: RedisServer
) -> AsyncIterator[SessionStore]:
    opened: SessionStore
    if request.param == "postgres":
        opened = open_store(emptied(request.getfixturevalue("postgres_url")), 600)
        await opened.open()
        yield opened
        await opened.close()
        return
    if request.param == "redis-cluster":
        url = request.getfixturevalue("redis_cluster").url
    elif request.param == "redis":
        url = redis_server.url.rpartition("/")[0] + f"/{DB}"
        raw = redis.Redis.from_url(url)
        await raw.flushdb()
        await raw.aclose()
    else:
        url = {"memory": "memory", "sqlite": f"sqlite:{tmp_path / 'sessions.db'}"}[request.param]
    opened = open_store(url, event_ttl_seconds=600)
    await opened.open()
    yield opened
    await opened.close()


@pytest.fixture(params=["redis", "redis-cluster"])
async def redis_store(
    request: pytest.FixtureRequest, redis_server: RedisServer
) -> AsyncIterator[RedisStore]:
    url = (
        request.getfixturevalue("redis_cluster").url
        if request.param == "redis-cluster"
        else redis_server.url
    )
    opened = RedisStore(url, event_ttl_seconds=600)
    await opened.open()
    yield opened
    await opened.close()


def _record(session_id: str, at: float = 1000.0) -> SessionRecord:
    return SessionRecord(session_id, "demo", at, at, {"k": "v"})


def _message(role: str, content: str) -> message_pb2.Message:
    return message_pb2.Message(role=role, content=content, turn_id="t")


def _sid() -> str:
    return f"s-{uuid.uuid4().hex}"


async def test_create_get_and_duplicate(store: SessionStore) -> None:
    sid = _sid()
    await store.create(_record(sid), [_message("system", "be brief")])
    got = await store.get(sid)
    assert got is not None
    assert (got.agent_name, got.metadata, got.message_count) == ("demo", {"k": "v"}, 1)
    assert [m.content for m in await store.history(sid)] == ["be brief"]
    with pytest.raises(AlreadyExists):
        await store.create(_record(sid))
    assert await store.get(_sid()) is None
    assert got.webhook_url == ""
    hooked = _record(_sid())
    hooked.webhook_url = "https://hooks.example.com/turns?x=1"
    await store.create(hooked)
    kept = await store.get(hooked.session_id)
    assert kept is not None and kept.webhook_url == hooked.webhook_url


async def test_commit_appends_a_turn_and_its_final_event(store: SessionStore) -> None:
    sid = _sid()
    await store.create(_record(sid))
    final = event_pb2.Event(type=event_pb2.RUN_FINISHED, seq=3, thread_id=sid, run_id="t1")
    await store.append_events(
        sid,
        "t1",
        [
            event_pb2.Event(type=event_pb2.RUN_STARTED, seq=1),
            event_pb2.Event(type=event_pb2.TEXT_MESSAGE_CONTENT, seq=2),
        ],
    )
    await store.commit_turn(
        sid, [_message("user", "hi"), _message("assistant", "hello")], final, 2000.0
    )
    assert [m.content for m in await store.history(sid)] == ["hi", "hello"]
    record = await store.get(sid)
    assert record is not None
    assert (record.message_count, record.last_activity) == (2, 2000.0)
    if store.persists_events:
        events = await store.read_events(sid, "t1")
        assert events is not None
        assert [e.seq for e in events] == [1, 2, 3]
        assert events[-1].type == event_pb2.RUN_FINISHED
    # A second turn appends after the first.
    await store.append_messages(sid, [_message("user", "again")], 3000.0)
    assert [m.content for m in await store.history(sid)] == ["hi", "hello", "again"]


async def test_a_pause_is_kept_with_the_record_until_a_commit_changes_it(
    store: SessionStore,
) -> None:
    sid = _sid()
    seeded = message_pb2.Pause(turn_id="", tool_calls=[message_pb2.ToolCall(id="c0")])
    record = _record(sid)
    record.pause = seeded.SerializeToString()
    await store.create(record, [_message("assistant", "")])

    async def stored() -> bytes:
        got = await store.get(sid)
        assert got is not None
        return got.pause

    assert await stored() == seeded.SerializeToString()
    # Appending messages leaves it; a turn's commit sets or clears it.
    await store.append_messages(sid, [_message("user", "x")], 1500.0)
    assert await stored() == seeded.SerializeToString()
    paused = message_pb2.Pause(turn_id="t1", tool_calls=[message_pb2.ToolCall(id="c1")])
    final = event_pb2.Event(type=event_pb2.RUN_FINISHED, seq=2, thread_id=sid, run_id="t1")
    await store.commit_turn(sid, [], final, 2000.0, pause=paused.SerializeToString())
    assert await stored() == paused.SerializeToString()
    paused.cancelled = True
    await store.set_pause(sid, paused.SerializeToString(), 2500.0)
    assert message_pb2.Pause.FromString(await stored()).cancelled
    final2 = event_pb2.Event(type=event_pb2.RUN_FINISHED, seq=2, thread_id=sid, run_id="t2")
    await store.commit_turn(sid, [], final2, 3000.0)
    assert await stored() == b""


async def test_an_agents_checkpoint_is_kept_apart_from_the_record(store: SessionStore) -> None:
    """Written with its pause, read by itself (never with the record every
    call reads), kept by a cancel, replaced or cleared by the next commit,
    gone with its session."""
    sid = _sid()
    await store.create(_record(sid))
    assert await store.checkpoint(sid) == b""
    paused = message_pb2.Pause(turn_id="t1").SerializeToString()
    big = b"\x00checkpoint" * 100_000  # 1.1 MB

    def final(turn_id: str) -> event_pb2.Event:
        return event_pb2.Event(type=event_pb2.RUN_FINISHED, seq=2, thread_id=sid, run_id=turn_id)

    await store.commit_turn(sid, [], final("t1"), 2000.0, pause=paused, checkpoint=big)
    assert await store.checkpoint(sid) == big
    record = await store.get(sid)
    assert record is not None and record.pause == paused
    await store.set_pause(sid, paused, 2500.0)  # a cancel
    assert await store.checkpoint(sid) == big
    await store.commit_turn(sid, [], final("t2"), 3000.0, pause=paused, checkpoint=b"t2's")
    assert await store.checkpoint(sid) == b"t2's"
    await store.commit_turn(sid, [], final("t3"), 4000.0)
    assert await store.checkpoint(sid) == b""
    await store.commit_turn(sid, [], final("t4"), 5000.0, pause=paused, checkpoint=b"t4's")
    assert await store.delete(sid)
    await store.create(_record(sid))  # the same id again: a session of its own
    assert await store.checkpoint(sid) == b""


async def test_deleted_sessions_are_gone_and_commits_to_them_fail(store: SessionStore) -> None:
    sid = _sid()
    await store.create(_record(sid))
    await store.append_events(sid, "t1", [event_pb2.Event(type=event_pb2.RUN_STARTED, seq=1)])
    await store.set_key(sid, "key", "t1")
    assert await store.delete(sid) is True
    assert await store.delete(sid) is False
    assert await store.get(sid) is None
    with pytest.raises(NotFound):
        await store.history(sid)
    with pytest.raises(NotFound):
        await store.commit_turn(sid, [_message("user", "x")], event_pb2.Event(run_id="t2"), 1.0)
    assert await store.get(sid) is None  # a late commit did not bring it back
    assert await store.read_events(sid, "t1") is None
    assert await store.get_key(sid, "key") is None


async def test_idle_sessions_and_count(store: SessionStore) -> None:
    old, fresh = _sid(), _sid()
    before = await store.count()
    await store.create(_record(old, at=100.0))
    await store.create(_record(fresh, at=100.0))
    await store.touch(fresh, 5000.0)
    idle = await store.idle_sessions(1000.0)
    assert old in idle
    assert fresh not in idle
    assert await store.count() == before + 2


async def test_listing_is_per_principal_newest_first_in_keyset_pages(
    store: SessionStore,
) -> None:
    """Each principal lists only its own sessions, newest first; pages never
    skip or repeat one while sessions come and go between them."""
    tenant = f"t{uuid.uuid4().hex[:12]}"
    other = f"o{uuid.uuid4().hex[:12]}"
    ids = [f"{tenant}/s{i:02d}" for i in range(7)]
    for i, sid in enumerate(ids):
        await store.create(_record(sid, at=1000.0 + i))
    await store.create(_record(f"{other}/s03", at=1003.0))  # same public id, other tenant
    # Two sessions created at the same instant: the greater id first.
    await store.create(_record(f"{tenant}/tie-a", at=1006.0))
    assert await store.count_of(tenant) == 8
    assert await store.count_of(other) == 1
    assert await store.count_of(f"n{uuid.uuid4().hex[:12]}") == 0

    first = await store.list_sessions(tenant, None, 3)
    assert [r.session_id for _, r in first.items] == [f"{tenant}/tie-a", ids[6], ids[5]]
    assert first.frontier == first.items[-1][0]
    # Meanwhile: a new session (sorts before page one) and a deletion ahead.
    await store.create(_record(f"{tenant}/late", at=2000.0))
    await store.delete(ids[3])
    second = await store.list_sessions(tenant, first.frontier, 3)
    assert [r.session_id for _, r in second.items] == [ids[4], ids[2], ids[1]]
    third = await store.list_sessions(tenant, second.frontier, 3)
    assert [r.session_id for _, r in third.items] == [ids[0]]
    assert third.frontier is None
    record = third.items[0][1]
    assert (record.agent_name, record.metadata, record.created_at) == ("demo", {"k": "v"}, 1000.0)
    theirs = await store.list_sessions(other, None, 10)
    assert [r.session_id for _, r in theirs.items] == [f"{other}/s03"]
    assert theirs.frontier is None


async def test_full_pages_walk_every_session_once_in_order(store: SessionStore) -> None:
    """Pages of 100 over 250 sessions (on Redis each shard is asked for only
    part of a page, so a shard's share decides how far a page reaches)."""
    tenant = f"w{uuid.uuid4().hex[:12]}"
    ids = [f"{tenant}/s{i:03d}" for i in range(250)]
    for i, sid in enumerate(ids):
        await store.create(_record(sid, at=1000.0 + i // 3))  # ties: three per instant
    expected = sorted(ids, key=lambda sid: (1000 + int(sid[-3:]) // 3, sid), reverse=True)
    listed: list[str] = []
    before = None
    for _ in range(20):
        page = await store.list_sessions(tenant, before, 100)
        assert len(page.items) <= 100
        listed += [r.session_id for _, r in page.items]
        if page.frontier is None:
            break
        before = page.frontier
    assert listed == expected


async def test_the_anonymous_principal_lists_bare_ids(store: SessionStore) -> None:
    sid = _sid()
    await store.create(_record(sid, at=float(uuid.uuid4().int % 10**9)))
    page = await store.list_sessions("anonymous", None, 100)
    while sid not in [r.session_id for _, r in page.items] and page.frontier is not None:
        page = await store.list_sessions("anonymous", page.frontier, 100)
    assert sid in [r.session_id for _, r in page.items]
    assert await store.delete(sid)
    assert await store.count_of("anonymous") >= 0


async def test_creates_racing_at_a_quota_never_pass_it_together(store: SessionStore) -> None:
    principal = f"p-{uuid.uuid4().hex[:12]}"
    records = [_record(f"{principal}/s{n}", 1000.0 + n) for n in range(8)]
    raced = await asyncio.gather(
        *(store.create(r, quota=2) for r in records), return_exceptions=True
    )
    made = [r.session_id for r, result in zip(records, raced, strict=True) if result is None]
    assert all(isinstance(r, SessionQuotaExceeded) for r in raced if r is not None)
    assert len(made) <= 2  # at the quota, racing creates may all be refused: never all pass
    assert await store.count_of(principal) == len(made)
    while len(made) < 2:
        record = _record(f"{principal}/late{len(made)}", 2000.0 + len(made))
        await store.create(record, quota=2)
        made.append(record.session_id)
    with pytest.raises(SessionQuotaExceeded):
        await store.create(_record(f"{principal}/over", 3000.0), quota=2)
    # Refused creates leave nothing behind: not listed, not counted, not indexed.
    assert await store.count_of(principal) == 2
    page = await store.list_sessions(principal, None, 10)
    assert sorted(r.session_id for _, r in page.items) == sorted(made)
    refused = {r.session_id for r in records} - set(made)
    assert not refused & set(await store.idle_sessions(1e12))


async def test_events_and_keys_persist_where_promised(store: SessionStore) -> None:
    sid = _sid()
    await store.create(_record(sid))
    await store.append_events(sid, "t1", [event_pb2.Event(type=event_pb2.RUN_STARTED, seq=1)])
    await store.set_key(sid, "retry-1", "t1")
    if store.persists_events:
        events = await store.read_events(sid, "t1")
        assert events is not None
        assert [e.seq for e in events] == [1]
        assert await store.get_key(sid, "retry-1") == "t1"
        assert await store.read_events(sid, "unknown") is None
    else:
        assert await store.read_events(sid, "t1") is None


class _Clock:
    """Wall-clock time the test moves by hand, for a store module's ``time``."""

    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        return self.now


def _texts(reply: object) -> list[str]:
    """A Redis reply of members, as text."""
    return [member.decode() for member in cast(list[bytes], reply)]


async def _stored_keys(store: SessionStore, sid: str) -> list[str]:
    """The idempotency keys the store holds for the session, read raw."""
    if isinstance(store, RedisStore):
        keys = redis_keys.Keys(sid)
        held = sorted(_texts(await store.client.hkeys(keys.keys)))
        timed = sorted(_texts(await store.client.zrange(keys.key_times, 0, -1)))
        assert held == timed  # every key has its time
        return held
    if isinstance(store, store_postgres.PostgresStore):
        async with store._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT key FROM idempotency_keys WHERE session_id = %s ORDER BY key", (sid,)
            )
            return [row[0] for row in await cur.fetchall()]
    if isinstance(store, store_sqlite.SqliteStore):
        rows = await store._run(
            lambda db: db.execute(
                "SELECT key FROM idempotency_keys WHERE session_id = ? ORDER BY key", (sid,)
            ).fetchall()
        )
        return [row[0] for row in rows]
    return []  # memory: SessionTurns keeps a session's newest 256 (test_server_turns)


async def test_a_session_keeps_a_bounded_number_of_idempotency_keys(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in (store_sqlite, store_redis, store_postgres):
        monkeypatch.setattr(module, "IDEMPOTENCY_KEYS_PER_SESSION", 3)
    sid, other = _sid(), _sid()
    await store.create(_record(sid))
    await store.create(_record(other))
    await store.set_key(other, "k0", "o0")
    for n in range(5):
        await store.set_key(sid, f"k{n}", f"t{n}")
    if not store.persists_events:
        assert await store.get_key(sid, "k4") is None  # it keeps none
        return
    # The newest three, trimmed as new ones were written.
    assert [await store.get_key(sid, f"k{n}") for n in range(5)] == [None, None, "t2", "t3", "t4"]
    assert await _stored_keys(store, sid) == ["k2", "k3", "k4"]
    await store.set_key(sid, "k2", "t2b")  # written again: the newest now
    await store.set_key(sid, "k5", "t5")
    assert await _stored_keys(store, sid) == ["k2", "k4", "k5"]
    assert await store.get_key(other, "k0") == "o0"


async def test_idempotency_keys_are_kept_for_the_event_log_window(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not store.persists_events:
        pytest.skip("the memory store keeps no keys (SessionTurns keeps a session's newest)")
    clock = _Clock()
    monkeypatch.setattr(store_sqlite, "time", clock)
    monkeypatch.setattr(store_redis, "time", clock)
    monkeypatch.setattr(store_postgres, "time", clock)
    sid = _sid()
    await store.create(_record(sid))
    await store.set_key(sid, "old", "t0")
    clock.now += 300
    await store.set_key(sid, "new", "t1")
    assert await store.get_key(sid, "old") == "t0"
    clock.now += 301  # "old" is past the window (600 s), "new" is not
    assert await store.get_key(sid, "old") is None
    assert await store.get_key(sid, "new") == "t1"
    await store.set_key(sid, "newer", "t2")  # the write trims what is past it
    assert await _stored_keys(store, sid) == ["new", "newer"]
    # SQLite and PostgreSQL also prune them with the events, each expiry pass.
    clock.now += 601
    await store.idle_sessions(0)
    if isinstance(store, store_sqlite.SqliteStore | store_postgres.PostgresStore):
        assert await _stored_keys(store, sid) == []


async def test_a_sessions_turn_index_is_bounded_and_leaves_the_old_set_to_the_delete(
    redis_store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turns a delete must find (Redis): the newest of the window only;
    the set of before the index (no longer grown) stays for the delete to
    read, which drops it."""
    monkeypatch.setattr(store_redis, "TURNS_INDEXED_PER_SESSION", 3)
    clock = _Clock()
    monkeypatch.setattr(store_redis, "time", clock)
    raw = redis_store.client
    sid = _sid()
    keys = redis_keys.Keys(sid)
    await redis_store.create(_record(sid))
    await raw.sadd(keys.turns, *(f"ancient{n}" for n in range(50)))  # an older server's
    started = event_pb2.Event(type=event_pb2.RUN_STARTED, seq=1)
    for n in range(4):
        await redis_store.append_events(sid, f"t{n}", [started])
    assert _texts(await raw.zrange(keys.turn_index, 0, -1)) == ["t1", "t2", "t3"]
    clock.now += 601  # past the window: t1..t3's events have expired by now
    await redis_store.commit_turn(sid, [_message("user", "x")], _final(sid, "t4"), 1.0)
    assert _texts(await raw.zrange(keys.turn_index, 0, -1)) == ["t4"]
    assert await raw.scard(keys.turns) == 50  # not grown, not dropped
    # A session made again under the id finds none of it; deleting it leaves
    # nothing of its own.
    assert await redis_store.delete(sid)
    assert not await raw.exists(
        keys.record,
        keys.turn_index,
        keys.key_times,
        keys.turns,
        keys.events("t4"),
        keys.status("t4"),
    )


async def test_an_open_turn_indexed_before_its_record_is_not_dropped_by_a_sweep(
    redis_store: RedisStore,
) -> None:
    """put_turn indexes an open turn, then writes its record: a sweep that
    reads between the two keeps the entry (else the turn is never swept, and
    a notice that failed to queue is never sent); one whose record never
    came is dropped once old."""
    raw = redis_store.client
    sid = _sid()
    await redis_store.create(_record(sid))
    member = redis_keys.open_turn_member(sid, "t1")
    await raw.zadd(redis_keys.OPEN_TURNS, {member: time.time()})  # put_turn's first step
    assert await _open_of(redis_store, sid) == []  # not open yet: no record
    assert await raw.zscore(redis_keys.OPEN_TURNS, member) is not None
    assert await redis_store.put_turn(sid, "t1", b"running", ended=False, ttl_seconds=600)
    assert await _open_of(redis_store, sid) == ["t1"]
    # An entry whose record never came (its server died between the writes).
    dangling = redis_keys.open_turn_member(sid, "t2")
    old = time.time() - store_redis.DANGLING_AFTER_SECONDS - 1
    await raw.zadd(redis_keys.OPEN_TURNS, {dangling: old})
    assert await _open_of(redis_store, sid) == ["t1"]
    assert await raw.zscore(redis_keys.OPEN_TURNS, dangling) is None
    assert await redis_store.delete(sid)


async def test_keys_written_before_their_times_are_kept_then_trimmed(
    redis_store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_redis, "IDEMPOTENCY_KEYS_PER_SESSION", 3)
    raw = redis_store.client
    sid = _sid()
    keys = redis_keys.Keys(sid)
    await redis_store.create(_record(sid))
    await raw.hset(keys.keys, mapping={f"legacy{n}": f"l{n}" for n in range(5)})
    assert await redis_store.get_key(sid, "legacy0") == "l0"  # no time: still kept
    # A name that sorts before theirs: kept for its time, not its name.
    await redis_store.set_key(sid, "a-new", "t1")
    # Timed as just before this write: the bound keeps three, the new one among them.
    held = await _stored_keys(redis_store, sid)
    assert len(held) == 3 and "a-new" in held
    assert await redis_store.get_key(sid, "a-new") == "t1"
    assert await redis_store.delete(sid)


async def test_a_delete_after_new_commits_removes_the_turns_of_before_the_index(
    redis_store: RedisStore,
) -> None:
    """A session that a server of before the turn index wrote to: its turns
    are in a set, which later commits leave for the delete to read."""
    raw = redis_store.client
    sid = _sid()
    keys = redis_keys.Keys(sid)
    await redis_store.create(_record(sid))
    await raw.sadd(keys.turns, "old")
    await raw.rpush(keys.events("old"), b"x")
    await raw.set(keys.status("old"), "committed")
    await redis_store.commit_turn(sid, [_message("user", "x")], _final(sid, "new"), 1.0)
    assert await redis_store.delete(sid)
    assert not await raw.exists(keys.events("old"), keys.status("old"), keys.turns)
    assert not await raw.exists(keys.events("new"), keys.status("new"))


def _as_layout(path: Path, version: int, *statements: str) -> None:
    """Make a SQLite file look as a server of an older layout left it."""
    db = sqlite3.connect(path)
    try:
        for statement in statements:
            db.execute(statement)
        db.execute(f"PRAGMA user_version = {version}")
        db.commit()
    finally:
        db.close()


async def test_a_version_5_sqlite_file_gets_its_keys_times(tmp_path: Path) -> None:
    path = tmp_path / "v5.db"
    sid = _sid()
    first = open_store(f"sqlite:{path}", 600)
    await first.create(_record(sid))
    await first.set_key(sid, "k1", "t1")
    await first.close()
    # As a version-5 server left it: keys without times.
    _as_layout(
        path,
        5,
        "DROP INDEX idempotency_keys_by_age",
        "ALTER TABLE idempotency_keys DROP COLUMN written_at",
        "ALTER TABLE sessions DROP COLUMN checkpoint",
    )
    again = open_store(f"sqlite:{path}", 600)
    try:
        assert await again.get_key(sid, "k1") == "t1"  # counted from the upgrade
        await again.set_key(sid, "k2", "t2")
        assert await _stored_keys(again, sid) == ["k1", "k2"]
    finally:
        await again.close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == sqlite_schema.SCHEMA_VERSION
    finally:
        db.close()


async def test_history_of_two_thousand_messages_round_trips(store: SessionStore) -> None:
    sid = _sid()
    await store.create(_record(sid))
    for turn in range(1000):
        await store.append_messages(
            sid, [_message("user", f"q{turn}"), _message("assistant", f"a{turn}")], float(turn)
        )
    history = await store.history(sid)
    assert len(history) == 2000
    assert history[0].content == "q0"
    assert history[-1].content == "a999"


def test_unknown_store_url_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown store"):
        open_store("mysql://x", 1)


async def test_a_turn_either_commits_or_is_abandoned_never_both(store: SessionStore) -> None:
    """The fence against a cut-off owner committing a turn that another server
    gave up for lost (and whose caller re-ran it there)."""
    sid = _sid()
    await store.create(_record(sid))

    def final(turn_id: str) -> event_pb2.Event:
        return event_pb2.Event(type=event_pb2.RUN_FINISHED, seq=2, thread_id=sid, run_id=turn_id)

    # Committed first: it can no longer be abandoned.
    await store.commit_turn(sid, [_message("user", "one")], final("t1"), 1001.0)
    if store.persists_events:
        assert await store.abandon_turn(sid, "t1") is False
    # Abandoned first: its late commit writes nothing.
    assert await store.abandon_turn(sid, "t2") is True
    assert await store.abandon_turn(sid, "t2") is True  # and stays so
    if store.persists_events:
        with pytest.raises(TurnAbandoned):
            await store.commit_turn(sid, [_message("user", "two")], final("t2"), 1002.0)
        assert [m.content for m in await store.history(sid)] == ["one"]
        assert await store.read_events(sid, "t2") is None
        record = await store.get(sid)
        assert record is not None and record.message_count == 1


def _final(sid: str, turn_id: str, seq: int = 2) -> event_pb2.Event:
    return event_pb2.Event(type=event_pb2.RUN_FINISHED, seq=seq, thread_id=sid, run_id=turn_id)


async def test_ids_that_share_a_prefix_never_share_keys(redis_store: RedisStore) -> None:
    """Session "team" + turn "alice:T" once read (and abandoned) session
    "team:alice"'s turn T; ids with braces or percents once could end a
    hash tag early. Each session's keys are its own."""
    base = _sid()
    team, team_alice = base, f"{base}:alice"
    for sid in (team, team_alice, f"{base}{{x}}", f"{base}%7Bx%7D", f"{base}%"):
        await redis_store.create(_record(sid))
    events = [event_pb2.Event(type=event_pb2.RUN_STARTED, seq=1, run_id="T")]
    await redis_store.append_events(team_alice, "T", events)
    await redis_store.set_key(team_alice, "k", "T")
    assert await redis_store.read_events(team, "alice:T") is None
    assert await redis_store.get_key(team, "k") is None
    # Abandoning "team"'s turn "alice:T" leaves "team:alice"'s turn T alone.
    assert await redis_store.abandon_turn(team, "alice:T") is True
    await redis_store.commit_turn(
        team_alice, [_message("user", "kept")], _final(team_alice, "T"), 1
    )
    assert [m.content for m in await redis_store.history(team_alice)] == ["kept"]
    # Braces and percents are escaped, so these are five distinct sessions.
    await redis_store.commit_turn(f"{base}{{x}}", [_message("user", "brace")], _final(base, "a"), 1)
    assert await redis_store.history(f"{base}%7Bx%7D") == []
    assert await redis_store.history(f"{base}%") == []
    assert await redis_store.delete(team) is True
    assert await redis_store.get(team_alice) is not None


async def test_a_commit_under_a_replaced_owner_token_writes_nothing(
    redis_store: RedisStore,
) -> None:
    sid = _sid()
    record = _record(sid)
    record.owner = "server-a/1"
    await redis_store.create(record)
    assert await redis_store.owner_of(sid) == "server-a/1"
    await redis_store.commit_turn(sid, [_message("user", "a")], _final(sid, "t1"), 1, "server-a/1")
    # Server B takes the session over (A's lease lapsed): A's late commit is void.
    assert await redis_store.swap_owner(sid, "server-a/0", "server-b/1") is False
    assert await redis_store.swap_owner(sid, "server-a/1", "server-b/1") is True
    with pytest.raises(TurnAbandoned):
        await redis_store.commit_turn(
            sid, [_message("user", "late")], _final(sid, "t2"), 2, "server-a/1"
        )
    await redis_store.commit_turn(sid, [_message("user", "b")], _final(sid, "t3"), 3, "server-b/1")
    assert [m.content for m in await redis_store.history(sid)] == ["a", "b"]
    assert await redis_store.read_events(sid, "t2") is None
    assert await redis_store.owners_of([sid, _sid()]) == ["server-b/1", None]
    assert await redis_store.swap_owner(_sid(), "", "x") is None
    # Member leases: an address while they last, gone when dropped.
    member = f"server-{uuid.uuid4().hex}"
    await redis_store.hold_member(member, "127.0.0.1:5", 60_000)
    lease = await redis_store.member_lease(member)
    assert lease is not None and lease[0] == "127.0.0.1:5" and 0 < lease[1] <= 60
    assert await redis_store.take_address("another", "127.0.0.1:5", 60_000) == member
    await redis_store.drop_member(member)
    assert await redis_store.member_lease(member) is None


async def test_a_cluster_spreads_sessions_over_its_nodes(redis_cluster: RedisCluster) -> None:
    store = RedisStore(redis_cluster.url, event_ttl_seconds=600)
    await store.open()
    try:
        before = await store.count()
        sids = [_sid() for _ in range(60)]
        for sid in sids:
            await store.create(_record(sid))
            await store.commit_turn(sid, [_message("user", sid)], _final(sid, "t"), 2000)
        assert await store.count() == before + 60
        assert set(sids) <= set(await store.idle_sessions(2001))
        for sid in sids[:5]:
            assert [m.content for m in await store.history(sid)] == [sid]
            assert await store.delete(sid)
        assert await store.count() == before + 55
    finally:
        await store.close()
    assert all(keys > 0 for keys in redis_cluster.keys_per_node())


async def test_a_store_of_the_old_layout_is_moved(redis_server: RedisServer) -> None:
    """Data written before hash tags (layout 1) is renamed in place when the
    first server opens the store, and reads back whole."""
    raw = redis.Redis.from_url(redis_server.url)
    sid = f"old:{uuid.uuid4().hex}"
    final = _final(sid, "T1", seq=5)
    try:
        await raw.delete("tm:schema")
        await raw.hset(
            f"tm:s:{sid}",
            mapping={
                "agent_name": "demo",
                "created_at": "1000.0",
                "last_activity": "1001.0",
                "metadata": "{}",
                "message_count": "1",
            },
        )
        await raw.rpush(f"tm:h:{sid}", _message("user", "from before").SerializeToString())
        await raw.rpush(f"tm:e:{sid}:T1", final.SerializeToString())
        await raw.sadd(f"tm:t:{sid}", "T1")
        await raw.hset(f"tm:k:{sid}", "key-1", "T1")
        await raw.zadd("tm:idle", {sid: 1001.0})

        store = RedisStore(redis_server.url, event_ttl_seconds=600)
        await store.open()
        try:
            record = await store.get(sid)
            assert record is not None and record.message_count == 1
            assert [m.content for m in await store.history(sid)] == ["from before"]
            assert await store.read_events(sid, "T1") == [final]
            assert await store.get_key(sid, "key-1") == "T1"
            assert sid in await store.idle_sessions(1002)
            assert not await raw.exists("tm:idle", f"tm:s:{sid}", f"tm:h:{sid}")
            assert await raw.get("tm:schema") == b"3"
            # A moved session takes new turns (it has no owner token yet).
            await store.commit_turn(sid, [_message("user", "after")], _final(sid, "T2"), 1003)
            assert len(await store.history(sid)) == 2
        finally:
            await store.close()
    finally:
        await raw.aclose()


async def test_a_sqlite_file_serves_one_server(tmp_path: Path) -> None:
    path = tmp_path / "one.db"
    first = open_store(f"sqlite:{path}", 600)
    with pytest.raises(StoreInUse, match="in use by another server"):
        open_store(f"sqlite:{path}", 600)
    await first.close()
    second = open_store(f"sqlite:{path}", 600)  # free again once the first closed
    await second.close()


async def test_a_sqlite_file_serves_one_server_by_any_name(tmp_path: Path) -> None:
    """The lock is the file's: a symlink or a hard link to it is the same store."""
    path = tmp_path / "one.db"
    first = open_store(f"sqlite:{path}", 600)
    (tmp_path / "link.db").symlink_to(path)
    os.link(path, tmp_path / "hard.db")
    for other in ("link.db", "hard.db"):
        with pytest.raises(StoreInUse, match="in use by another server"):
            open_store(f"sqlite:{tmp_path / other}", 600)
    # Still the first's, with SQLite's own locks intact: it writes and reads.
    await first.create(_record("s1"), None, None)
    assert await first.get("s1") is not None
    await first.close()
    again = open_store(f"sqlite:{tmp_path / 'hard.db'}", 600)
    assert await again.get("s1") is not None
    await again.close()


# Turn records (background turns: GetTurn once their events are gone) -------


async def test_a_turn_record_that_says_the_turn_ended_is_final(store: SessionStore) -> None:
    sid = _sid()
    await store.create(_record(sid))
    assert await store.get_turn(sid, "t1") is None
    assert await store.put_turn(sid, "t1", b"queued", ended=False, ttl_seconds=600)
    assert await store.put_turn(sid, "t1", b"running", ended=False, ttl_seconds=600)
    assert await store.get_turn(sid, "t1") == b"running"
    # The first write that ends it wins; nothing after changes it.
    assert await store.put_turn(sid, "t1", b"finished", ended=True, ttl_seconds=600)
    assert not await store.put_turn(sid, "t1", b"failed", ended=True, ttl_seconds=600)
    assert not await store.put_turn(sid, "t1", b"running again", ended=False, ttl_seconds=600)
    assert await store.get_turn(sid, "t1") == b"finished"
    # Never for a session that is not there; gone with its session.
    assert not await store.put_turn(_sid(), "t1", b"x", ended=False, ttl_seconds=600)
    assert await store.delete(sid)
    assert await store.get_turn(sid, "t1") is None
    await store.create(_record(sid))  # the same id again: a new session
    assert await store.get_turn(sid, "t1") is None


async def test_turn_records_expire_on_their_own_ttl(store: SessionStore) -> None:
    sid = _sid()
    await store.create(_record(sid))
    await store.put_turn(sid, "short", b"x", ended=True, ttl_seconds=1)
    await store.put_turn(sid, "long", b"y", ended=True, ttl_seconds=600)

    async def expired() -> bool:
        await store.idle_sessions(0)  # SQLite prunes then; the others need no pass
        return await store.get_turn(sid, "short") is None

    await eventually(expired, timeout=30, what="the short record to expire")
    assert await store.get_turn(sid, "long") == b"y"


async def test_a_session_keeps_a_bounded_number_of_turn_records(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in (store_memory, store_sqlite, store_redis, store_postgres):
        monkeypatch.setattr(module, "TURN_RECORDS_PER_SESSION", 3)
    sid, other = _sid(), _sid()
    await store.create(_record(sid))
    await store.create(_record(other))
    for n in range(5):
        assert await store.put_turn(sid, f"t{n}", b"r%d" % n, ended=False, ttl_seconds=600)
    await store.put_turn(other, "t0", b"other", ended=True, ttl_seconds=600)
    # The oldest first writes go (ties: the lower turn id, as ULIDs order).
    kept = [await store.get_turn(sid, f"t{n}") for n in range(5)]
    assert kept == [None, None, b"r2", b"r3", b"r4"]
    assert await store.get_turn(other, "t0") == b"other"


async def test_a_memory_store_keeps_a_bounded_number_of_turn_records() -> None:
    store = MemoryStore(max_turn_records=3)
    sids = [_sid() for _ in range(3)]
    for sid in sids:
        await store.create(_record(sid))
    for n, sid in enumerate([*sids, sids[0], sids[1]]):
        await store.put_turn(sid, f"t{n}", b"r%d" % n, ended=False, ttl_seconds=600)
    # Past the bound, the least recently written go first.
    assert [await store.get_turn(sid, f"t{n}") for n, sid in enumerate(sids)] == [None, None, b"r2"]
    assert await store.get_turn(sids[0], "t3") == b"r3"
    assert await store.get_turn(sids[1], "t4") == b"r4"
    assert len(store._turn_records) == 3
    assert await store.delete(sids[0])
    assert len(store._turn_records) == 2 and sids[0] not in store._turns_of


async def test_a_memory_store_keeps_its_turn_records_within_a_byte_bound() -> None:
    store = MemoryStore(max_turn_record_bytes=10_000)
    sid = _sid()
    await store.create(_record(sid))
    for n in range(4):
        await store.put_turn(sid, f"t{n}", b"r" * 4_000, ended=False, ttl_seconds=600)
    # Past the bound, the least recently written go first.
    assert [await store.get_turn(sid, f"t{n}") is not None for n in range(4)] == [
        False,
        False,
        True,
        True,
    ]
    # A record rewritten smaller frees what it held.
    await store.put_turn(sid, "t3", b"r", ended=True, ttl_seconds=600)
    await store.put_turn(sid, "t4", b"r" * 4_000, ended=False, ttl_seconds=600)
    assert [await store.get_turn(sid, f"t{n}") is not None for n in (2, 3, 4)] == [True] * 3
    assert store._turn_record_bytes == 8_001


async def test_a_version_2_sqlite_file_gets_turn_records(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    sid = _sid()
    first = open_store(f"sqlite:{path}", 600)
    await first.create(_record(sid), [_message("user", "kept")])
    await first.close()
    # As a version-2 server left it: no turn records, outbox or webhook column.
    _as_layout(
        path,
        2,
        "DROP TABLE turn_records",
        "DROP TABLE webhook_outbox",
        "ALTER TABLE sessions DROP COLUMN webhook_url",
        "ALTER TABLE sessions DROP COLUMN checkpoint",
    )
    again = open_store(f"sqlite:{path}", 600)
    try:
        assert [m.content for m in await again.history(sid)] == ["kept"]
        assert await again.put_turn(sid, "t1", b"x", ended=False, ttl_seconds=600)
        assert await again.get_turn(sid, "t1") == b"x"
        assert (await again.get(sid)).webhook_url == ""  # type: ignore[union-attr]
        hooked = _record(_sid())
        hooked.webhook_url = "https://hooks.example.com/t"
        await again.create(hooked)
        assert (await again.get(hooked.session_id)).webhook_url == hooked.webhook_url  # type: ignore[union-attr]
        assert await again.outbox().add(Delivery("msg_v2", "http://127.0.0.1:1/", b"{}"), 10)
    finally:
        await again.close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == sqlite_schema.SCHEMA_VERSION == 8
    finally:
        db.close()


async def test_the_webhook_outbox_leases_retries_and_is_bounded(store: SessionStore) -> None:
    outbox = store.outbox()
    await _empty(outbox)
    now = time.time()
    a = Delivery("msg_a", "http://127.0.0.1:1/a", b'{"a":1}', 0, now - 2)
    b = Delivery("msg_b", "http://127.0.0.1:1/b", b"\x00\xff not text", 0, now - 1)
    c = Delivery("msg_c", "http://127.0.0.1:1/c", b"c", 0, now + 100)
    for delivery in (a, b, c):
        assert await outbox.add(delivery, limit=3)
    assert not await outbox.add(Delivery("msg_d", "http://127.0.0.1:1/d", b"d"), limit=3)
    # The same notice again (another writer of the turn's end): kept once, as it was.
    assert await outbox.add(Delivery("msg_a", "http://127.0.0.1:1/x", b"again"), limit=3)
    assert await outbox.next_due() == pytest.approx(now - 2)
    claimed = await outbox.claim(now, 30, 10)
    assert [(d.id, d.url, d.body, d.attempts) for d in claimed] == [
        (a.id, a.url, a.body, 0),
        (b.id, b.url, b.body, 0),
    ]
    assert await outbox.claim(now, 30, 10) == []  # held for their lease
    # The lease ends (a server died holding them): due again, for anyone.
    again = {d.id: d for d in await outbox.claim(now + 31, 30, 10)}
    assert set(again) == {a.id, b.id}
    again[a.id].attempts = 1
    await outbox.settle(again[a.id], now + 50)  # to be retried
    await outbox.settle(again[b.id], None)  # delivered
    due = await outbox.claim(now + 200, 30, 10)
    assert {(d.id, d.attempts) for d in due} == {(a.id, 1), (c.id, 0)}
    for delivery in due:
        await outbox.settle(delivery, None)
    assert await outbox.next_due() is None
    assert await outbox.add(Delivery("msg_e", "http://127.0.0.1:1/e", b"e"), limit=1)
    (last,) = await outbox.claim(math.inf, 0, 10)
    await outbox.settle(last, None)
    # One owner's share is bounded; a notice that goes makes room in it.
    acme = [Delivery(f"msg_o{n}", "http://127.0.0.1:1/", b"o", owner="acme") for n in range(3)]
    assert [await outbox.add(d, limit=10, owner_limit=2) for d in acme] == [True, True, False]
    other = Delivery("msg_p", "http://127.0.0.1:1/", b"p", owner="other")
    assert await outbox.add(other, limit=10, owner_limit=2)
    await outbox.settle(acme[0], None)  # delivered
    assert await outbox.add(acme[2], limit=10, owner_limit=2)
    for left in await outbox.claim(math.inf, 0, 10):
        await outbox.settle(left, None)
    assert await outbox.next_due() is None


async def _empty(outbox: Outbox) -> None:
    # One Redis serves this file's tests: what another left goes first.
    for left in await outbox.claim(math.inf, 0, 10_000):
        await outbox.settle(left, None)
    assert await outbox.next_due() is None


async def test_the_webhook_outbox_claims_fairly_by_owner(store: SessionStore) -> None:
    """Five hundred of acme's notices due before globex's one: a claim with
    a cap of two per owner takes two of acme's and globex's; acme at its cap
    is passed over whatever it has due."""
    outbox = store.outbox()
    await _empty(outbox)
    now = time.time()
    for n in range(500):
        acme = Delivery(
            f"msg_a{n:03d}", "http://127.0.0.1:1/", b"a", 0, now - 100 + n * 0.01, "acme"
        )
        assert await outbox.add(acme, limit=1_000)
    assert await outbox.add(
        Delivery("msg_g", "http://127.0.0.1:1/", b"g", 0, now - 1, "globex"), 1_000
    )
    assert await outbox.add(
        Delivery("msg_i", "http://127.0.0.1:1/", b"i", 0, now + 60, "initech"), 1_000
    )
    claimed = await outbox.claim(now, 30, 8, {}, per_owner=2)
    assert [(d.id, d.owner) for d in claimed] == [
        ("msg_a000", "acme"),
        ("msg_a001", "acme"),
        ("msg_g", "globex"),
    ]
    # acme at its cap here: none of its 498 due notices; one below it: one more.
    assert await outbox.claim(now, 30, 8, {"acme": 2, "globex": 1}, per_owner=2) == []
    (third,) = await outbox.claim(now, 30, 8, {"acme": 1}, per_owner=2)
    assert (third.id, third.owner) == ("msg_a002", "acme")
    # The room left decides too, and no cap takes in due order of owners.
    assert [d.id for d in await outbox.claim(now, 30, 1, {}, per_owner=2)] == ["msg_a003"]
    assert [d.id for d in await outbox.claim(now, 30, 3)] == ["msg_a004", "msg_a005", "msg_a006"]
    # When the next notice is due, of an owner not at its cap.
    assert await outbox.next_due() == pytest.approx(now - 100 + 7 * 0.01)
    assert await outbox.next_due({"acme"}) == pytest.approx(now + 30)  # globex's lease
    assert await outbox.next_due({"acme", "globex"}) == pytest.approx(now + 60)
    # Settled ones leave their owner's queue: the head moves on.
    await outbox.settle(claimed[2], None)
    await outbox.settle(third, now + 5)
    assert await outbox.next_due({"acme"}) == pytest.approx(now + 60)
    await _empty(outbox)


async def test_a_stuck_owner_leaves_room_for_the_others_end_to_end(store: SessionStore) -> None:
    """acme's receiver never answers: with eight slots, two carry acme's
    notices and globex's goes at once (it once waited for acme's timeouts)."""
    outbox = store.outbox()
    await _empty(outbox)
    async with receiving() as receiver:
        receiver.hold = asyncio.Event()  # never set while the test looks
        settings = WebhookSettings(allow=(receiver.url,), secret=SECRET, timeout_seconds=600)
        sender = WebhookSender(settings, outbox)
        try:
            for n in range(20):
                await sender.send(receiver.url, "turn.finished", {"n": n}, f"msg_a{n}", "acme")
            sender.start()
            await receiver.requests(2)
            await sender.send(receiver.url, "turn.finished", {"n": "g"}, "msg_g", "globex")
            await receiver.requests(3)
            ids = [headers["webhook-id"] for headers, _ in receiver.seen]
            assert ids[:2] == ["msg_a0", "msg_a1"] and ids[2] == "msg_g"
        finally:
            receiver.hold.set()
            await sender.stop()
    await _empty(outbox)


async def test_a_version_4_sqlite_file_gets_the_outboxs_owners(tmp_path: Path) -> None:
    path = tmp_path / "v4.db"
    first = open_store(f"sqlite:{path}", 600)
    outbox = first.outbox()
    for n, owner in enumerate(("acme", "acme", "globex")):
        await outbox.add(Delivery(f"msg_{n}", "http://127.0.0.1:1/", b"x", 0, 100.0 + n, owner), 10)
    await first.close()
    # As a version-4 server left it: no owners table, the outbox indexed by owner.
    _as_layout(
        path,
        4,
        "DROP TABLE webhook_owners",
        "DROP INDEX webhook_outbox_by_owner_due",
        "CREATE INDEX webhook_outbox_by_owner ON webhook_outbox (owner)",
    )
    again = open_store(f"sqlite:{path}", 600)
    try:
        outbox = again.outbox()
        assert await outbox.next_due() == 100.0
        assert await outbox.next_due({"acme"}) == 102.0
        claimed = await outbox.claim(200.0, 30, 8, {"acme": 1}, per_owner=2)
        assert [(d.id, d.owner) for d in claimed] == [("msg_0", "acme"), ("msg_2", "globex")]
    finally:
        await again.close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == sqlite_schema.SCHEMA_VERSION
        indexes = {row[1] for row in db.execute("PRAGMA index_list(webhook_outbox)")}
        assert "webhook_outbox_by_owner" not in indexes
    finally:
        db.close()


async def test_notices_of_the_layout_before_owner_queues_are_adopted(
    redis_store: RedisStore,
) -> None:
    """Queued by a server of before the per-owner queues: in the due index
    alone (one even from before owners); the first claim finds them."""
    outbox = redis_store.outbox()
    await _empty(outbox)
    raw = redis_store.client
    from turnmesh.server.stores import redis_outbox as outbox_redis

    for n, owner in enumerate(("acme", "acme", None)):
        fields = ["url", "http://127.0.0.1:1/", "body", "old", "attempts", "0"]
        if owner is not None:
            fields += ["owner", owner]
            await raw.hincrby(outbox_redis.OWNERS, owner, 1)
        await raw.hset(outbox_redis.NOTICE + f"msg_old{n}", items=fields)
        await raw.zadd(outbox_redis.DUE, {f"msg_old{n}": 100.0 + n})
    fresh = redis_store.outbox()  # a server started since
    claimed = await fresh.claim(200.0, 30, 8, {}, per_owner=2)
    assert sorted((d.id, d.owner) for d in claimed) == [
        ("msg_old0", "acme"),
        ("msg_old1", "acme"),
        ("msg_old2", ""),
    ]
    for delivery in claimed:
        await fresh.settle(delivery, None)
    assert await fresh.next_due() is None
    assert not await raw.exists(outbox_redis.OWNERS, outbox_redis.HEADS, outbox_redis.DUE)


async def test_open_turn_records_are_listed_until_they_say_the_turn_ended(
    store: SessionStore,
) -> None:
    sid = _sid()
    await store.create(_record(sid))
    assert await store.put_turn(sid, "t1", b"running", ended=False, ttl_seconds=600)
    assert await store.put_turn(sid, "t2", b"running", ended=False, ttl_seconds=600)
    assert await store.put_turn(sid, "t3", b"done", ended=True, ttl_seconds=600)
    assert sorted(await _open_of(store, sid)) == ["t1", "t2"]
    assert await store.put_turn(sid, "t1", b"done", ended=True, ttl_seconds=600)
    assert await _open_of(store, sid) == ["t2"]
    # Gone with its session.
    assert await store.delete(sid)
    assert await _open_of(store, sid) == []


async def test_open_turn_records_are_read_in_pages_that_reach_every_one(
    store: SessionStore,
) -> None:
    # A session deleted with its turns open (Redis keeps their index entries
    # until read), then one whose turns stay open: small pages reach them all.
    gone, kept = _sid(), _sid()
    for sid in (gone, kept):
        await store.create(_record(sid))
        for n in range(5):
            assert await store.put_turn(sid, f"t{n}", b"running", ended=False, ttl_seconds=600)
    assert await store.delete(gone)
    page, cursor = await store.open_turns(2)
    seen = {(s, t) for s, t in page}
    while cursor is not None:
        page, cursor = await store.open_turns(2, cursor)
        assert len(page) <= 2
        seen.update(page)
    assert {(kept, f"t{n}") for n in range(5)} <= seen
    assert not any(s == gone for s, _ in seen)
    assert await store.delete(kept)


async def _open_of(store: SessionStore, sid: str, limit: int = 1000) -> list[str]:
    """The session's open turn records, read page by page to the end (the
    store may hold other tests' too)."""
    found: list[str] = []
    page, cursor = await store.open_turns(limit)
    while True:
        found.extend(t for s, t in page if s == sid)
        if cursor is None:
            return found
        page, cursor = await store.open_turns(limit, cursor)


# A2A task records ---------------------------------------------------------------


async def test_task_records_are_kept_per_session_listed_per_principal_and_deleted_with_it(
    store: SessionStore,
) -> None:
    """Each principal lists only its own task records, newest first, in keyset
    pages; a rewrite keeps its place; a session's records go with it."""
    tenant, other = f"t{uuid.uuid4().hex[:12]}", f"o{uuid.uuid4().hex[:12]}"
    first, second = f"{tenant}/{_sid()}", f"{tenant}/{_sid()}"
    theirs = f"{other}/{_sid()}"
    for sid in (first, second, theirs):
        await store.create(_record(sid))
    assert not await store.put_task(f"{tenant}/{_sid()}", "gone", b"x", 1000.0)
    for n in range(5):
        sid = first if n % 2 == 0 else second
        assert await store.put_task(sid, f"task{n}", b"r%d" % n, 1000.0 + n)
    assert await store.put_task(theirs, "task9", b"other", 1009.0)
    assert await store.put_task(first, "task0", b"r0 again", 1000.0)  # a rewrite
    assert await store.get_task(first, "task0") == b"r0 again"
    assert await store.get_task(second, "task0") is None
    assert await store.get_task(theirs, "task0") is None

    page = await store.list_tasks(tenant, None, 2)
    assert [(at[1], item) for at, item in page.items] == [
        ("task4", (first, b"r4")),
        ("task3", (second, b"r3")),
    ]
    assert page.frontier == page.items[-1][0]
    await store.put_task(second, "late", b"late", 2000.0)  # sorts before page one
    page = await store.list_tasks(tenant, page.frontier, 2)
    assert [at[1] for at, _ in page.items] == ["task2", "task1"]
    page = await store.list_tasks(tenant, page.frontier, 2)
    assert [item for _, item in page.items] == [(first, b"r0 again")]
    assert page.frontier is None
    listed = await store.list_tasks(other, None, 10)
    assert [item for _, item in listed.items] == [(theirs, b"other")]

    assert await store.delete(second)
    assert await store.get_task(second, "task1") is None
    left = await store.list_tasks(tenant, None, 10)
    assert [at[1] for at, _ in left.items] == ["task4", "task2", "task0"]
    assert not await store.put_task(second, "task1", b"again", 1001.0)


async def test_task_records_are_bounded_per_session_and_per_principal(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in (store_tasks, store_sqlite_tasks, store_redis_tasks, pg_tasks):
        monkeypatch.setattr(module, "TASK_RECORDS_PER_SESSION", 3)
        monkeypatch.setattr(module, "TASK_RECORDS_PER_PRINCIPAL", 5)
    tenant = f"t{uuid.uuid4().hex[:12]}"
    sid, other = f"{tenant}/{_sid()}", f"{tenant}/{_sid()}"
    await store.create(_record(sid))
    await store.create(_record(other))
    for n in range(5):
        assert await store.put_task(sid, f"a{n}", b"a%d" % n, 1000.0 + n)
    # The session's oldest go past its bound.
    assert [await store.get_task(sid, f"a{n}") for n in range(5)] == [
        None,
        None,
        b"a2",
        b"a3",
        b"a4",
    ]
    for n in range(3):
        assert await store.put_task(other, f"b{n}", b"b%d" % n, 1010.0 + n)
    # Six past the principal's five: its oldest (a2) goes, wherever it is.
    assert await store.get_task(sid, "a2") is None
    listed = await store.list_tasks(tenant, None, 10)
    assert [at[1] for at, _ in listed.items] == ["b2", "b1", "b0", "a4", "a3"]
    assert listed.frontier is None
