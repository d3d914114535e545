"""Receipt slots: a principal's requests are read a few at a time, in order;
other principals never wait for its slots; every slot comes back."""

from __future__ import annotations

import asyncio

import pytest

from turnmesh.runtime import receipts
from turnmesh.runtime.errors import RateLimited
from turnmesh.runtime.receipts import ReceiptSlots


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_key_holds_at_most_its_slots_and_the_next_waits_its_turn() -> None:
    slots = ReceiptSlots(2, hold_seconds=3600)
    first, second = await slots.acquire("a"), await slots.acquire("a")
    third = asyncio.create_task(slots.acquire("a"))
    fourth = asyncio.create_task(slots.acquire("a"))
    await _settle()
    assert not third.done() and not fourth.done() and slots.waiting == 2
    other = await slots.acquire("b")  # another key never waits for a's
    first.release()
    first.release()  # idempotent: gives back one slot, not two
    await _settle()
    assert third.done() and not fourth.done() and slots.waiting == 1
    second.release()
    (await third).release()
    (await fourth).release()
    other.release()
    assert len(slots) == 0 and slots.waiting == 0


async def test_too_many_waiting_are_refused_and_change_nothing() -> None:
    slots = ReceiptSlots(1, max_waiting=2, hold_seconds=3600)
    held = await slots.acquire("a")
    waiters = [asyncio.create_task(slots.acquire("a")) for _ in range(2)]
    await _settle()
    with pytest.raises(RateLimited) as refused:
        await slots.acquire("a")
    assert refused.value.metadata == {"limit": "requests_arriving"}
    assert slots.waiting == 2
    held.release()
    for waiter in waiters:
        (await waiter).release()
    assert len(slots) == 0


async def test_a_cancelled_waiter_leaves_no_trace() -> None:
    slots = ReceiptSlots(1, hold_seconds=3600)
    held = await slots.acquire("a")
    waiter = asyncio.create_task(slots.acquire("a"))
    await _settle()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert slots.waiting == 0
    held.release()
    assert len(slots) == 0
    (await slots.acquire("a")).release()


async def test_a_slot_held_too_long_is_handed_on() -> None:
    """A trickling sender keeps its slot for hold_seconds at most."""
    slots = ReceiptSlots(1, hold_seconds=0.01)
    await slots.acquire("a")  # never released by its holder
    (await asyncio.wait_for(slots.acquire("a"), timeout=60)).release()
    assert len(slots) == 0


def test_bad_settings_are_refused() -> None:
    for args in ({"per_key": 0}, {"max_waiting": -1}, {"hold_seconds": 0}):
        with pytest.raises(ValueError, match="per_key"):
            ReceiptSlots(**args)


async def test_a_call_keeps_its_slot_until_its_body_is_decoded() -> None:
    """A body parsed after it is read keeps the slot meanwhile (the next
    request waits unread); ``decoded`` gives it back, once, and only the
    current call's."""
    slots = ReceiptSlots(1, hold_seconds=3600)

    async def call() -> None:
        receipts.keep_until_decoded(await slots.acquire("a"))
        waiting = asyncio.create_task(slots.acquire("a"))
        await _settle()
        assert not waiting.done()  # the body is not decoded yet
        receipts.decoded()
        receipts.decoded()  # idempotent
        (await waiting).release()

    await asyncio.create_task(call())
    receipts.decoded()  # another task's slot is not this one's to give back
    assert len(slots) == 0 and slots.waiting == 0
