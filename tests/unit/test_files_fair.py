"""The fair file queue: which waiting file gets the next reader slot, the
bounds on waiting, and leaving the queue. Driven step by step (enter, leave),
so the order of grants is exact: no timing, no real readers."""

from __future__ import annotations

import asyncio
import math

import pytest

from tests.support.mesh import until
from turnmesh.files import Sandbox
from turnmesh.files.fair import FairLimits, FairScheduler, QueueFull, Ticket


class Files:
    """Tickets by name, and the order the scheduler granted them in."""

    def __init__(self, scheduler: FairScheduler) -> None:
        self.scheduler = scheduler
        self.tickets: dict[str, Ticket] = {}
        self.granted: list[str] = []

    def enter(self, principal: str, turn: str, *names: str, size: int = 1) -> None:
        for name in names:
            self.tickets[name] = self.scheduler.enter(principal, turn, size)
        self._note()

    def finish(self, name: str) -> None:
        assert self.tickets[name].granted, f"{name} finished before it had a slot"
        self.scheduler.leave(self.tickets[name])
        self._note()

    def running(self) -> list[str]:
        return [n for n, t in self.tickets.items() if t.granted and not t.left]

    def drain(self) -> list[str]:
        """Finish the oldest running file until none is left; the grant order."""
        while running := self.running():
            self.finish(min(running, key=self.granted.index))
        return self.granted

    def _note(self) -> None:
        for name, ticket in self.tickets.items():
            if ticket.granted and name not in self.granted:
                self.granted.append(name)


def files(slots: int, **limits: int) -> Files:
    return Files(FairScheduler(FairLimits(slots=slots, **limits)))


async def test_principals_take_turns_for_one_slot() -> None:
    f = files(1)
    f.enter("alice", "a", "a1", "a2", "a3")
    f.enter("bob", "b", "b1")
    f.enter("carol", "c", "c1", "c2")
    assert f.granted == ["a1"]  # the slot was free
    assert f.drain() == ["a1", "b1", "c1", "a2", "c2", "a3"]
    assert f.scheduler.waiting == 0


async def test_a_principals_turns_take_turns_and_each_turn_keeps_its_order() -> None:
    f = files(1)
    f.enter("alice", "t1", "t1-1", "t1-2", "t1-3")
    f.enter("alice", "t2", "t2-1", "t2-2")
    f.enter("bob", "t3", "t3-1")
    # Bob first (alice was just served), then alice's turns alternate, FIFO within each.
    assert f.drain() == ["t1-1", "t3-1", "t2-1", "t1-2", "t2-2", "t1-3"]


async def test_a_newcomer_gets_the_next_free_slot_and_a_big_turn_keeps_half() -> None:
    f = files(4)
    big = [f"big{n}" for n in range(10)]
    f.enter("alice", "big", *big)
    assert f.running() == big[:4]  # alone, it takes every slot
    f.enter("bob", "small", "s1", "s2", "s3")
    assert f.running() == big[:4]  # nothing running is taken away
    f.finish("big0")
    assert f.running() == ["big1", "big2", "big3", "s1"]
    f.finish("big1")
    assert f.running() == ["big2", "big3", "s1", "s2"]
    # From here on the big turn holds ceil(4 / 2) slots while the small one waits.
    f.finish("big2")
    assert f.running() == ["big3", "big4", "s1", "s2"]
    f.finish("s1")
    assert f.running() == ["big3", "big4", "s2", "s3"]
    assert f.drain()[-5:] == big[5:]
    assert f.granted.index("s3") < f.granted.index("big5")


async def test_one_principal_with_many_turns_gets_one_share() -> None:
    f = files(2)
    f.enter("alice", "a1", "a1-1", "a1-2")
    f.enter("alice", "a2", "a2-1", "a2-2")
    f.enter("alice", "a3", "a3-1", "a3-2")
    f.enter("bob", "b", "b1", "b2")
    f.finish("a1-1")
    f.finish("a1-2")
    # Bob holds one of the two slots, not one in four.
    assert f.running() == ["a2-1", "b1"]
    f.finish("a2-1")
    assert f.running() == ["a3-1", "b1"]  # alice's other turn, not bob's second file
    f.finish("b1")
    assert f.running() == ["a3-1", "b2"]


async def test_no_slot_idles_while_a_file_waits() -> None:
    f = files(3)
    f.enter("alice", "a", "a1", "a2", "a3", "a4", "a5")
    assert f.running() == ["a1", "a2", "a3"]
    assert f.scheduler.waiting == 2
    f.finish("a2")
    assert f.running() == ["a1", "a3", "a4"]


@pytest.mark.parametrize(
    ("limits", "who", "size", "limit"),
    [
        ({"turn_files": 2}, "alice", 100, "turn"),
        ({"turn_bytes": 250}, "alice", 100, "turn"),
        ({"queue_files": 4}, "alice", 100, "principal"),  # alice may hold 2 of 4
        ({"queue_bytes": 500}, "alice", 100, "principal"),  # and 250 of 500 bytes
        # Past the worker's bound, whoever asks: dave is within his half.
        ({"queue_files": 3}, "dave", 100, "worker"),
        ({"queue_bytes": 400}, "dave", 150, "worker"),
    ],
)
async def test_waiting_is_bounded_and_a_refused_file_changes_nothing(
    limits: dict[str, int], who: str, size: int, limit: str
) -> None:
    f = files(1, **limits)
    f.enter("carol", "c", "running", size=100)  # not waiting: a free slot
    f.enter("bob", "b", "b1", size=100)
    f.enter("alice", "a", "a1", "a2", size=100)
    before = (f.scheduler.waiting, f.scheduler.waiting_bytes)
    with pytest.raises(QueueFull) as full:
        f.enter(who, "a" if who == "alice" else "d", "refused", size=size)
    assert full.value.limit == limit
    assert "waiting to be read" in str(full.value)
    assert (f.scheduler.waiting, f.scheduler.waiting_bytes) == before
    assert f.drain() == ["running", "b1", "a1", "a2"]
    # Room again once the queue drains.
    f.enter("alice", "a", "a4", size=100)
    assert f.running() == ["a4"]


