"""Bring a Redis store written by an older turnmesh up to the current layout.

Layout 1 (before hash tags) used ``tm:s:S``, ``tm:h:S``, ``tm:k:S``,
``tm:t:S``, ``tm:e:S:T``, ``tm:ts:S:T`` and one global ``tm:idle``: keys that
could collide when ids held ``:`` and that no cluster could hold. Layout 2 is
described in ``store_redis``. The first server to start takes a lock and
renames every session's keys; the others wait until no layout-1 index is
left. Servers check again at every expiry pass, so sessions that servers of
the old version still write during a rolling upgrade are moved too (a turn
an old server commits to a moved session fails cleanly: upgrade with the
servers stopped, or accept that window).
Layout 1 never ran on a cluster (its scripts crossed slots), so RENAME on one
node is enough. Turn status keys are left to expire: no turn runs during an
upgrade that restarts every server.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any, cast

from turnmesh.server.store_redis import (
    SCHEMA_KEY,
    SCHEMA_VERSION,
    Client,
    Keys,
    idle_key,
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


async def migrate(client: Client) -> None:
    """Move layout-1 sessions, if there are any (also those an old server
    wrote after an earlier move: a rolling upgrade runs both for a while)."""
    if not await client.exists(OLD_IDLE):
        # A new store (or one already moved): say so, once.
        await client.set(SCHEMA_KEY, SCHEMA_VERSION, nx=True)
        return
    token = secrets.token_hex(8)
    if not await client.set(LOCK_KEY, token, nx=True, ex=LOCK_SECONDS):
        await _wait_for_migration(client)
        return
    log.info("moving the session store to layout %d", SCHEMA_VERSION)
    moved = 0
    while True:
        rows = cast(
            list[tuple[bytes, float]],
            await client.zrange(OLD_IDLE, 0, BATCH - 1, withscores=True),
        )
        if not rows:
            break
        for raw, score in rows:
            await _move_session(client, raw.decode(), score)
            moved += 1
            await client.expire(LOCK_KEY, LOCK_SECONDS)  # still working
    await client.set(SCHEMA_KEY, SCHEMA_VERSION)
    await client.register_script(RELEASE)(keys=[LOCK_KEY], args=[token])
    log.info("moved %d sessions to layout %d", moved, SCHEMA_VERSION)


async def _move_session(client: Client, session_id: str, score: float) -> None:
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


async def _wait_for_migration(client: Client) -> None:
    """Another server is moving the store: wait until it is done (or its
    lock lapses, and then take over)."""
    log.info("waiting for another server to move the session store to layout %d", SCHEMA_VERSION)
    while True:
        if not await client.exists(OLD_IDLE):
            return
        if not await client.exists(LOCK_KEY):
            await migrate(client)
            return
        await asyncio.sleep(WAIT_STEP_SECONDS)
