"""Token buckets per key: a burst, then a steady rate, refused at once."""

from __future__ import annotations

import pytest

from turnmesh.runtime.ratelimit import TokenBuckets


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_burst_then_rate_per_key() -> None:
    clock = Clock()
    buckets = TokenBuckets(2.0, burst=2.0, clock=clock)
    assert [buckets.take(b"a") for _ in range(2)] == [0.0, 0.0]
    assert buckets.take(b"a") == pytest.approx(0.5)
    assert buckets.take(b"b") == 0.0  # keys do not share
    clock.now = 0.5
    assert buckets.take(b"a") == 0.0
    assert buckets.take(b"a") > 0
    clock.now = 100.0
    assert [buckets.take(b"a") for _ in range(3)][:2] == [0.0, 0.0]  # capped at the burst


def test_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        TokenBuckets(0)
