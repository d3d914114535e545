"""The Redis client every Redis-backed part of a server shares (the store,
its webhook outbox and layout moves, the mesh's limits): ``connect`` makes
one from a URL, and ``unavailable_when_down`` turns Redis being unreachable
or refusing service into ``Unavailable`` on a class's calls.
"""

from __future__ import annotations

import logging
from typing import Any

import redis.asyncio as redis
from redis import exceptions
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from turnmesh.runtime.errors import Unavailable
from turnmesh.server.stores._guard import translating

# Redis refusing service (auth, protected mode, loading, a read-only replica,
# a cluster that is down or resharding, out of memory): redis-py raises these
# classes (with the code cut from the message), or a plain ResponseError whose
# message starts with the code.
REFUSED = (
    exceptions.AuthenticationError,
    exceptions.AuthorizationError,
    exceptions.NoPermissionError,
    exceptions.BusyLoadingError,
    exceptions.ReadOnlyError,
    exceptions.MasterDownError,
    exceptions.ClusterDownError,
    exceptions.TryAgainError,
    exceptions.OutOfMemoryError,
)
REFUSALS = (
    "DENIED",
    "NOAUTH",
    "WRONGPASS",
    "NOPERM",
    "LOADING",
    "READONLY",
    "MASTERDOWN",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "OOM",
)
Client = redis.Redis | RedisCluster
log = logging.getLogger(__name__)


def _translated(exc: Exception) -> Exception | None:
    """Redis unreachable or refusing us: Unavailable (a retryable 503)."""
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, redis.ResponseError)):
        refused = isinstance(exc, REFUSED) or str(exc).startswith(REFUSALS)
        if isinstance(exc, redis.ResponseError) and not refused:
            return None  # our own mistake (a script error): internal, logged as such
        log.warning("the session store failed: %s", type(exc).__name__)
        return Unavailable("the session store is unavailable")
    if isinstance(exc, (RedisClusterException, exceptions.ClusterError)):
        log.warning("the session store's cluster failed: %s", exc)
        return Unavailable("the session store is unavailable")
    return None


# Every public coroutine of a Redis store class (inherited ones too:
# commit_turn and append_messages come from TurnCommits) translates so.
unavailable_when_down = translating(_translated)


def connect(url: str) -> Client:
    """A client for ``redis://``, ``rediss://`` or ``redis+cluster://`` (a
    Redis Cluster, found from any one of its nodes)."""
    # Bounded waits: a Redis behind a cut link must fail calls, not hang them.
    timeouts: dict[str, Any] = {"socket_timeout": 10, "socket_connect_timeout": 5}
    if url.startswith(("redis+cluster://", "rediss+cluster://")):
        plain = url.replace("+cluster://", "://", 1)
        return RedisCluster.from_url(plain, **timeouts)
    return redis.Redis.from_url(url, **timeouts)
