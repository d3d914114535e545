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


def test_buckets_are_bounded_and_forget_the_least_recently_used() -> None:
    clock = Clock()
    buckets = TokenBuckets(1.0, burst=1.0, clock=clock, max_keys=3)
    for key in (b"a", b"b", b"c"):
        assert buckets.take(key) == 0.0
    assert buckets.take(b"a") > 0  # a is now the most recently used
    for n in range(1000):  # a principal per request: the dict stays at its bound
        buckets.take(f"k{n}".encode())
        assert len(buckets) <= 3
    assert buckets.take(b"k999") > 0  # kept: used last
    # b went long ago: it starts full again (as it would have refilled).
    assert buckets.take(b"b") == 0.0


def test_a_forgotten_bucket_that_had_refilled_changes_nothing() -> None:
    clock = Clock()
    buckets = TokenBuckets(1.0, burst=2.0, clock=clock, max_keys=1)
    assert buckets.take(b"a") == 0.0
    clock.now = 10.0  # a refilled (burst / rate = 2 s)
    assert buckets.take(b"b") == 0.0  # pushes a out
    assert [buckets.take(b"a") for _ in range(3)][:2] == [0.0, 0.0]


async def test_admit_is_take() -> None:
    buckets = TokenBuckets(1.0, clock=lambda: 0.0)
    assert await buckets.admit(b"a") == 0.0
    assert await buckets.admit(b"a") == pytest.approx(1.0)


def test_max_keys_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        TokenBuckets(1.0, max_keys=0)
