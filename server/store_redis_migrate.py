"""Bring a Redis store written by an older turnmesh up to the current layout.

Layout 1 (before hash tags) used ``tm:s:S``, ``tm:h:S``, ``tm:k:S``,
``tm:t:S``, ``tm:e:S:T``, ``tm:ts:S:T`` and one global ``tm:idle``: keys that
could collide when ids held ``:`` and that no cluster could hold. Layout 2 is
described in ``store_redis``. The first server to start takes a lock and
renames every session's keys; the others wait for ``tm:schema`` to say 2.
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


async def migrate(client: Client) -> None:
    version = await client.get(SCHEMA_KEY)
    if version is not None and int(version) >= SCHEMA_VERSION:
        return
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
    await client.delete(OLD_IDLE)
    await client.set(SCHEMA_KEY, SCHEMA_VERSION)
    await client.delete(LOCK_KEY)
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
        version = await client.get(SCHEMA_KEY)
        if version is not None and int(version) >= SCHEMA_VERSION:
            return
        if not await client.exists(LOCK_KEY):
            await migrate(client)
            return
        await asyncio.sleep(WAIT_STEP_SECONDS)
