"""A Redis store written before principals (layout 2), brought to layout 3:
every session listed under its principal, and the bare ids of a mesh that
now has one principal given to it, keys moved whole (across slots on a
cluster); a listing entry left without its session skipped and dropped; and
the move safe to run again, or to finish after it was cut short."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as redis

from tests.support.mesh import RedisServer
from tests.support.redis_cluster import RedisCluster
from turnmesh.runtime.principals import principal_of
from turnmesh.server.stores.base import SessionRecord
from turnmesh.server.stores.listing import position
from turnmesh.server.stores.redis import RedisStore
from turnmesh.server.stores.redis_client import connect
from turnmesh.server.stores.redis_keys import (
    LISTING_SHARDS,
    Keys,
    idle_key,
    listing_entry,
    listing_key,
    listing_key_of,
)
from turnmesh.v1 import event_pb2, message_pb2

# Its own database of the shared server: moving "every bare session" must
# not reach the other tests' sessions.
DB = 9


@pytest.fixture
async def url(redis_server: RedisServer) -> str:
    url = redis_server.url.rpartition("/")[0] + f"/{DB}"
    raw = redis.Redis.from_url(url)
    await raw.flushdb()
    await raw.aclose()
    return url


@pytest.fixture
async def raw(url: str) -> AsyncIterator[Any]:
    client = connect(url)
    yield client
    await client.aclose()


def _message(role: str, content: str) -> message_pb2.Message:
    return message_pb2.Message(role=role, content=content, turn_id="t1")


FINAL = event_pb2.Event(type=event_pb2.RUN_FINISHED, seq=2, run_id="t1")


async def _fill(store: RedisStore, sid: str, at: float) -> None:
    """A session with a history, a committed turn's events and status, and
    an idempotency key."""
    await store.create(SessionRecord(sid, "demo", at, at, {"k": "v"}), [_message("system", "hi")])
    await store.append_events(sid, "t1", [event_pb2.Event(type=event_pb2.RUN_STARTED, seq=1)])
    await store.commit_turn(sid, [_message("user", "q"), _message("assistant", "a")], FINAL, at)
    await store.set_key(sid, "retry-1", "t1")


async def _as_layout_2(raw: Any, url: str, sessions: dict[str, float]) -> None:
    """The sessions, written as a server of layout 2 would have."""
    store = RedisStore(url, event_ttl_seconds=600)
    await store.open()
    for sid, at in sessions.items():
        await _fill(store, sid, at)
    await store.close()
    principals = {principal_of(sid) for sid in sessions}
    await raw.delete(*(listing_key(p, n) for p in principals for n in range(LISTING_SHARDS)))
    await raw.set("tm:schema", 2)


async def _opened(url: str, legacy_principal: str) -> RedisStore:
    store = RedisStore(url, event_ttl_seconds=600, legacy_principal=legacy_principal)
    await store.open()
    return store


async def _assert_whole(store: RedisStore, raw: Any, sid: str, at: float) -> None:
    record = await store.get(sid)
    assert record is not None
    assert (record.agent_name, record.metadata, record.created_at) == ("demo", {"k": "v"}, at)
    assert record.message_count == 3
    assert [m.content for m in await store.history(sid)] == ["hi", "q", "a"]
    assert await store.read_events(sid, "t1") == [
        event_pb2.Event(type=event_pb2.RUN_STARTED, seq=1),
        FINAL,
    ]
    assert await store.get_key(sid, "retry-1") == "t1"
    # Times to live kept: events expire, the record does not.
    assert 0 < await raw.pttl(Keys(sid).events("t1")) <= 600_000
    assert await raw.pttl(Keys(sid).record) == -1
    # The turn's status came along: committed, so it can no longer be abandoned.
    assert await store.abandon_turn(sid, "t1") is False


async def _keys(raw: Any, sid: str) -> list[bytes]:
    found: list[bytes] = await raw.keys(f"tm:{{{sid}}}:*")
    return found


async def _snapshot(raw: Any) -> dict[bytes, object]:
    """Every key of the database: its type, value and whether it expires."""
    out: dict[bytes, object] = {}
    for key in sorted(await raw.keys("*")):
        kind = (await raw.type(key)).decode()
        if kind == "string":
            value = await raw.get(key)
        elif kind == "list":
            value = await raw.lrange(key, 0, -1)
        elif kind == "hash":
            value = await raw.hgetall(key)
        elif kind == "set":
            value = await raw.smembers(key)
        else:
            value = await raw.zrange(key, 0, -1, withscores=True)
        out[key] = (kind, value, await raw.pttl(key) > 0)
    return out


async def test_bare_sessions_go_to_the_legacy_principal(url: str, raw: Any) -> None:
    await _as_layout_2(raw, url, {"s1": 1000.0, "s2": 1001.0, "beta/x": 1002.0})
    store = await _opened(url, "acme")
    try:
        for sid, at in (("acme/s1", 1000.0), ("acme/s2", 1001.0)):
            await _assert_whole(store, raw, sid, at)
            assert await store.get(sid.removeprefix("acme/")) is None
        assert await _keys(raw, "s1") == [] and await _keys(raw, "s2") == []
        page = await store.list_sessions("acme", None, 10)
        assert [r.session_id for _, r in page.items] == ["acme/s2", "acme/s1"]
        assert page.frontier is None
        assert page.items[0][0] == position(1001.0, "acme/s2")
        # Already scoped: stays where it was, and is listed for its principal.
        await _assert_whole(store, raw, "beta/x", 1002.0)
        beta = await store.list_sessions("beta", None, 10)
        assert [r.session_id for _, r in beta.items] == ["beta/x"]
        assert (await store.count_of("acme"), await store.count_of("anonymous")) == (2, 0)
        assert await store.count() == 3
        assert set(await store.idle_sessions(math.inf)) == {"acme/s1", "acme/s2", "beta/x"}
        assert await raw.get("tm:schema") == b"3"
        assert not await raw.exists("tm:migrating")
    finally:
        await store.close()


async def test_under_the_anonymous_principal_bare_ids_stay(url: str, raw: Any) -> None:
    await _as_layout_2(raw, url, {"s1": 1000.0, "s2": 1001.0})
    store = await _opened(url, "anonymous")
    try:
        await _assert_whole(store, raw, "s1", 1000.0)
        page = await store.list_sessions("anonymous", None, 1)
        assert [r.session_id for _, r in page.items] == ["s2"]
        assert page.frontier is not None
        rest = await store.list_sessions("anonymous", page.frontier, 1)
        assert [r.session_id for _, r in rest.items] == ["s1"]
        assert await store.count_of("anonymous") == 2
    finally:
        await store.close()


async def test_a_layout_1_store_reaches_layout_3_in_one_run(url: str, raw: Any) -> None:
    sid = f"old:{uuid.uuid4().hex}"
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
    await raw.zadd("tm:idle", {sid: 1001.0})
    store = await _opened(url, "acme")
    try:
        assert [m.content for m in await store.history(f"acme/{sid}")] == ["from before"]
        page = await store.list_sessions("acme", None, 10)
        assert [r.session_id for _, r in page.items] == [f"acme/{sid}"]
        assert await store.idle_sessions(1002) == [f"acme/{sid}"]
        assert await _keys(raw, sid) == []
        assert not await raw.exists("tm:idle", f"tm:s:{sid}")
        assert await raw.get("tm:schema") == b"3"
    finally:
        await store.close()


async def test_a_bare_id_the_legacy_principal_holds_already_stays(url: str, raw: Any) -> None:
    await _as_layout_2(raw, url, {"s1": 1000.0, "acme/s1": 3000.0})
    store = await _opened(url, "acme")
    try:
        await _assert_whole(store, raw, "s1", 1000.0)
        await _assert_whole(store, raw, "acme/s1", 3000.0)
        assert [
            r.session_id for _, r in (await store.list_sessions("anonymous", None, 5)).items
        ] == ["s1"]
        assert await store.count_of("acme") == 1
    finally:
        await store.close()


async def test_running_the_move_again_changes_nothing(url: str, raw: Any) -> None:
    await _as_layout_2(raw, url, {"s1": 1000.0, "beta/x": 1002.0})
    old = Keys("s1")
    layout_2 = {k: await raw.dump(k) for k in await raw.keys("tm:{s1}:*")}
    store = await _opened(url, "acme")
    try:
        # A session moved takes a turn under its new id.
        await store.append_messages("acme/s1", [_message("user", "later")], 2000.0)
        moved = await _snapshot(raw)
        await store.open()  # every expiry pass does this
        assert await _snapshot(raw) == moved
        # The same run again, from the start (its end was never recorded).
        await raw.set("tm:schema", 2)
        await store.open()
        assert await _snapshot(raw) == moved
        # A run cut short after its copy, before its source was deleted: the
        # next run keeps the copy (with its later turn) and drops the source.
        for key, payload in layout_2.items():
            await raw.restore(key, 0, payload, replace=True)
        await raw.zadd(idle_key("s1"), {"s1": 1000.0})
        await raw.set("tm:schema", 2)
        assert await raw.exists(old.record, old.history)
        await store.open()
        assert await _snapshot(raw) == moved
        assert len(await store.history("acme/s1")) == 4
    finally:
        await store.close()


async def test_an_entry_without_its_session_is_skipped_and_dropped(url: str, raw: Any) -> None:
    store = await _opened(url, "anonymous")
    try:
        live, gone, creating = "acme/live", "acme/gone", "acme/creating"
        now = time.time()
        await store.create(SessionRecord(live, "demo", 1000.0, 1000.0))
        await store.create(SessionRecord(gone, "demo", 2000.0, 2000.0))
        # A delete cut short after the session's keys went (before its entry
        # did), and a create whose session is not written yet.
        await raw.delete(Keys(gone).record)
        await raw.zadd(listing_key_of(creating), {listing_entry(now, creating): 0})
        assert await store.count_of("acme") == 3
        # The newest entries have no session: the page is empty, yet not the last.
        first = await store.list_sessions("acme", None, 1)
        assert first.items == [] and first.frontier is not None
        second = await store.list_sessions("acme", first.frontier, 1)
        assert second.items == [] and second.frontier is not None
        third = await store.list_sessions("acme", second.frontier, 1)
        assert [r.session_id for _, r in third.items] == [live]
        # The old entry is gone; the young one stays (its create may be running).
        assert await raw.zscore(listing_key_of(gone), listing_entry(2000.0, gone)) is None
        assert await raw.zscore(listing_key_of(creating), listing_entry(now, creating)) == 0
        assert await store.count_of("acme") == 2
    finally:
        await store.close()


async def test_a_create_of_a_taken_id_keeps_the_listing_whole(url: str, raw: Any) -> None:
    store = await _opened(url, "anonymous")
    try:
        await store.create(SessionRecord("acme/a", "demo", 1000.0, 1000.0))
        for at in (1000.0, 5000.0):  # the same instant, and another
            with pytest.raises(Exception, match="already exists"):
                await store.create(SessionRecord("acme/a", "demo", at, at))
        page = await store.list_sessions("acme", None, 10)
        assert [(at, r.session_id) for at, r in page.items] == [
            (position(1000.0, "acme/a"), "acme/a")
        ]
        assert await store.count_of("acme") == 1
        assert await store.delete("acme/a")
        assert await store.count_of("acme") == 0
    finally:
        await store.close()


async def test_an_old_entry_never_lists_a_session_made_again_under_its_id(
    url: str, raw: Any
) -> None:
    store = await _opened(url, "anonymous")
    try:
        # A delete cut short left the first session's entry; the id was made again.
        await store.create(SessionRecord("acme/again", "demo", 1000.0, 1000.0))
        await raw.delete(Keys("acme/again").record)
        await store.create(SessionRecord("acme/again", "demo", 3000.0, 3000.0))
        page = await store.list_sessions("acme", None, 10)
        assert [(at, r.session_id) for at, r in page.items] == [
            (position(3000.0, "acme/again"), "acme/again")
        ]
        assert (
            await raw.zscore(listing_key_of("acme/again"), listing_entry(1000.0, "acme/again"))
            is None
        )  # the stale entry is dropped, so the quota's count is right again
        assert await store.count_of("acme") == 1
    finally:
        await store.close()


async def test_on_a_cluster_the_moved_keys_change_slot(redis_cluster: RedisCluster) -> None:
    """Each session's keys move to another slot (usually another node); the
    cluster holds other tests' sessions too, so only ours are looked at."""
    url = redis_cluster.url
    raw: Any = connect(url)
    legacy = f"acme{uuid.uuid4().hex[:8]}"
    sids = {f"c-{uuid.uuid4().hex}": 1000.0 + i for i in range(6)}
    try:
        await _as_layout_2(raw, url, sids)
        store = await _opened(url, legacy)
        try:
            for sid, at in sids.items():
                await _assert_whole(store, raw, f"{legacy}/{sid}", at)
                assert await store.get(sid) is None
                assert not await raw.exists(Keys(sid).record, Keys(sid).history)
                assert await raw.zscore(idle_key(sid), sid) is None
            page = await store.list_sessions(legacy, None, 100)
            listed = [
                r.session_id for _, r in page.items if r.session_id.rpartition("/")[2] in sids
            ]
            assert listed == [f"{legacy}/{sid}" for sid in reversed(sids)]
            # Again, from the start: our sessions stay as they are.
            before = [await store.get(f"{legacy}/{sid}") for sid in sids]
            await raw.set("tm:schema", 2)
            await store.open()
            assert [await store.get(f"{legacy}/{sid}") for sid in sids] == before
            assert await raw.get("tm:schema") == b"3"
        finally:
            await store.close()
    finally:
        await raw.aclose()
