"""SessionStore on Redis (one node or a Redis Cluster): shared by every
server, so a session survives the loss of its owner and a stream can be
resumed on any server.

Its key layout is in ``redis_keys``, its Lua scripts in ``redis_scripts``,
its connection in ``redis_client``; its webhook outbox is ``redis_outbox``,
its layout moves ``redis_migrate``.

Creating a session, committing a turn and taking a session over are Lua
scripts, each atomic on its slot: a commit to a deleted session cannot
resurrect it, and a commit whose lease token is no longer the session's owner
writes nothing (``TurnAbandoned``).
"""

from __future__ import annotations

import json
import time
from typing import cast

from turnmesh.runtime.errors import AlreadyExists, NotFound
from turnmesh.runtime.principals import ANONYMOUS, principal_of, public_id, scoped
from turnmesh.server.stores.base import (
    IDEMPOTENCY_KEYS_PER_SESSION,
    TURN_RECORDS_PER_SESSION,
    TURNS_INDEXED_PER_SESSION,
    SessionRecord,
    TurnAbandoned,
    TurnCommits,
    session_quota_exceeded,
)
from turnmesh.server.stores.listing import Page, Position, merge, position
from turnmesh.server.stores.redis_client import Client, connect, unavailable_when_down
from turnmesh.server.stores.redis_keys import (
    IDLE_SHARDS,
    LISTING_SHARDS,
    OPEN_TURNS,
    Keys,
    address_key,
    idle_key,
    listed_position,
    listing_entry,
    listing_key,
    listing_key_of,
    listing_member,
    member_key,
    open_turn_member,
)
from turnmesh.server.stores.redis_migrate import migrate
from turnmesh.server.stores.redis_outbox import RedisOutbox
from turnmesh.server.stores.redis_push import RedisPushConfigs
from turnmesh.server.stores.redis_scripts import (
    ABANDON,
    COMMIT,
    CREATE,
    PUT_TURN,
    SET_KEY,
    SWAP_OWNER,
    TOUCH,
)
from turnmesh.server.stores.redis_tasks import RedisTasks
from turnmesh.v1 import event_pb2, message_pb2

# An index entry is written just before what it indexes (another slot: no
# script spans both): a create's listing entry before its session, put_turn's
# open-turn entry before its record. One without it is dropped only once it
# is older than this (clocks may differ): a reader between the two writes
# must not drop it.
DANGLING_AFTER_SECONDS = 300
# Keys one DEL names at most (a session's turns' keys, deleted with it).
DELETE_BATCH = 1_000


