"""SessionStore on Redis: shared by every server, so a session survives the
loss of its owner and a stream can be resumed on any server.

Keys, per session S: ``tm:s:S`` (hash: the record), ``tm:h:S`` (list: history,
one protobuf per message, appended with RPUSH), ``tm:e:S:TURN`` (list: the
turn's events, expiring), ``tm:k:S`` (hash: idempotency key -> turn),
``tm:t:S`` (set: turns with events, for deletion); ``tm:idle`` (sorted set by
last activity). Creating a session and committing a turn are Lua scripts, so
each is atomic and a commit to a deleted session cannot resurrect it.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import redis.asyncio as redis

from turnmesh.runtime.errors import AlreadyExists, NotFound, Unavailable
from turnmesh.server.store import SessionRecord, TurnAbandoned, TurnCommits
from turnmesh.v1 import event_pb2, message_pb2

IDLE = "tm:idle"
# Redis refusing service (auth, protected mode, loading, a read-only replica).
REFUSALS = ("DENIED", "NOAUTH", "WRONGPASS", "LOADING", "READONLY", "MASTERDOWN")
T = TypeVar("T")
log = logging.getLogger(__name__)

# KEYS: record, history, idle. ARGV: id, agent, created, activity, metadata, n, messages...
CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'agent_name', ARGV[2], 'created_at', ARGV[3],
           'last_activity', ARGV[4], 'metadata', ARGV[5], 'message_count', ARGV[6])
for i = 7, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
return 1
"""

# KEYS: record, history, idle, events, turns, turn status.
# ARGV: id, activity, ttl, final event or '', turn, messages...
COMMIT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[4] ~= '' then
  if redis.call('GET', KEYS[6]) == 'abandoned' then return 2 end
  redis.call('SET', KEYS[6], 'committed', 'EX', ARGV[3])
