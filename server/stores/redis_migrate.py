"""Bring a Redis store written by an older turnmesh up to the current layout.

Layout 1 (before hash tags) used ``tm:s:S``, ``tm:h:S``, ``tm:k:S``,
``tm:t:S``, ``tm:e:S:T``, ``tm:ts:S:T`` and one global ``tm:idle``: keys that
could collide when ids held ``:`` and that no cluster could hold. Layout 2
hash-tagged every session's keys (``redis_keys``). Layout 3 (principals)
adds the listing index ``tm:p:{…}``, and gives the sessions of before
principals to the legacy principal (``open_store``): unless that is the
anonymous one, a session ``S`` becomes ``P/S``.

The first server to start takes a lock and moves every session (1 -> 2 ->
3 in one run); the others wait until it is done. Servers check again at
every expiry pass, so sessions that servers of layout 1 still write during a
rolling upgrade are moved too (a turn an old server commits to a moved
session fails cleanly: upgrade with the servers stopped, or accept that
window). Servers of layout 2 leave no such trace: what they create after the
move is neither listed nor given to the legacy principal, so upgrade from
layout 2 with the servers stopped.

Layout 1 never ran on a cluster (its scripts crossed slots), so RENAME on one
node is enough; its turn status keys are left to expire. A session given to
a principal changes slot, so its keys are copied (DUMP/RESTORE, each with its
time to live) and then deleted. Every step is safe to repeat: a run cut short
is finished by the next.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any, cast

from turnmesh.runtime.principals import ANONYMOUS, scoped
from turnmesh.server.stores.redis_client import Client
from turnmesh.server.stores.redis_keys import (
    IDLE_SHARDS,
    SCHEMA_KEY,
    SCHEMA_VERSION,
    Keys,
    idle_key,
    listing_entry,
    listing_key_of,
)

log = logging.getLogger(__name__)

OLD_IDLE = "tm:idle"
LOCK_KEY = "tm:migrating"
LOCK_SECONDS = 120
BATCH = 500
WAIT_STEP_SECONDS = 0.2


# Deletes the lock only if it is still ours (it may have lapsed and been taken).
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


async def migrate(client: Client, legacy_principal: str) -> None:
    """Bring the store to the current layout, if it is not there (also
    layout-1 sessions an old server wrote after an earlier move: a rolling
    upgrade runs both for a while)."""
    if await _up_to_date(client):
        return
    token = secrets.token_hex(8)
    if not await client.set(LOCK_KEY, token, nx=True, ex=LOCK_SECONDS):
        await _wait_for_migration(client, legacy_principal)
        return
    try:
        schema = await client.get(SCHEMA_KEY)
        version = int(schema) if schema is not None else 1
        # Said before any work: a waiting server must not take a store whose
        # layout-1 index just emptied for a new one.
        await client.set(SCHEMA_KEY, version)
        log.info("moving the session store from layout %d to %d", version, SCHEMA_VERSION)
        done = 0
        if version < 3:
            done += await _index_sessions(client, legacy_principal)
        done += await _move_layout_1(client, legacy_principal)
        await client.set(SCHEMA_KEY, SCHEMA_VERSION)
        log.info("moved %d sessions to layout %d", done, SCHEMA_VERSION)
    finally:
        await client.register_script(RELEASE)(keys=[LOCK_KEY], args=[token])


async def _up_to_date(client: Client) -> bool:
    pipe: Any = client.pipeline(transaction=False)
    pipe.exists(OLD_IDLE)
    pipe.get(SCHEMA_KEY)
    old, schema = await pipe.execute()
    if old:
        return False
    if schema is None:
        # A new store (one with sessions says its layout, or has layout 1's
        # index): say so, once.
        await client.set(SCHEMA_KEY, SCHEMA_VERSION, nx=True)
        schema = await client.get(SCHEMA_KEY)
    return int(schema) >= SCHEMA_VERSION


async def _move_layout_1(client: Client, legacy_principal: str) -> int:
    moved = 0
    while True:
        rows = cast(
            list[tuple[bytes, float]],
            await client.zrange(OLD_IDLE, 0, BATCH - 1, withscores=True),
        )
        if not rows:
            return moved
        for raw, score in rows:
            session_id = raw.decode()
            await _move_session(client, session_id, score)
            await _to_layout_3(client, [session_id], legacy_principal)
            moved += 1
        await client.expire(LOCK_KEY, LOCK_SECONDS)  # still working


async def _move_session(client: Client, session_id: str, score: float) -> None:
    """Layout 1 -> 2."""
    keys = Keys(session_id)
    for old, new in (
        (f"tm:s:{session_id}", keys.record),
        (f"tm:h:{session_id}", keys.history),
        (f"tm:k:{session_id}", keys.keys),
        (f"tm:t:{session_id}", keys.turns),
    ):
        if await client.exists(old):
            await client.rename(old, new)
    for raw in await client.smembers(keys.turns):
        turn_id = raw.decode() if isinstance(raw, bytes) else raw
        old = f"tm:e:{session_id}:{turn_id}"
        if await client.exists(old):
            await client.rename(old, keys.events(turn_id))
    pipe: Any = client.pipeline(transaction=False)
    pipe.zadd(idle_key(session_id), {session_id: score})
    pipe.zrem(OLD_IDLE, session_id)
    await pipe.execute()


async def _index_sessions(client: Client, legacy_principal: str) -> int:
    """Layout 2 -> 3 for every session (the idle index lists them all)."""
    done = 0
    for shard in range(IDLE_SHARDS):
        key = f"tm:idle:{{{shard}}}"
        cursor = 0
        while True:
            # A cursor, not ranks: sessions given to a principal leave the
            # shard meanwhile. One seen twice is done twice, harmlessly.
            cursor, rows = await client.zscan(key, cursor, count=BATCH)
            ids = [cast(bytes, raw).decode() for raw, _ in rows]
            done += await _to_layout_3(client, ids, legacy_principal)
            await client.expire(LOCK_KEY, LOCK_SECONDS)  # still working
            if cursor == 0:
                break
    return done


async def _to_layout_3(client: Client, sessions: list[str], legacy_principal: str) -> int:
    """List each session under its principal; a bare id of before principals
    becomes the legacy principal's."""
    pipe: Any = client.pipeline(transaction=False)
    for session_id in sessions:
        pipe.hget(Keys(session_id).record, "created_at")
    created: list[bytes | None] = await pipe.execute()
    listed: Any = client.pipeline(transaction=False)
    done = 0
    for session_id, created_at in zip(sessions, created, strict=True):
        if created_at is None:
            continue  # an idle entry without a session: dropped at its expiry
        done += 1
        if legacy_principal != ANONYMOUS and "/" not in session_id:
            target = scoped(legacy_principal, session_id)
            if await _give(client, session_id, target, created_at):
                continue
        at = float(created_at)
        listed.zadd(listing_key_of(session_id), {listing_entry(at, session_id): 0})
    await listed.execute()
    return done


