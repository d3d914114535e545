"""The Redis store's key layout: the store and its layout moves name their
keys from here (and the mesh's limits their hash tags, ``tag``).

Every key of session S carries the hash tag ``{S'}`` (S with ``%``,
``{`` and ``}`` percent-escaped, so the encoding is injective), so all of a
session's keys live on one cluster slot and its scripts never cross slots:
``tm:{S'}:s`` (hash: the record, and ``owner``, the lease token of the server
that owns it), ``tm:{S'}:h`` (list: history, one protobuf per message),
``tm:{S'}:e:T`` (list: turn T's events, expiring), ``tm:{S'}:x:T`` (turn T's
commit status, expiring), ``tm:{S'}:k`` (hash: idempotency key -> turn),
``tm:{S'}:t`` (set: turns with events, for deletion), ``tm:{S'}:r:T`` (hash:
turn T's record and whether it says the turn ended, expiring on its own TTL),
``tm:{S'}:r`` (sorted set: the turns with records, by first write, to bound
and delete them). Turn ids come last, so ``S`` + ``T`` never reads another
session's keys.

Indexes that span sessions are sharded, each shard its own slot and written
beside (not inside) the per-session scripts: ``tm:idle:{N}`` (N in 0..15,
sorted sets of sessions by last activity; their total is the mesh-wide
session count), ``tm:p:{P#N'}`` (N in 0..7: principal P's sessions for
listing, sharded by the scoped id so one tenant's sessions spread over the
cluster; every score 0, members ``NANOS|ID``, creation time in Unix
nanoseconds as 20 digits and the public id, so lexical order is listing order
and ZREVRANGEBYLEX reads a keyset page), ``tm:m:{M'}`` (member M's lease: its
address, expiring), ``tm:a:{A'}`` (which member holds address A, expiring
with its lease); ``tm:l:{P}:r`` and ``tm:l:{P}:t`` are principal P's limits
shared by the mesh (``mesh.limits``). A create indexes its session before
its script runs and a delete unlists it after its keys are gone, so a crash
leaves an index entry without a session (skipped, and dropped in time), never
a session that is not listed or expired. ``tm:schema`` is the layout's
version (``SCHEMA_VERSION``; ``redis_migrate`` moves older ones).
"""

from __future__ import annotations

import zlib

from turnmesh.runtime.principals import principal_of
from turnmesh.server.stores.listing import Position, position

IDLE_SHARDS = 16
LISTING_SHARDS = 8
SCHEMA_KEY = "tm:schema"
SCHEMA_VERSION = 3


def tag(value: str) -> str:
    """``value`` as a hash tag: percent-escaped so that it holds no brace
    (which would end the tag early) and two values never share a tag."""
    escaped = value.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")
    return "{" + escaped + "}"


class Keys:
    """The keys of one session (all on the slot of its hash tag)."""

    __slots__ = (
        "_prefix",
        "checkpoint",
        "history",
        "key_times",
        "keys",
        "record",
        "turn_index",
        "turn_records",
        "turns",
    )

    def __init__(self, session_id: str) -> None:
        self._prefix = f"tm:{tag(session_id)}:"
        self.record = self._prefix + "s"
        self.history = self._prefix + "h"
        self.keys = self._prefix + "k"
        # When each idempotency key was written (to trim them by).
        self.key_times = self._prefix + "kw"
        # The turns with events (a set): written by servers of before the
        # index (no longer grown), read by deletes, which drop it.
        self.turns = self._prefix + "t"
        # The turns with events, by when they were last written.
        self.turn_index = self._prefix + "tw"
        self.turn_records = self._prefix + "r"
        # The agent's checkpoint of the session's pause (read when answered).
        self.checkpoint = self._prefix + "cp"

    def turn_record(self, turn_id: str) -> str:
        return f"{self._prefix}r:{turn_id}"

    def events(self, turn_id: str) -> str:
        return f"{self._prefix}e:{turn_id}"

    def status(self, turn_id: str) -> str:
        return f"{self._prefix}x:{turn_id}"


def idle_key(session_id: str) -> str:
    """The shard of the idle index that holds the session."""
    return f"tm:idle:{{{zlib.crc32(session_id.encode()) % IDLE_SHARDS}}}"


def listing_key(principal: str, shard: int) -> str:
    return f"tm:p:{tag(f'{principal}#{shard}')}"


def listing_key_of(session_id: str) -> str:
    """The shard of its principal's listing that holds the session."""
    shard = zlib.crc32(session_id.encode()) % LISTING_SHARDS
    return listing_key(principal_of(session_id), shard)


def listing_member(at: Position) -> str:
    # Fixed-width nanoseconds, then the id: byte order is position order.
    return f"{at[0]:020d}|{at[1]}"


def listing_entry(created_at: float, session_id: str) -> str:
    return listing_member(position(created_at, session_id))


def listed_position(member: bytes) -> Position:
    nanos, _, public = member.decode().partition("|")
    return (int(nanos), public)


def member_key(member_id: str) -> str:
    return f"tm:m:{tag(member_id)}"


def address_key(address: str) -> str:
    return f"tm:a:{tag(address)}"


# The turn records that do not say their turn ended, mesh-wide: members
# "SESSION\nTURN", scored by when they were first written.
OPEN_TURNS = "tm:{turns}:open"


def open_turn_member(session_id: str, turn_id: str) -> str:
    return f"{session_id}\n{turn_id}"