end
for i = 6, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
redis.call('HINCRBY', KEYS[1], 'message_count', #ARGV - 5)
redis.call('HSET', KEYS[1], 'last_activity', ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
if ARGV[4] ~= '' then
  redis.call('RPUSH', KEYS[4], ARGV[4])
  redis.call('EXPIRE', KEYS[4], ARGV[3])
  redis.call('SADD', KEYS[5], ARGV[5])
end
return 1
"""


# KEYS: turn status. ARGV: ttl. 1: abandoned (now or before), 0: committed.
ABANDON = """
local status = redis.call('GET', KEYS[1])
if status == 'committed' then return 0 end
redis.call('SET', KEYS[1], 'abandoned', 'EX', ARGV[1])
return 1
"""


def _unavailable_when_down(cls: type[T]) -> type[T]:
    """Every public coroutine of ``cls`` turns Redis being unreachable or
    refusing us into Unavailable (a retryable 503), not an internal error."""
    for name, member in list(vars(cls).items()):
        if name.startswith("_") or not inspect.iscoroutinefunction(member):
            continue

        def wrap(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            @functools.wraps(method)
            async def guarded(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await method(*args, **kwargs)
                except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError) as exc:
                    if isinstance(exc, redis.ResponseError) and not str(exc).startswith(REFUSALS):
                        raise  # our own mistake (a script error): internal, logged as such
                    log.warning("the session store failed: %s", type(exc).__name__)
                    raise Unavailable("the session store is unavailable") from exc

            return guarded

        setattr(cls, name, wrap(member))
    return cls


@_unavailable_when_down
class RedisStore(TurnCommits):
    def __init__(self, url: str, event_ttl_seconds: float) -> None:
        # Bounded waits: a Redis behind a cut link must fail calls, not hang them.
        self._redis = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
        self._ttl = max(1, int(event_ttl_seconds))
        self._create = self._redis.register_script(CREATE)
        self._commit_script = self._redis.register_script(COMMIT)
        self._abandon_script = self._redis.register_script(ABANDON)

    @staticmethod
    def _keys(session_id: str) -> tuple[str, str]:
        return f"tm:s:{session_id}", f"tm:h:{session_id}"

    async def create(
        self, record: SessionRecord, messages: list[message_pb2.Message] | None = None
    ) -> None:
        initial = list(messages or [])
        record_key, history_key = self._keys(record.session_id)
        created = await self._create(
            keys=[record_key, history_key, IDLE],
            args=[
                record.session_id,
                record.agent_name,
                repr(record.created_at),
                repr(record.last_activity),
                json.dumps(record.metadata),
                len(initial),
                *(m.SerializeToString() for m in initial),
            ],
        )
        if not created:
            raise AlreadyExists(f"session {record.session_id!r} already exists")
        record.message_count = len(initial)

    async def get(self, session_id: str) -> SessionRecord | None:
        fields = cast(dict[bytes, bytes], await self._redis.hgetall(self._keys(session_id)[0]))
        if not fields:
            return None
        return SessionRecord(
            session_id=session_id,
            agent_name=fields[b"agent_name"].decode(),
            created_at=float(fields[b"created_at"]),
            last_activity=float(fields[b"last_activity"]),
            metadata=json.loads(fields[b"metadata"]),
            message_count=int(fields[b"message_count"]),
        )

    async def delete(self, session_id: str) -> bool:
        record_key, history_key = self._keys(session_id)
        turns = await self._redis.smembers(f"tm:t:{session_id}")
        event_keys = [f"tm:e:{session_id}:{_text(t)}" for t in turns]
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(record_key, history_key, f"tm:k:{session_id}", f"tm:t:{session_id}")
            if event_keys:
                pipe.delete(*event_keys)
            pipe.zrem(IDLE, session_id)
            results: list[Any] = await pipe.execute()
        return bool(results[0])

    async def history(self, session_id: str, start: int = 0) -> list[message_pb2.Message]:
        record_key, history_key = self._keys(session_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.exists(record_key)
            pipe.lrange(history_key, start, -1)
            exists, rows = await pipe.execute()
        if not exists:
            raise NotFound(f"session {session_id!r} not found")
        return [message_pb2.Message.FromString(r) for r in rows]

    async def _commit(
        self,
        session_id: str,
        messages: list[message_pb2.Message],
        final_event: event_pb2.Event | None,
        now: float,
    ) -> None:
        record_key, history_key = self._keys(session_id)
        turn_id = final_event.run_id if final_event is not None else ""
        committed = await self._commit_script(
            keys=[
                record_key,
                history_key,
                IDLE,
                f"tm:e:{session_id}:{turn_id}",
                f"tm:t:{session_id}",
                f"tm:ts:{session_id}:{turn_id}",
            ],
            args=[
                session_id,
                repr(now),
                self._ttl,
                final_event.SerializeToString() if final_event is not None else "",
                turn_id,
                *(m.SerializeToString() for m in messages),
            ],
        )
        if not committed:
            raise NotFound(f"session {session_id!r} not found")
        if committed == 2:
            raise TurnAbandoned(turn_id)

    async def abandon_turn(self, session_id: str, turn_id: str) -> bool:
        abandoned = await self._abandon_script(
            keys=[f"tm:ts:{session_id}:{turn_id}"], args=[self._ttl]
        )
        return bool(abandoned)

    async def touch(self, session_id: str, now: float) -> None:
        record_key, _ = self._keys(session_id)
        if await self._redis.exists(record_key):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hset(record_key, "last_activity", repr(now))
                pipe.zadd(IDLE, {session_id: now})
                await pipe.execute()

    async def idle_sessions(self, last_activity_before: float) -> list[str]:
        rows = await self._redis.zrangebyscore(IDLE, "-inf", f"({last_activity_before}")
        return [_text(r) for r in rows]

    async def count(self) -> int:
        return int(await self._redis.zcard(IDLE))

    @property
    def persists_events(self) -> bool:
        return True

    async def append_events(
        self, session_id: str, turn_id: str, events: list[event_pb2.Event]
    ) -> None:
        key = f"tm:e:{session_id}:{turn_id}"
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.rpush(key, *(e.SerializeToString() for e in events))
            pipe.expire(key, self._ttl)
            pipe.sadd(f"tm:t:{session_id}", turn_id)
            await pipe.execute()

    async def read_events(self, session_id: str, turn_id: str) -> list[event_pb2.Event] | None:
        rows = await self._redis.lrange(f"tm:e:{session_id}:{turn_id}", 0, -1)
        if not rows:
            return None
        return [event_pb2.Event.FromString(cast(bytes, r)) for r in rows]

    async def get_key(self, session_id: str, key: str) -> str | None:
        value = await self._redis.hget(f"tm:k:{session_id}", key)
        return _text(value) if value else None

    async def set_key(self, session_id: str, key: str, turn_id: str) -> None:
        await self._redis.hset(f"tm:k:{session_id}", key, turn_id)

    async def close(self) -> None:
        await self._redis.aclose()


def _text(value: object) -> str:
    """A Redis reply as text (this client returns bytes: decode_responses is off)."""
    assert isinstance(value, bytes)
    return value.decode()
