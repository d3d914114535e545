"""The webhook outbox in Redis: every server of the mesh delivers from it.

``tm:{webhooks}:due`` (a sorted set: every notice id by when it is due),
``tm:{webhooks}:n:ID`` (a hash: url, body, attempts, owner, and headers of
its own as JSON when it has any),
``tm:{webhooks}:owners`` (a hash: notices waiting, by owner),
``tm:{webhooks}:q:OWNER`` (a sorted set: the owner's notice ids by when each
is due) and ``tm:{webhooks}:heads`` (a sorted set: each owner by when its
earliest notice is due), on one slot of a cluster (the shared hash tag) so
each step is one atomic script. A claim takes owners by their heads, a few
notices of each (``Outbox.claim``: fair by owner, its work bounded), and
moves each notice's due time past its lease: a server that dies holding one
leaves it due again after that, for any server to deliver.

Notices queued before the per-owner queues existed (in ``due`` alone) are
put in their owner's queue by the first claim of each server (``adopt``).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any, cast

from turnmesh.server.stores.redis_client import Client, unavailable_when_down
from turnmesh.server.webhooks.outbox import Delivery

DUE = "tm:{webhooks}:due"
NOTICE = "tm:{webhooks}:n:"
# Notices waiting, by owner (the principal whose turn each tells of).
OWNERS = "tm:{webhooks}:owners"
QUEUE = "tm:{webhooks}:q:"
HEADS = "tm:{webhooks}:heads"
# Notices of the layout before the queues, looked at in one adoption step.
ADOPT_PAGE = 500

# An owner's head again (ARGV[n]: its queue's prefix), after its queue changed.
_HEAD = """
local function head(heads, queue_prefix, owner)
  local first = redis.call('ZRANGE', queue_prefix .. owner, 0, 0, 'WITHSCORES')
  if first[1] then redis.call('ZADD', heads, first[2], owner)
  else redis.call('ZREM', heads, owner) end
end
"""

# KEYS: due, notice, owners, heads. ARGV: limit, id, url, body, attempts,
# due, owner, owner limit ('' : none), queue prefix, headers ('' : none). A
# notice kept already stays as it is.
ADD = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 1 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
if ARGV[8] ~= '' and tonumber(redis.call('HGET', KEYS[3], ARGV[7]) or '0') >= tonumber(ARGV[8]) then
  return 0
end
redis.call('HSET', KEYS[2], 'url', ARGV[3], 'body', ARGV[4], 'attempts', ARGV[5], 'owner', ARGV[7])
if ARGV[10] ~= '' then redis.call('HSET', KEYS[2], 'headers', ARGV[10]) end
redis.call('ZADD', KEYS[1], ARGV[6], ARGV[2])
redis.call('HINCRBY', KEYS[3], ARGV[7], 1)
redis.call('ZADD', ARGV[9] .. ARGV[7], ARGV[6], ARGV[2])
redis.call('ZADD', KEYS[4], 'LT', ARGV[6], ARGV[7])
return 1
"""

# KEYS: due, heads. ARGV: now, leased until, limit, per-owner cap ('' :
# none), notice key prefix, queue prefix, then (owner, in flight) pairs.
# Owners in head order; of each, up to its room. Each owner due and below
# its cap has a notice to give, so limit + the capped owners suffice. A
# notice whose hash is gone (settled meanwhile) leaves the indexes.
CLAIM = (
    _HEAD
    + """
local limit, cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local busy, capped = {}, 0
for i = 7, #ARGV, 2 do
  busy[ARGV[i]] = tonumber(ARGV[i + 1])
  if cap and busy[ARGV[i]] >= cap then capped = capped + 1 end
end
local owners = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, limit + capped)
local out = {}
for _, owner in ipairs(owners) do
  local room = limit - #out
  if cap then room = math.min(room, cap - (busy[owner] or 0)) end
  if room > 0 then
    local queue = ARGV[6] .. owner
    local ids = redis.call('ZRANGEBYSCORE', queue, '-inf', ARGV[1], 'LIMIT', 0, room)
    for _, id in ipairs(ids) do
      local n = redis.call('HMGET', ARGV[5] .. id, 'url', 'body', 'attempts', 'headers')
      if n[1] then
        redis.call('ZADD', queue, ARGV[2], id)
        redis.call('ZADD', KEYS[1], ARGV[2], id)
        table.insert(out, {id, n[1], n[2], n[3], owner, n[4] or ''})
      else
        redis.call('ZREM', queue, id)
        redis.call('ZREM', KEYS[1], id)
      end
    end
    head(KEYS[2], ARGV[6], owner)
  end
end
return out
"""
)

