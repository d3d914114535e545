"""Per-key request rates: a token bucket per API key.

Hand-written: a dozen lines that live inside the auth interceptor; the
asyncio rate-limit libraries wait for capacity, but a server must refuse
at once (HTTP 429) rather than hold the request. A mesh on Redis shares one
bucket per principal across servers instead (``server.mesh.limits``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

# Buckets kept at most: past it the least recently used goes (one idle for
# burst/rate seconds is full again, so forgetting it changes nothing).
MAX_KEYS = 100_000


class RequestRates(Protocol):
    """What the API-key interceptor asks before letting a call in."""

    @property
    def rate(self) -> float: ...

    async def admit(self, key: bytes) -> float:
        """0 if a request may go now; else the seconds until one may."""
        ...


class TokenBuckets:
    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = MAX_KEYS,
    ) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        if max_keys < 1:
            raise ValueError("max_keys must be positive")
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, rate)
        self._clock = clock
        self._max_keys = max_keys
        # key -> (tokens, at), least recently used first.
        self._buckets: dict[bytes, tuple[float, float]] = {}

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: bytes) -> float:
        """0 if a request may go now; else the seconds until one may."""
        now = self._clock()
        tokens, at = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        wait = 0.0
        if tokens >= 1:
            tokens -= 1
        else:
            wait = (1 - tokens) / self.rate
        self._buckets[key] = (tokens, now)  # re-inserted: now the most recent
        if len(self._buckets) > self._max_keys:
            del self._buckets[next(iter(self._buckets))]
        return wait

    async def admit(self, key: bytes) -> float:
        return self.take(key)
