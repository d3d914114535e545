"""Per-key request rates: a token bucket per API key.

Hand-written: a dozen lines that live inside the auth interceptor; the
asyncio rate-limit libraries wait for capacity, but a server must refuse
at once (HTTP 429) rather than hold the request.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBuckets:
    def __init__(
        self, rate: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, rate)
        self._clock = clock
        self._buckets: dict[bytes, tuple[float, float]] = {}  # key -> (tokens, at)

    def take(self, key: bytes) -> float:
        """0 if a request may go now; else the seconds until one may."""
        now = self._clock()
        tokens, at = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if tokens >= 1:
            self._buckets[key] = (tokens - 1, now)
            return 0.0
        self._buckets[key] = (tokens, now)
        return (1 - tokens) / self.rate