async def _give(client: Client, source: str, target: str, created_at: bytes) -> bool:
    """Move session ``source`` to id ``target`` (another slot); False if
    ``target`` is another session already. The record is copied last and
    the source deleted in one step, so the session is whole wherever it
    exists; a move cut
    short is finished by the next run, which finds the target's record (with
    the same creation time) and keeps it: it may have taken turns since."""
    old, new = Keys(source), Keys(target)
    taken = await client.hget(new.record, "created_at")
    if taken is not None and taken != created_at:
        log.warning("session %s stays unscoped: %s is another session", source, target)
        return False
    # The turns with events: in the index, or the set of before it.
    listed = cast(set[bytes], await client.smembers(old.turns))
    indexed = cast(list[bytes], await client.zrange(old.turn_index, 0, -1))
    turns = sorted({t.decode() for t in (*listed, *indexed)})
    if taken is None:
        pairs = [(old.history, new.history), (old.keys, new.keys), (old.turns, new.turns)]
        pairs += [(old.key_times, new.key_times), (old.turn_index, new.turn_index)]
        pairs += [(old.events(t), new.events(t)) for t in turns]
        pairs += [(old.status(t), new.status(t)) for t in turns]
        await _copy(client, pairs)
        await _copy(client, [(old.record, new.record)])
    # The target's own activity (it may have taken turns since a run cut
    # short); GT, lest a commit racing this be undone.
    activity = float(cast(bytes, await client.hget(new.record, "last_activity")))
    index: Any = client.pipeline(transaction=False)
    index.zadd(idle_key(target), {target: activity}, gt=True)
    index.zadd(listing_key_of(target), {listing_entry(float(created_at), target): 0})
    await index.execute()
    turn_keys = [k for t in turns for k in (old.events(t), old.status(t))]
    # One slot: a multi-key DEL is allowed on a cluster too.
    await client.delete(
        old.record,
        old.history,
        old.keys,
        old.key_times,
        old.turns,
        old.turn_index,
        *turn_keys,
    )
    await client.zrem(idle_key(source), source)
    return True


async def _copy(client: Client, pairs: list[tuple[str, str]]) -> None:
    """Copy keys (each pair's sources on one slot, its targets on one),
    times to live included; sources that do not exist are skipped."""
    read: Any = client.pipeline(transaction=False)
    for source, _ in pairs:
        read.dump(source)
        read.pttl(source)
    replies = await read.execute()
    write: Any = client.pipeline(transaction=False)
    for (_, target), payload, ttl_ms in zip(pairs, replies[::2], replies[1::2], strict=True):
        if payload is None or ttl_ms == -2:
            continue
        # RESTORE's 0 is "no expiry" (PTTL's -1); a key about to expire keeps 1 ms.
        write.restore(target, 0 if ttl_ms == -1 else max(ttl_ms, 1), payload, replace=True)
    await write.execute()


async def _wait_for_migration(client: Client, legacy_principal: str) -> None:
    """Another server is moving the store: wait until it is done (or its
    lock lapses, and then take over)."""
    log.info("waiting for another server to move the session store to layout %d", SCHEMA_VERSION)
    while True:
        if await _up_to_date(client):
            return
        if not await client.exists(LOCK_KEY):
            await migrate(client, legacy_principal)
            return
        await asyncio.sleep(WAIT_STEP_SECONDS)
