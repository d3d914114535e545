"""The webhook outbox in Redis: every server of the mesh delivers from it.

``tm:{webhooks}:due`` (a sorted set: notice id by when it is due) and
``tm:{webhooks}:n:ID`` (a hash: url, body, attempts), on one slot of a
cluster (the shared hash tag) so each step is one atomic script. A claim
moves a notice's due time past its lease: a server that dies holding it
leaves it due again after that, for any server to deliver.
"""

from __future__ import annotations

from typing import Any

from turnmesh.server.store_redis import Client, unavailable_when_down
from turnmesh.server.webhooks import Delivery

DUE = "tm:{webhooks}:due"
NOTICE = "tm:{webhooks}:n:"
# Notices waiting, by owner (the principal whose turn each tells of).
OWNERS = "tm:{webhooks}:owners"

# KEYS: due, notice, owners. ARGV: limit, id, url, body, attempts, due,
# owner, owner limit ('' : none). A notice kept already stays as it is.
ADD = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 1 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
if ARGV[8] ~= '' and tonumber(redis.call('HGET', KEYS[3], ARGV[7]) or '0') >= tonumber(ARGV[8]) then
  return 0
end
redis.call('HSET', KEYS[2], 'url', ARGV[3], 'body', ARGV[4], 'attempts', ARGV[5], 'owner', ARGV[7])
redis.call('ZADD', KEYS[1], ARGV[6], ARGV[2])
redis.call('HINCRBY', KEYS[3], ARGV[7], 1)
return 1
"""

# KEYS: due. ARGV: now, leased until, limit, notice key prefix. A notice
# whose hash is gone (settled meanwhile) leaves the index.
CLAIM = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])
local out = {}
for _, id in ipairs(ids) do
  local n = redis.call('HMGET', ARGV[4] .. id, 'url', 'body', 'attempts')
  if n[1] then
    redis.call('ZADD', KEYS[1], ARGV[2], id)
    table.insert(out, {id, n[1], n[2], n[3]})
  else
    redis.call('ZREM', KEYS[1], id)
  end
end
return out
"""

# KEYS: due, notice, owners. ARGV: id, attempts, retry at ('' : gone).
SETTLE = """
if ARGV[3] == '' then
  local owner = redis.call('HGET', KEYS[2], 'owner')
  if redis.call('DEL', KEYS[2]) == 1 and owner then
    if redis.call('HINCRBY', KEYS[3], owner, -1) <= 0 then redis.call('HDEL', KEYS[3], owner) end
  end
  redis.call('ZREM', KEYS[1], ARGV[1])
elseif redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HSET', KEYS[2], 'attempts', ARGV[2])
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
end
return 1
"""


@unavailable_when_down
class RedisOutbox:
    def __init__(self, client: Client) -> None:
        self._redis = client
        self._add = client.register_script(ADD)
        self._claim = client.register_script(CLAIM)
        self._settle = client.register_script(SETTLE)

    async def add(self, delivery: Delivery, limit: int, owner_limit: int | None = None) -> bool:
        added = await self._add(
            keys=[DUE, NOTICE + delivery.id, OWNERS],
            args=[
                limit,
                delivery.id,
                delivery.url,
                delivery.body,
                delivery.attempts,
                delivery.due,
                delivery.owner,
                "" if owner_limit is None else owner_limit,
            ],
        )
        return bool(added)

    async def claim(self, now: float, lease_seconds: float, limit: int) -> list[Delivery]:
        rows: list[Any] = await self._claim(
            keys=[DUE], args=[now, now + lease_seconds, limit, NOTICE]
        )
        return [
            Delivery(row[0].decode(), row[1].decode(), row[2], int(row[3]), now + lease_seconds)
            for row in rows
        ]

    async def settle(self, delivery: Delivery, retry_at: float | None) -> None:
        await self._settle(
            keys=[DUE, NOTICE + delivery.id, OWNERS],
            args=[delivery.id, delivery.attempts, "" if retry_at is None else retry_at],
        )

    async def next_due(self) -> float | None:
        first = await self._redis.zrange(DUE, 0, 0, withscores=True)
        return float(first[0][1]) if first else None
