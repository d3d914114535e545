"""A2A task records in the Redis store (``RedisStore``'s).

Keys: ``tm:{S'}:a`` (hash: task id -> record) and ``tm:{S'}:aw`` (sorted
set: task ids by creation nanoseconds, to bound and delete them) on the
session's slot; ``tm:ta:{P'}`` principal P's records for listing (every
score 0, members ``NANOS|TASK|SESSION``, nanoseconds as 20 digits, so lexical
order is listing order and ZREVRANGEBYLEX reads a keyset page). As for
sessions, the principal's entry is written before the record (another slot)
and removed after it, so a crash leaves an entry without a record (skipped
when listed), never a record that is not listed.
"""

from __future__ import annotations

from typing import cast

from turnmesh.runtime.principals import principal_of
from turnmesh.server.stores.base import TASK_RECORDS_PER_PRINCIPAL, TASK_RECORDS_PER_SESSION
from turnmesh.server.stores.listing import Page, Position
from turnmesh.server.stores.redis_client import Client
from turnmesh.server.stores.redis_keys import Keys, tag

# KEYS: session record, its task records, its tasks by creation. ARGV: task,
# record, creation nanoseconds. -1: no session; 1: a new task; 0: rewritten.
PUT_TASK = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local new = redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
if new == 1 then redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1]) end
return new
"""


def records_key(session_id: str) -> str:
    return Keys(session_id).record[:-1] + "a"


def created_key(session_id: str) -> str:
    return Keys(session_id).record[:-1] + "aw"


def listing_key(principal: str) -> str:
    return f"tm:ta:{tag(principal)}"


def member(nanos: int, task_id: str, session_id: str) -> str:
    return f"{nanos:020d}|{task_id}|{session_id}"


def _parsed(raw: bytes) -> tuple[Position, str]:
    nanos, _, rest = raw.decode().partition("|")
    task_id, _, session_id = rest.partition("|")
    return (int(nanos), task_id), session_id


class RedisTasks:
    def __init__(self, client: Client) -> None:
        self._redis = client
        self._put = client.register_script(PUT_TASK)

    async def put(self, session_id: str, task_id: str, record: bytes, created_at: float) -> bool:
        nanos = int(created_at * 1e9)
        entry = member(nanos, task_id, session_id)
        index = listing_key(principal_of(session_id))
        await self._redis.zadd(index, {entry: 0}, nx=True)
        written = await self._put(
            keys=[Keys(session_id).record, records_key(session_id), created_key(session_id)],
            args=[task_id, record, nanos],
        )
        if written < 0:
            await self._redis.zrem(index, entry)
            return False
        if written == 1:
            await self._bound(session_id, index)
        return True

    async def _bound(self, session_id: str, index: str) -> None:
        """The session's and the principal's oldest records past the bounds go."""
        created = created_key(session_id)
        excess = await self._redis.zcard(created) - TASK_RECORDS_PER_SESSION
        if excess > 0:
            oldest = cast(list[tuple[bytes, float]], await self._redis.zpopmin(created, excess))
            if oldest:
                await self._redis.hdel(records_key(session_id), *(t for t, _ in oldest))
                await self._redis.zrem(
                    index, *(member(int(n), t.decode(), session_id) for t, n in oldest)
                )
        excess = await self._redis.zcard(index) - TASK_RECORDS_PER_PRINCIPAL
        if excess > 0:
            # Every score is 0: the lexically first, which are the oldest.
            popped = cast(list[tuple[bytes, float]], await self._redis.zpopmin(index, excess))
            for raw, _ in popped:
                (_, task_id), owner = _parsed(raw)
                await self._redis.hdel(records_key(owner), task_id)
                await self._redis.zrem(created_key(owner), task_id)

    async def get(self, session_id: str, task_id: str) -> bytes | None:
        found = await self._redis.hget(records_key(session_id), task_id)
        return cast(bytes, found) if found else None

    async def delete(self, session_id: str) -> None:
        """After the session's own keys: its records and their listing entries."""
        created = created_key(session_id)
        tasks = cast(
            list[tuple[bytes, float]], await self._redis.zrange(created, 0, -1, withscores=True)
        )
        await self._redis.delete(records_key(session_id), created)
        if tasks:
            await self._redis.zrem(
                listing_key(principal_of(session_id)),
                *(member(int(n), t.decode(), session_id) for t, n in tasks),
            )

    async def listed(
        self, principal: str, before: Position | None, limit: int
    ) -> Page[tuple[str, bytes]]:
        if limit < 1:
            return Page([], None)
        index = listing_key(principal)
        high = "+" if before is None else f"({before[0]:020d}|{before[1]}|"
        rows = cast(
            list[bytes],
            await self._redis.zrevrangebylex(index, high, "-", start=0, num=limit + 1),
        )
        entries = [_parsed(raw) for raw in rows[:limit]]
        async with self._redis.pipeline(transaction=False) as pipe:
            for (_, task_id), session_id in entries:
                pipe.hget(records_key(session_id), task_id)
            records: list[bytes | None] = await pipe.execute()
        items = [
            (at, (session_id, record))
            for (at, session_id), record in zip(entries, records, strict=True)
            if record is not None
        ]
        frontier = entries[-1][0] if len(rows) > limit else None
        return Page(items, frontier)