# KEYS: due, notice, owners, heads. ARGV: id, attempts, retry at ('' :
# gone), queue prefix.
SETTLE = (
    _HEAD
    + """
local owner = redis.call('HGET', KEYS[2], 'owner')
if ARGV[3] == '' then
  if redis.call('DEL', KEYS[2]) == 1 and owner then
    if redis.call('HINCRBY', KEYS[3], owner, -1) <= 0 then redis.call('HDEL', KEYS[3], owner) end
  end
  redis.call('ZREM', KEYS[1], ARGV[1])
  if owner then redis.call('ZREM', ARGV[4] .. owner, ARGV[1]) end
elseif owner then
  redis.call('HSET', KEYS[2], 'attempts', ARGV[2])
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  redis.call('ZADD', ARGV[4] .. owner, ARGV[3], ARGV[1])
end
if owner then head(KEYS[4], ARGV[4], owner) end
return 1
"""
)

# KEYS: due, heads, owners. ARGV: first rank, count, notice key prefix,
# queue prefix. Puts a page of ``due`` in its owners' queues (those not
# there yet); a notice whose hash is gone leaves ``due``. Returns {looked
# at, removed}.
ADOPT = """
local rows = redis.call('ZRANGE', KEYS[1], ARGV[1], tonumber(ARGV[1]) + tonumber(ARGV[2]) - 1,
                        'WITHSCORES')
local gone = 0
for i = 1, #rows, 2 do
  local id, due = rows[i], rows[i + 1]
  local notice = ARGV[3] .. id
  if redis.call('EXISTS', notice) == 0 then
    redis.call('ZREM', KEYS[1], id)
    gone = gone + 1
  else
    local owner = redis.call('HGET', notice, 'owner')
    if not owner then  -- from before owners: counted as the unnamed owner's
      owner = ''
      redis.call('HSET', notice, 'owner', owner)
      redis.call('HINCRBY', KEYS[3], owner, 1)
    end
    if not redis.call('ZSCORE', ARGV[4] .. owner, id) then
      redis.call('ZADD', ARGV[4] .. owner, due, id)
      redis.call('ZADD', KEYS[2], 'LT', due, owner)
    end
  end
end
return {#rows / 2, gone}
"""


@unavailable_when_down
class RedisOutbox:
    def __init__(self, client: Client) -> None:
        self._redis = client
        self._add = client.register_script(ADD)
        self._claim = client.register_script(CLAIM)
        self._settle = client.register_script(SETTLE)
        self._adopt = client.register_script(ADOPT)
        self._adopted = False

    async def add(self, delivery: Delivery, limit: int, owner_limit: int | None = None) -> bool:
        added = await self._add(
            keys=[DUE, NOTICE + delivery.id, OWNERS, HEADS],
            args=[
                limit,
                delivery.id,
                delivery.url,
                delivery.body,
                delivery.attempts,
                delivery.due,
                delivery.owner,
                "" if owner_limit is None else owner_limit,
                QUEUE,
                json.dumps(delivery.headers) if delivery.headers else "",
            ],
        )
        return bool(added)

    async def adopt(self) -> None:
        """Put the notices of the layout before per-owner queues in their
        owners' queues (once per process, before its first claim: at most
        ``max_pending`` of them, a page a script)."""
        rank = 0
        while True:
            looked, gone = await self._adopt(
                keys=[DUE, HEADS, OWNERS], args=[rank, ADOPT_PAGE, NOTICE, QUEUE]
            )
            if looked < ADOPT_PAGE:
                break
            rank += looked - gone  # those gone left the set: the next page is nearer
        self._adopted = True

    async def claim(
        self,
        now: float,
        lease_seconds: float,
        limit: int,
        busy: Mapping[str, int] | None = None,
        per_owner: int | None = None,
    ) -> list[Delivery]:
        if not self._adopted:
            await self.adopt()
        pairs = [str(v) for owner, n in (busy or {}).items() for v in (owner, n)]
        rows: list[Any] = await self._claim(
            keys=[DUE, HEADS],
            args=[
                now,
                now + lease_seconds,
                limit,
                "" if per_owner is None else per_owner,
                NOTICE,
                QUEUE,
                *pairs,
            ],
        )
        return [
            Delivery(
                row[0].decode(),
                row[1].decode(),
                row[2],
                int(row[3]),
                now + lease_seconds,
                row[4].decode(),
                json.loads(row[5]) if len(row) > 5 and row[5] else {},
            )
            for row in rows
        ]

    async def settle(self, delivery: Delivery, retry_at: float | None) -> None:
        await self._settle(
            keys=[DUE, NOTICE + delivery.id, OWNERS, HEADS],
            args=[delivery.id, delivery.attempts, "" if retry_at is None else retry_at, QUEUE],
        )

    async def next_due(self, skip: Collection[str] = ()) -> float | None:
        # Owners skipped come first at most len(skip) times.
        heads = cast(
            list[tuple[bytes, float]],
            await self._redis.zrange(HEADS, 0, len(skip), withscores=True),
        )
        return next((float(at) for owner, at in heads if owner.decode() not in skip), None)