@unavailable_when_down
class RedisStore(TurnCommits):
    def __init__(
        self, url: str, event_ttl_seconds: float, legacy_principal: str = ANONYMOUS
    ) -> None:
        self._redis = connect(url)
        self._legacy_principal = legacy_principal
        self._ttl = max(1, int(event_ttl_seconds))
        self._create = self._redis.register_script(CREATE)
        self._commit_script = self._redis.register_script(COMMIT)
        self._abandon_script = self._redis.register_script(ABANDON)
        self._swap_script = self._redis.register_script(SWAP_OWNER)
        self._touch_script = self._redis.register_script(TOUCH)
        self._put_turn_script = self._redis.register_script(PUT_TURN)
        self._set_key_script = self._redis.register_script(SET_KEY)
        self._tasks = RedisTasks(self._redis)

    @property
    def shared(self) -> bool:
        return True

    @property
    def client(self) -> Client:
        """The connection, for what else the mesh keeps in Redis (``mesh.limits``)."""
        return self._redis

    async def open(self) -> None:
        """Check the server answers and bring data of an older layout up to date."""
        await migrate(self._redis, self._legacy_principal)

    # Sessions ---------------------------------------------------------------

    async def create(
        self,
        record: SessionRecord,
        messages: list[message_pb2.Message] | None = None,
        quota: int | None = None,
    ) -> None:
        initial = list(messages or [])
        session_id = record.session_id
        keys = Keys(session_id)
        listed = listing_entry(record.created_at, session_id)
        # Indexed first: a crash in between leaves index entries without a
        # session (dropped at expiry, skipped by listings), never a session
        # nobody expires or lists.
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zadd(idle_key(session_id), {session_id: record.last_activity}, nx=True)
            pipe.zadd(listing_key_of(session_id), {listed: 0})
            idled, _ = await pipe.execute()
        # Listed, then counted: of creates racing at the quota, each counts
        # the others' entries, so they never pass it together (at worst all
        # of them are refused).
        if quota is not None and await self.count_of(principal_of(session_id)) > quota:
            await self._redis.zrem(listing_key_of(session_id), listed)
            if idled:
                await self._redis.zrem(idle_key(session_id), session_id)
            raise session_quota_exceeded(quota)
        created = await self._create(
            keys=[keys.record, keys.history],
            args=[
                record.agent_name,
                repr(record.created_at),
                repr(record.last_activity),
                json.dumps(record.metadata),
                len(initial),
                record.owner,
                record.pause,
                record.webhook_url,
                *(m.SerializeToString() for m in initial),
            ],
        )
        if not created:
            # Our entry is the existing session's too only if that one was
            # created at the same nanosecond: then it stays.
            existing = await self._redis.hget(keys.record, "created_at")
            if existing is None or listing_entry(float(existing), session_id) != listed:
                await self._redis.zrem(listing_key_of(session_id), listed)
            raise AlreadyExists(f"session {public_id(session_id)!r} already exists")
        record.message_count = len(initial)

    async def get(self, session_id: str) -> SessionRecord | None:
        fields = cast(dict[bytes, bytes], await self._redis.hgetall(Keys(session_id).record))
        return _record(session_id, fields)

    async def delete(self, session_id: str) -> bool:
        keys = Keys(session_id)
        # Out of the idle index first: a session made again under this id
        # between the two steps is indexed again by its create (ZADD NX), never lost.
        await self._redis.zrem(idle_key(session_id), session_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hget(keys.record, "created_at")
            pipe.zrange(keys.turn_index, 0, -1)
            pipe.smembers(keys.turns)  # a server of before the index wrote it
            pipe.zrange(keys.turn_records, 0, -1)
            created_at, indexed, listed, recorded = await pipe.execute()
        turns = {_text(t) for t in (*indexed, *listed)}
        turn_keys = [k for t in turns for k in (keys.events(t), keys.status(t))]
        turn_keys += [keys.turn_record(_text(t)) for t in recorded]
        # The session's own first, in one DEL (one slot: a multi-key DEL is
        # allowed on a cluster too); its turns' in bounded batches.
        deleted = await self._redis.delete(
            keys.record,
            keys.history,
            keys.keys,
            keys.key_times,
            keys.turns,
            keys.turn_index,
            keys.turn_records,
            keys.checkpoint,
        )
        for start in range(0, len(turn_keys), DELETE_BATCH):
            await self._redis.delete(*turn_keys[start : start + DELETE_BATCH])
        await self._tasks.delete(session_id)
        await self.push_configs().drop_session(session_id)
        if created_at is not None:
            # Unlisted once gone: a crash in between leaves an entry that
            # listings skip. A session made again under this id has another
            # creation time, so another entry, which this leaves alone.
            await self._redis.zrem(
                listing_key_of(session_id), listing_entry(float(created_at), session_id)
            )
        return bool(deleted)

    async def history(self, session_id: str, start: int = 0) -> list[message_pb2.Message]:
        keys = Keys(session_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.exists(keys.record)
            pipe.lrange(keys.history, start, -1)
            exists, rows = await pipe.execute()
        if not exists:
            raise NotFound(f"session {public_id(session_id)!r} not found")
        return [message_pb2.Message.FromString(r) for r in rows]

    async def _commit(
        self,
        session_id: str,
        messages: list[message_pb2.Message],
        final_event: event_pb2.Event | None,
        now: float,
        fence: str = "",
        pause: bytes | None = None,
        checkpoint: bytes | None = None,
    ) -> None:
        keys = Keys(session_id)
        turn_id = final_event.run_id if final_event is not None else ""
        committed = await self._commit_script(
            keys=[
                keys.record,
                keys.history,
                keys.events(turn_id),
                keys.turn_index,
                keys.status(turn_id),
                keys.turns,
                keys.checkpoint,
            ],
            args=[
                repr(now),
                self._ttl,
                final_event.SerializeToString() if final_event is not None else "",
                turn_id,
                fence,
                "keep" if pause is None else "set",
                pause or "",
                repr(time.time()),
                TURNS_INDEXED_PER_SESSION,
                "keep" if checkpoint is None else "set",
                checkpoint or "",
                *(m.SerializeToString() for m in messages),
            ],
        )
        if not committed:
            raise NotFound(f"session {public_id(session_id)!r} not found")
        if committed == 2:
            raise TurnAbandoned(turn_id)
        await self._active(session_id, now)

    async def checkpoint(self, session_id: str) -> bytes:
        stored = await self._redis.get(Keys(session_id).checkpoint)
        return cast(bytes, stored) if stored else b""

    async def abandon_turn(self, session_id: str, turn_id: str) -> bool:
        abandoned = await self._abandon_script(
            keys=[Keys(session_id).status(turn_id)], args=[self._ttl]
        )
        return bool(abandoned)

    async def touch(self, session_id: str, now: float) -> None:
        if await self._touch_script(keys=[Keys(session_id).record], args=[repr(now)]):
            await self._active(session_id, now)

    async def _active(self, session_id: str, now: float) -> None:
        """The session's new activity in the idle index, written after its
        script (its own slot, so never inside it). XX: a session deleted
        meanwhile is never re-added. Not pipelined with the script: redis-py
        checks a pipeline's scripts first (SCRIPT EXISTS), so a pipeline
        costs the same two round trips, and a cluster's cannot run scripts."""
        await self._redis.zadd(idle_key(session_id), {session_id: now}, xx=True)

    async def idle_sessions(self, last_activity_before: float) -> list[str]:
        # Servers of the old layout still running beside this one (a rolling
        # upgrade) write sessions there: move them too, each expiry pass.
        await self.open()
        found: list[str] = []
        for shard in range(IDLE_SHARDS):
            key = f"tm:idle:{{{shard}}}"
            rows = await self._redis.zrangebyscore(key, "-inf", f"({last_activity_before}")
            found += [_text(r) for r in rows]
        return found

    async def count(self) -> int:
        """Sessions in the whole mesh (every server shares this store)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for shard in range(IDLE_SHARDS):
                pipe.zcard(f"tm:idle:{{{shard}}}")
            counts: list[int] = await pipe.execute()
        return sum(counts)

    async def list_sessions(
        self, principal: str, before: Position | None, limit: int
    ) -> Page[SessionRecord]:
        if limit < 1:
            return Page([], None)
        high = "+" if before is None else "(" + listing_member(before)
        # Sessions spread evenly over the shards, so each is asked for twice
        # its share, not for the whole page: the merge keeps only what every
        # shard has covered, so a lopsided spread costs another call, never a
        # session.
        wanted = min(limit, 2 * -(-limit // LISTING_SHARDS) + 2)
        async with self._redis.pipeline(transaction=False) as pipe:
            for shard in range(LISTING_SHARDS):
                pipe.zrevrangebylex(listing_key(principal, shard), high, "-", start=0, num=wanted)
            shards: list[list[bytes]] = await pipe.execute()
        pages: list[Page[int]] = []
        for shard, rows in enumerate(shards):
            items = [(listed_position(row), shard) for row in rows]
            # A shard that returned less than asked for has nothing further.
            pages.append(Page(items, items[-1][0] if len(rows) == wanted else None))
        merged = merge(pages, limit)
        ids = [scoped(principal, at[1]) for at, _ in merged.items]
        async with self._redis.pipeline(transaction=False) as pipe:
            for session_id in ids:
                pipe.hgetall(Keys(session_id).record)
            records: list[dict[bytes, bytes]] = await pipe.execute()
        found: list[tuple[Position, SessionRecord]] = []
        stale = time.time() - DANGLING_AFTER_SECONDS
        for (at, shard), session_id, fields in zip(merged.items, ids, records, strict=True):
            record = _record(session_id, fields)
            # An entry names one session: a session made again under its id
            # (after a delete cut short) has an entry of its own.
            if record is not None and position(record.created_at, session_id) == at:
                found.append((at, record))
            elif at[0] < stale * 1e9:
                # Its delete (or create) stopped halfway. A younger entry may
                # be a create in flight: its session is written next.
                await self._redis.zrem(listing_key(principal, shard), listing_member(at))
        # The merge's frontier, not the count found: skipped entries do not
        # mean the listing is exhausted.
        return Page(found, merged.frontier)

    async def count_of(self, principal: str) -> int:
        """The principal's sessions in the whole mesh."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for shard in range(LISTING_SHARDS):
                pipe.zcard(listing_key(principal, shard))
            counts: list[int] = await pipe.execute()
        return sum(counts)

    # Events and keys ----------------------------------------------------------

    @property
    def persists_events(self) -> bool:
        return True

    async def append_events(
        self, session_id: str, turn_id: str, events: list[event_pb2.Event]
    ) -> None:
        keys = Keys(session_id)
        key = keys.events(turn_id)
        at = time.time()
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.rpush(key, *(e.SerializeToString() for e in events))
            pipe.expire(key, self._ttl)
            # Indexed for a delete, as the commit does (the index's bounds there).
            pipe.zadd(keys.turn_index, {turn_id: at})
            pipe.zremrangebyscore(keys.turn_index, "-inf", f"({at - self._ttl}")
            pipe.zremrangebyrank(keys.turn_index, 0, -TURNS_INDEXED_PER_SESSION - 1)
            await pipe.execute()

    async def read_events(self, session_id: str, turn_id: str) -> list[event_pb2.Event] | None:
        rows = await self._redis.lrange(Keys(session_id).events(turn_id), 0, -1)
        if not rows:
            return None
        return [event_pb2.Event.FromString(cast(bytes, r)) for r in rows]

    async def get_key(self, session_id: str, key: str) -> str | None:
        keys = Keys(session_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hget(keys.keys, key)
            pipe.zscore(keys.key_times, key)
            value, written = await pipe.execute()
        # One written by a server of before the times has none: still kept.
        if not value or (written is not None and written < time.time() - self._ttl):
            return None
        return _text(value)

    async def set_key(self, session_id: str, key: str, turn_id: str) -> None:
        keys = Keys(session_id)
        await self._set_key_script(
            keys=[keys.keys, keys.key_times],
            args=[key, turn_id, repr(time.time()), self._ttl, IDEMPOTENCY_KEYS_PER_SESSION],
        )

    async def put_turn(
        self, session_id: str, turn_id: str, record: bytes, *, ended: bool, ttl_seconds: float
    ) -> bool:
        keys = Keys(session_id)
        member = open_turn_member(session_id, turn_id)
        if not ended:
            # Indexed before the record is written (another slot: no script
            # spans both): an entry without an open record is dropped when
            # read, once older than DANGLING_AFTER_SECONDS.
            await self._redis.zadd(OPEN_TURNS, {member: time.time()}, nx=True)
        count = await self._put_turn_script(
            keys=[keys.record, keys.turn_record(turn_id), keys.turn_records],
            args=[
                record,
                "1" if ended else "0",
                max(1, int(ttl_seconds)),
                turn_id,
                int(time.time() * 1000),
            ],
        )
        if count > TURN_RECORDS_PER_SESSION:
            # Rare (a session past its bound): the oldest go, outside the
            # script, which names only the keys it is given.
            oldest = await self._redis.zrange(
                keys.turn_records, 0, count - TURN_RECORDS_PER_SESSION - 1
            )
            if oldest:
                await self._redis.delete(*(keys.turn_record(_text(t)) for t in oldest))
                await self._redis.zrem(keys.turn_records, *oldest)
        if ended or count < 0:
            await self._redis.zrem(OPEN_TURNS, member)
        return bool(count > 0)

    async def open_turns(
        self, limit: int, cursor: int = 0
    ) -> tuple[list[tuple[str, str]], int | None]:
        scored = cast(
            list[tuple[bytes, float]],
            await self._redis.zrange(OPEN_TURNS, cursor, cursor + limit - 1, withscores=True),
        )
        if not scored:
            return [], None
        keys = [_text(raw).partition("\n") for raw, _ in scored]
        async with self._redis.pipeline(transaction=False) as pipe:
            for session_id, _, turn_id in keys:
                pipe.hget(Keys(session_id).turn_record(turn_id), "ended")
            flags: list[bytes | None] = await pipe.execute()
        found: list[tuple[str, str]] = []
        stale: list[bytes] = []
        kept = 0
        young = time.time() - DANGLING_AFTER_SECONDS
        for (raw, indexed), (session_id, _, turn_id), ended in zip(
            scored, keys, flags, strict=True
        ):
            if ended == b"0":
                found.append((session_id, turn_id))
            elif ended is None and indexed > young:
                # Indexed a moment ago, its record still to be written
                # (put_turn indexes first): dropped now, it would never be
                # swept, and a notice that failed to queue never sent.
                kept += 1
            else:  # its record ended, expired or went with its session
                stale.append(raw)
        if stale:
            await self._redis.zrem(OPEN_TURNS, *stale)
        # The stale entries are gone: the next page starts that much sooner
        # (where this one did, if all were stale).
        more = len(scored) == limit
        return found, cursor + len(found) + kept if more else None

    async def put_task(
        self, session_id: str, task_id: str, record: bytes, created_at: float
    ) -> bool:
        return await self._tasks.put(session_id, task_id, record, created_at)

    async def get_task(self, session_id: str, task_id: str) -> bytes | None:
        return await self._tasks.get(session_id, task_id)

    async def list_tasks(
        self, principal: str, before: Position | None, limit: int
    ) -> Page[tuple[str, bytes]]:
        return await self._tasks.listed(principal, before, limit)

    def outbox(self) -> RedisOutbox:
        return RedisOutbox(self._redis)

    def push_configs(self) -> RedisPushConfigs:
        return RedisPushConfigs(self._redis)

    async def get_turn(self, session_id: str, turn_id: str) -> bytes | None:
        record = await self._redis.hget(Keys(session_id).turn_record(turn_id), "turn")
        return cast(bytes, record) if record else None

    # Leases ---------------------------------------------------------------------

    async def owner_of(self, session_id: str) -> str | None:
        """The session's owner token ("" if none); None if there is no session."""
        agent, owner = await self._redis.hmget(Keys(session_id).record, ["agent_name", "owner"])
        if agent is None:
            return None
        return _text(owner) if owner else ""

    async def owners_of(self, session_ids: list[str]) -> list[str | None]:
        """``owner_of`` for many sessions in one round trip (per node)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for session_id in session_ids:
                pipe.hget(Keys(session_id).record, "owner")
            rows: list[bytes | None] = await pipe.execute()
        return [_text(r) if r else None for r in rows]

    async def swap_owner(self, session_id: str, expected: str, new: str) -> bool | None:
        """Make ``new`` the owner if ``expected`` still is: True if swapped,
        False if the owner changed meanwhile, None if there is no session."""
        swapped = await self._swap_script(keys=[Keys(session_id).record], args=[expected, new])
        return None if swapped == -1 else bool(swapped)

    async def hold_member(self, member_id: str, address: str, ttl_ms: int) -> None:
        """Start or renew a member's lease (and its hold on its address)."""
        await self._redis.set(member_key(member_id), address, px=ttl_ms)
        await self._redis.set(address_key(address), member_id, px=ttl_ms)

    async def take_address(self, member_id: str, address: str, ttl_ms: int) -> str | None:
        """Hold ``address`` for this member; the member that held it before,
        if its hold had not lapsed (that process is gone: we bound its port)."""
        previous = await self._redis.set(address_key(address), member_id, px=ttl_ms, get=True)
        return _text(previous) if previous else None

    async def member_lease(self, member_id: str) -> tuple[str, float] | None:
        """The member's address and the seconds its lease has left; None
        once it lapsed."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(member_key(member_id))
            pipe.pttl(member_key(member_id))
            address, left_ms = await pipe.execute()
        if not address or left_ms < 0:
            return None
        return _text(address), left_ms / 1000

    async def drop_member(self, member_id: str) -> None:
        """End a member's lease now (it is leaving): its sessions can be taken."""
        await self._redis.delete(member_key(member_id))

    async def close(self) -> None:
        await self._redis.aclose()


def _record(session_id: str, fields: dict[bytes, bytes]) -> SessionRecord | None:
    """A session's record from its hash (None if empty: no session)."""
    if not fields:
        return None
    return SessionRecord(
        session_id=session_id,
        agent_name=fields[b"agent_name"].decode(),
        created_at=float(fields[b"created_at"]),
        last_activity=float(fields[b"last_activity"]),
        metadata=json.loads(fields[b"metadata"]),
        message_count=int(fields[b"message_count"]),
        owner=fields.get(b"owner", b"").decode(),
        pause=fields.get(b"pause", b""),
        webhook_url=fields.get(b"webhook_url", b"").decode(),
    )


def _text(value: object) -> str:
    """A Redis reply as text (this client returns bytes: decode_responses is off)."""
    assert isinstance(value, bytes)
    return value.decode()
