"""Per-principal limits shared by every server of a mesh on Redis.

With a Redis store, a principal's request rate and its turns running or
waiting are counted in Redis, so ``--rate-limit`` and
``--max-turns-per-principal`` hold for the whole mesh, not per server (its
sessions are counted from the store's per-principal index already:
``count_of``). Every key of principal P carries the hash tag ``{P}``, so its
counters share one cluster slot and each script touches one key:

- ``tm:l:{P}:r`` (string): the request rate, by GCRA: the theoretical arrival
  time of the next request, in microseconds of Redis's clock (``TIME``, so
  servers' clocks never matter), expiring once the bucket is full again. One
  EVAL reads and moves it, so two servers can never both spend the last token.
  It is a token bucket (rate R, burst B) in one number: the same answers as
  ``runtime.ratelimit.TokenBuckets``.
- ``tm:l:{P}:t`` (sorted set): one lease per turn running or waiting, scored
  by when it lapses (milliseconds, Redis's clock). A server renews its own
  every quarter of ``--lease-seconds`` and drops each as its turn ends, so the
  turns of a server that crashed stop counting once their leases lapse: no
  counter can leak.

Hand-written: the Redis rate-limit libraries either offer windows of whole
requests per whole seconds (``limits``; not a bucket with a fractional rate),
keep a log per request (``pyrate-limiter``'s sorted sets), or open their own
connections with key layouts of their own; a GCRA is one short script on the
store's own client, cluster and error handling included, and a turn quota
with leases exists in none of them.

When Redis does not answer, turn leases (like the store) fail closed: 503,
retryable. Request rates fall back to each server's own bucket at the same
rate (logged, and counted in ``turnmesh_rate_limit_fallbacks_total``), so a
mesh of N servers admits at most N times the rate until Redis is back: the
limit still sheds load, and the calls a server can serve without Redis
(following a turn it runs) go on.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from turnmesh.runtime import metrics
from turnmesh.runtime.errors import Unavailable
from turnmesh.runtime.ratelimit import RequestRates, TokenBuckets
from turnmesh.runtime.renewal import Renewal
from turnmesh.server.stores.base import SessionStore

if TYPE_CHECKING:
    from turnmesh.server.mesh.limits_redis import RedisLimits

log = logging.getLogger(__name__)

# After Redis failed a rate check, how long each server limits alone before
# asking Redis again (a Redis that times out is not waited on per call).
RETRY_SECONDS = 1.0


def redis_limits(store: SessionStore) -> RedisLimits | None:
    """Limits shared through the store's Redis; None for stores of one server.
    Redis's modules load only for a Redis store (a fifth of a server's start)."""
    if "turnmesh.server.stores.redis" not in sys.modules:
        return None  # no store of this process can be a RedisStore
    from turnmesh.server.mesh.limits_redis import RedisLimits
    from turnmesh.server.stores.redis import RedisStore

    return RedisLimits(store.client) if isinstance(store, RedisStore) else None


def request_rates(
    store: SessionStore, rate: float | None, burst: float | None = None
) -> RequestRates | None:
    """``--rate-limit`` per principal: the mesh's on Redis, else this server's."""
    if rate is None:
        return None
    limits = redis_limits(store)
    return MeshRates(limits, rate, burst) if limits is not None else TokenBuckets(rate, burst)


class MeshRates:
    """One token bucket per principal for the whole mesh, in Redis; this
    server's own buckets while Redis does not answer."""

    def __init__(
        self,
        limits: RedisLimits,
        rate: float,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limits = limits
        self._local = TokenBuckets(rate, burst, clock)
        self._clock = clock
        self._alone_until: float | None = None  # set while Redis is failing us

    @property
    def rate(self) -> float:
        return self._local.rate

    async def admit(self, key: bytes) -> float:
        if self._alone_until is None or self._clock() >= self._alone_until:
            try:
                wait = await self._limits.wait(key.decode(), self._local.rate, self._local.burst)
            except Unavailable:
                if self._alone_until is None:
                    log.warning(
                        "shared rate limits unreachable: this server limits each principal"
                        " alone until Redis answers"
                    )
                self._alone_until = self._clock() + RETRY_SECONDS
            else:
                if self._alone_until is not None:
                    log.info("shared rate limits answer again")
                    self._alone_until = None
                return wait
        metrics.RATE_LIMIT_FALLBACKS.inc()
        return self._local.take(key)


class TurnLease:
    """One turn's place in its principal's quota, until ``release``."""

    def __init__(self, leases: TurnLeases, principal: str, lease: str) -> None:
        self._leases = leases
        self.principal = principal
        self.lease = lease
        self._released = False

    def release(self) -> None:
        """The turn ended (or never started): its place frees now. Never
        awaits; if Redis misses the drop, the lease lapses by itself."""
        if not self._released:
            self._released = True
            self._leases.forget(self)


class TurnLeases:
    """This server's turn leases: taken against the principal's quota in the
    whole mesh, renewed while their turns last, dropped as they end."""

    def __init__(self, limits: RedisLimits, member_id: str, lease_seconds: float) -> None:
        self._limits = limits
        self._member_id = member_id
        self._ttl_ms = max(1, int(lease_seconds * 1000))
        # principal -> leases held here (at most the turns running or waiting here).
        self._held: dict[str, set[str]] = {}
        self._drops: set[asyncio.Task[None]] = set()
        self._renewal = Renewal(
            self.renew,
            lease_seconds / 4,
            name="turn-leases",
            log=log,
            failing="could not renew turn leases; retrying",
        )

    async def take(self, principal: str, quota: int) -> TurnLease | None:
        """A lease for one more turn of the principal; None if its quota is full."""
        lease = f"{self._member_id}|{secrets.token_hex(8)}"
        if not await self._limits.take_turn(principal, quota, self._ttl_ms, lease):
            return None
        self._held.setdefault(principal, set()).add(lease)
        return TurnLease(self, principal, lease)

    def forget(self, lease: TurnLease) -> None:
        held = self._held.get(lease.principal)
        if held is not None:
            held.discard(lease.lease)
            if not held:
                del self._held[lease.principal]
        task = asyncio.create_task(self._drop(lease), name="turn-lease-drop")
        self._drops.add(task)
        task.add_done_callback(self._drops.discard)

    async def _drop(self, lease: TurnLease) -> None:
        try:
            await self._limits.drop_turn(lease.principal, lease.lease)
        except Exception:  # Redis down or closing: it lapses by itself
            log.debug("turn lease %s lapses by itself", lease.lease, exc_info=True)

    async def renew(self) -> None:
        for principal, held in list(self._held.items()):
            await self._limits.renew_turns(principal, self._ttl_ms, sorted(held))

    def start(self) -> None:
        self._renewal.start()

    async def stop(self) -> None:
        """Stop renewing; wait for the drops in flight (turns ended first)."""
        await self._renewal.stop()
        if self._drops:
            await asyncio.gather(*self._drops, return_exceptions=True)


def turn_leases(
    store: SessionStore, member_id: str, lease_seconds: float, quota: int | None
) -> TurnLeases | None:
    """Turn leases when the turn quota is the mesh's (Redis and a quota)."""
    limits = redis_limits(store)
    if limits is None or quota is None:
        return None
    return TurnLeases(limits, member_id, lease_seconds)