async def test_the_bounds_count_only_files_that_wait() -> None:
    f = files(2, turn_files=1, turn_bytes=10)
    # Free slots: nothing waits, so even a file over the waiting bound starts.
    f.enter("alice", "a", "a1", "a2", size=1000)
    assert f.running() == ["a1", "a2"]
    f.enter("alice", "a", "a3", size=10)
    with pytest.raises(QueueFull):
        f.enter("alice", "a", "a4", size=1)


async def test_the_limits_default_to_a_turns_file_limits_and_half_for_a_principal() -> None:
    limits = FairLimits(slots=2, queue_files=5, queue_bytes=101)
    assert (limits.turn_files, limits.turn_bytes) == (10, 100 * 1024 * 1024)
    assert (limits.principal_files, limits.principal_bytes) == (3, math.ceil(101 / 2))


async def test_a_file_that_leaves_the_queue_is_never_granted() -> None:
    f = files(1)
    f.enter("alice", "a", "a1", "a2", "a3")
    f.enter("bob", "b", "b1")
    f.scheduler.leave(f.tickets["a2"])  # its turn was cancelled
    f.scheduler.leave(f.tickets["a2"])  # twice changes nothing
    assert f.scheduler.waiting == 2
    assert f.drain() == ["a1", "b1", "a3"]


async def test_a_cancelled_turns_waiting_files_leave_at_once_and_its_slot_is_passed_on() -> None:
    scheduler = FairScheduler(FairLimits(slots=1))
    granted: list[str] = []
    hold = asyncio.Event()

    async def read(principal: str, turn: str, name: str) -> None:
        async with scheduler.slot(principal, turn, 1):
            granted.append(name)
            await hold.wait()

    big = [asyncio.create_task(read("alice", "big", f"a{n}")) for n in range(4)]
    small = asyncio.create_task(read("bob", "small", "b1"))
    await until(lambda: scheduler.waiting == 4, what="the files queued")
    assert granted == ["a0"]
    for task in big:
        task.cancel()  # the turn was cancelled: its reader and its queued files
    await asyncio.gather(*big, return_exceptions=True)
    assert all(task.cancelled() for task in big)
    assert scheduler.waiting == 0  # gone as soon as the cancellation is delivered
    await until(lambda: granted[1:], what="the next file granted")
    assert granted == ["a0", "b1"]
    hold.set()
    await small
    assert scheduler.waiting == 0 and scheduler.waiting_bytes == 0


async def test_a_cancelled_reader_skips_files_cancelled_with_it() -> None:
    scheduler = FairScheduler(FairLimits(slots=1))
    hold = asyncio.Event()

    async def read() -> None:
        async with scheduler.slot("alice", "a", 1):
            await hold.wait()

    tasks = [asyncio.create_task(read()) for _ in range(3)]
    await until(lambda: scheduler.waiting == 2, what="the files queued")
    # The running reader's cancellation is handled first: the slot it frees
    # must not go to the waiting files, cancelled with it but not yet out.
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    assert (scheduler.waiting, scheduler.waiting_bytes) == (0, 0)
    assert scheduler.enter("bob", "b", 1).granted  # the slot is free again


async def test_a_file_cancelled_just_as_it_was_granted_passes_its_slot_on() -> None:
    scheduler = FairScheduler(FairLimits(slots=1))
    first = scheduler.enter("alice", "a", 1)
    waiting = asyncio.create_task(_hold(scheduler, "bob", "b"))
    third = asyncio.create_task(_hold(scheduler, "carol", "c"))
    await until(lambda: scheduler.waiting == 2, what="the files queued")
    scheduler.leave(first)  # grants bob's file...
    waiting.cancel()  # ...which is cancelled before it runs: carol's gets the slot
    await asyncio.gather(waiting, return_exceptions=True)
    assert await asyncio.wait_for(third, 10) == "c"


async def _hold(scheduler: FairScheduler, principal: str, turn: str) -> str:
    async with scheduler.slot(principal, turn, 1):
        return turn


async def test_the_wait_is_measured_from_entering_to_the_grant() -> None:
    now = [100.0]
    scheduler = FairScheduler(FairLimits(slots=1), clock=lambda: now[0])
    first = scheduler.enter("alice", "a", 1)
    second = scheduler.enter("bob", "b", 1)
    now[0] = 102.5
    scheduler.leave(first)
    assert (first.waited, second.waited) == (0.0, 2.5)


async def test_a_full_queue_is_the_files_error_in_the_sandbox() -> None:
    sandbox = Sandbox(concurrency=1, queue_files=2)
    # Hold the one slot, and fill alice's half of the queue.
    held = sandbox.scheduler.enter("bob", "b", 1)
    queued = sandbox.scheduler.enter("alice", "a", 1)
    outcome = await sandbox.extract("text/plain", b"hello", principal="alice", turn="a")
    assert outcome.text == ""
    assert outcome.error == (
        "too many of this caller's files are waiting to be read; send it again later"
    )
    sandbox.scheduler.leave(queued)
    sandbox.scheduler.leave(held)
