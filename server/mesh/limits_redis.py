"""The Redis scripts behind ``mesh.limits`` (its docstring has the
key layout): loaded only by a server whose store is Redis."""

from __future__ import annotations

from turnmesh.server.stores.redis_client import Client, unavailable_when_down
from turnmesh.server.stores.redis_keys import tag

# KEYS: the principal's rate key. ARGV: interval between requests (us), burst.
# Returns 0 if the request may go (and counts it), else the microseconds until one may.
GCRA = """
local clock = redis.call('TIME')
local now = clock[1] * 1000000 + clock[2]
local interval = tonumber(ARGV[1])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local next_tat = tat + interval
local wait = next_tat - tonumber(ARGV[2]) * interval - now
if wait > 0 then return math.ceil(wait) end
redis.call('SET', KEYS[1], string.format('%.3f', next_tat),
           'PX', math.ceil((next_tat - now) / 1000))
return 0
"""

# The key lives as long as its longest lease.
_EXPIRE_WITH_LAST = """
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then redis.call('PEXPIREAT', KEYS[1], last[2]) end
"""

# KEYS: the principal's turn leases. ARGV: quota, ttl (ms), lease.
# 1: taken; 0: the principal's live leases fill its quota.
TAKE_TURN = (
    """
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
"""
    + _EXPIRE_WITH_LAST
    + "return 1\n"
)

# KEYS: the principal's turn leases. ARGV: ttl (ms), leases... XX: a lease
# that lapsed and was dropped (this server stalled) is not taken back.
RENEW_TURNS = (
    """
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[i])
end
"""
    + _EXPIRE_WITH_LAST
    + "return 1\n"
)


def rate_key(principal: str) -> str:
    return f"tm:l:{tag(principal)}:r"


def turns_key(principal: str) -> str:
    return f"tm:l:{tag(principal)}:t"


@unavailable_when_down
class RedisLimits:
    """The scripts, run on the store's client (Redis down: Unavailable)."""

    def __init__(self, client: Client) -> None:
        self._redis = client
        self._gcra = client.register_script(GCRA)
        self._take_turn = client.register_script(TAKE_TURN)
        self._renew_turns = client.register_script(RENEW_TURNS)

    async def wait(self, principal: str, rate: float, burst: float) -> float:
        """Take one request of the principal's rate: 0 if it may go, else
        the seconds until one may (nothing is taken then)."""
        wait_us = await self._gcra(keys=[rate_key(principal)], args=[repr(1e6 / rate), repr(burst)])
        return int(wait_us) / 1e6

    async def take_turn(self, principal: str, quota: int, ttl_ms: int, lease: str) -> bool:
        taken = await self._take_turn(keys=[turns_key(principal)], args=[quota, ttl_ms, lease])
        return bool(taken)

    async def renew_turns(self, principal: str, ttl_ms: int, leases: list[str]) -> None:
        await self._renew_turns(keys=[turns_key(principal)], args=[ttl_ms, *leases])

    async def drop_turn(self, principal: str, lease: str) -> None:
        await self._redis.zrem(turns_key(principal), lease)

    async def turns(self, principal: str) -> int:
        """The principal's leases, lapsed ones included until the next take."""
        return int(await self._redis.zcard(turns_key(principal)))
