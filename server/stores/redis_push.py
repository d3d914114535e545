"""The Redis store's A2A push notification configs (the contract is
``push_configs``): ``tm:{S'}:pn:T`` (a hash: task T's configs by id, expiring
``ttl_seconds`` after its last write) and ``tm:{S'}:pn`` (a sorted set: the
session's tasks with configs, by last write, to bound and delete them), on
the session's slot, so a put is one atomic script."""

from __future__ import annotations

import time
from typing import cast

from turnmesh.server.stores.push_configs import PUSH_TASKS_PER_SESSION, session_gone
from turnmesh.server.stores.redis_client import Client, unavailable_when_down
from turnmesh.server.stores.redis_keys import Keys, tag

# KEYS: the session's record, its index of tasks, the task's hash. ARGV:
# config id, config, limit, ttl (ms), now, task id, tasks kept, task hash
# prefix. -1: no session; 0: at the limit; 1: written.
PUT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 0
   and redis.call('HLEN', KEYS[3]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[3], ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[6])
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[7])
if over > 0 then
  for _, task in ipairs(redis.call('ZRANGE', KEYS[2], 0, over - 1)) do
    redis.call('DEL', ARGV[8] .. task)
  end
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, over - 1)
end
return 1
"""


def index_key(session_id: str) -> str:
    return f"tm:{tag(session_id)}:pn"


def task_key(session_id: str, task_id: str) -> str:
    return f"{index_key(session_id)}:{task_id}"


@unavailable_when_down
class RedisPushConfigs:
    def __init__(self, client: Client) -> None:
        self._redis = client
        self._put = client.register_script(PUT)

    async def put(
        self,
        session_id: str,
        task_id: str,
        config_id: str,
        config: bytes,
        *,
        limit: int,
        ttl_seconds: float,
    ) -> bool:
        written = await self._put(
            keys=[Keys(session_id).record, index_key(session_id), task_key(session_id, task_id)],
            args=[
                config_id,
                config,
                limit,
                max(1, int(ttl_seconds * 1000)),
                time.time(),
                task_id,
                PUSH_TASKS_PER_SESSION,
                index_key(session_id) + ":",
            ],
        )
        if int(written) < 0:
            raise session_gone(session_id)
        return bool(written)

    async def of_task(self, session_id: str, task_id: str) -> list[bytes]:
        kept = cast(dict[bytes, bytes], await self._redis.hgetall(task_key(session_id, task_id)))
        return [kept[k] for k in sorted(kept)]

    async def delete(self, session_id: str, task_id: str, config_id: str) -> bool:
        return bool(await self._redis.hdel(task_key(session_id, task_id), config_id))

    async def drop_session(self, session_id: str) -> None:
        """Every config of the session (its delete)."""
        tasks = cast(list[bytes], await self._redis.zrange(index_key(session_id), 0, -1))
        keys = [task_key(session_id, t.decode()) for t in tasks]
        await self._redis.delete(index_key(session_id), *keys)
