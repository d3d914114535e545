"""Hands a worker's file-reading slots out fairly, so one caller's big turn
never starves another's small one.

A free slot goes to the principal with the fewest files being read (ties:
the one served longest ago, then the one that came first), then, among that
principal's turns, to the turn with the fewest being read (same ties); files
within a turn go in order. So slots are shared evenly among the principals
with files waiting, and a principal's share evenly among its turns: a
newcomer gets the next slot that frees, and a turn that took every slot
while alone keeps no more than half of them (rounded up) once another turn
waits. No slot stays idle while a file waits, and nothing is taken away from
a reader already running.

Waiting is bounded: per turn (the files and bytes one turn can carry), per
principal (half the worker's bounds, so one caller alone cannot fill the
queue and turn everyone else's files away) and per worker. A file past a
bound is refused (``QueueFull``, with a reason fit to show the user), and
leaving (a reader done, or a turn cancelled while its files wait) takes
effect at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from turnmesh.files.types import MAX_FILES, MAX_TOTAL_FILE_BYTES

__all__ = [
    "DEFAULT_QUEUE_BYTES",
    "DEFAULT_QUEUE_FILES",
    "FairLimits",
    "FairScheduler",
    "QueueFull",
    "Ticket",
]

DEFAULT_QUEUE_FILES = 128
DEFAULT_QUEUE_BYTES = 512 * 1024 * 1024


class QueueFull(Exception):
    """A file that may not wait; ``limit`` names the bound: turn, principal or worker."""

    def __init__(self, limit: str, reason: str) -> None:
        super().__init__(reason)
        self.limit = limit


@dataclass(frozen=True)
class FairLimits:
    slots: int = 2
    # Files and bytes waiting on the whole worker; one principal may hold half.
    queue_files: int = DEFAULT_QUEUE_FILES
    queue_bytes: int = DEFAULT_QUEUE_BYTES
    # One turn: what a valid turn (or a COLLECT batch) can carry at most.
    turn_files: int = MAX_FILES
    turn_bytes: int = MAX_TOTAL_FILE_BYTES

    @property
    def principal_files(self) -> int:
        return math.ceil(self.queue_files / 2)

    @property
    def principal_bytes(self) -> int:
        return math.ceil(self.queue_bytes / 2)


@dataclass(eq=False)
class _Group:
    """A principal, or one turn of a principal: what it waits for and runs."""

    key: str
    waiting: int = 0
    waiting_bytes: int = 0
    running: int = 0
    # When it was last given a slot (a grant counter; 0: never).
    served: int = 0


@dataclass(eq=False)
class _Turn(_Group):
    queue: deque[Ticket] = field(default_factory=deque)


@dataclass(eq=False)
class _Principal(_Group):
    # Insertion-ordered: among equals, the turn that came first goes first.
    turns: dict[str, _Turn] = field(default_factory=dict)


@dataclass(eq=False)
class Ticket:
    """One file's place: waiting until ``granted``, then holding a slot."""

    principal: _Principal
    turn: _Turn
    size: int
    enqueued: float
    ready: asyncio.Future[None]
    granted: bool = False
    waited: float = 0.0
    left: bool = False


G = TypeVar("G", bound=_Group)


def _next(groups: dict[str, G]) -> G:
    """The waiting group with the fewest running, served longest ago; min()
    keeps the first of equals, so insertion order breaks the last tie."""
    return min((g for g in groups.values() if g.waiting), key=lambda g: (g.running, g.served))


class FairScheduler:
    """``slots`` readers at once, granted fairly (module docstring)."""

    def __init__(self, limits: FairLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._free = limits.slots
        self._principals: dict[str, _Principal] = {}
        self._grants = 0
        self.waiting = 0
        self.waiting_bytes = 0

    @contextlib.asynccontextmanager
    async def slot(self, principal: str, turn: str, size: int) -> AsyncIterator[float]:
        """Hold a slot for one file of ``size`` bytes; yields the seconds it
        waited. Raises QueueFull at once if it may not wait; cancelled while
        waiting, it leaves the queue."""
        ticket = self.enter(principal, turn, size)
        try:
            await ticket.ready
            yield ticket.waited
        finally:
            self.leave(ticket)

    def enter(self, principal: str, turn: str, size: int) -> Ticket:
        """Queue one file (granted at once when a slot is free and nobody waits)."""
        owner = self._principals.get(principal)
        if owner is None:
            owner = self._principals[principal] = _Principal(principal)
        group = owner.turns.get(turn)
        if group is None:
            group = owner.turns[turn] = _Turn(turn)
        ready = asyncio.get_running_loop().create_future()
        ticket = Ticket(owner, group, size, self._clock(), ready)
        if not self._free:  # a free slot means nothing waits: this one need not
            try:
                self._check_room(owner, group, size)
            except QueueFull:
                self._forget(ticket)
                raise
        group.queue.append(ticket)
        self._count(ticket, 1)
        self._dispatch()
        return ticket

    def leave(self, ticket: Ticket) -> None:
        """The file is done, or no longer wanted: free its slot or its place."""
        if ticket.left:
            return
        ticket.left = True
        if ticket.granted:
            ticket.turn.running -= 1
            ticket.principal.running -= 1
            self._free += 1
        else:
            ticket.turn.queue.remove(ticket)
            self._count(ticket, -1)
            ticket.ready.cancel()
        self._forget(ticket)
        self._dispatch()

    def _check_room(self, owner: _Principal, group: _Turn, size: int) -> None:
        limits = self.limits
        if group.waiting + 1 > limits.turn_files or group.waiting_bytes + size > limits.turn_bytes:
            raise QueueFull("turn", "the turn has more files waiting to be read than allowed")
        if (
            owner.waiting + 1 > limits.principal_files
            or owner.waiting_bytes + size > limits.principal_bytes
        ):
            raise QueueFull(
                "principal",
                "too many of this caller's files are waiting to be read; send it again later",
            )
        if self.waiting + 1 > limits.queue_files or self.waiting_bytes + size > limits.queue_bytes:
            raise QueueFull("worker", "too many files are waiting to be read; send it again later")

    def _count(self, ticket: Ticket, sign: int) -> None:
        for group in (ticket.turn, ticket.principal):
            group.waiting += sign
            group.waiting_bytes += sign * ticket.size
        self.waiting += sign
        self.waiting_bytes += sign * ticket.size

    def _forget(self, ticket: Ticket) -> None:
        """Drop a turn and a principal once nothing of theirs waits or runs."""
        turn, owner = ticket.turn, ticket.principal
        if not turn.waiting and not turn.running:
            owner.turns.pop(turn.key, None)
        if not owner.turns:
            self._principals.pop(owner.key, None)

    def _dispatch(self) -> None:
        while self._free and self.waiting:
            owner = _next(self._principals)
            turn = _next(owner.turns)
            ticket = turn.queue.popleft()
            self._count(ticket, -1)
            if ticket.ready.cancelled():
                # Its task was cancelled and has not run its cleanup yet: it
                # leaves now instead (its leave() will find it gone).
                ticket.left = True
                self._forget(ticket)
                continue
            self._grants += 1
            for group in (turn, owner):
                group.running += 1
                group.served = self._grants
            self._free -= 1
            ticket.granted = True
            ticket.waited = self._clock() - ticket.enqueued
            ticket.ready.set_result(None)
