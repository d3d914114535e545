"""Receipt slots: how many requests one principal may have arriving at once.

gRPC reads a unary request whole before any handler sees it, so thirty 50 MB
requests sent at once were 1.5 GB in memory before a budget could refuse one.
A request that takes a slot is read; the others wait, unread (the transport
buffers no more than its flow-control window of each), and are decided one
after another against the byte budgets, in the order they came. A
principal's slow senders only ever hold its own slots; a slot is handed back
when its message has arrived, when its caller goes away, or after
``hold_seconds`` even if the message is still arriving (so a request behind k
stalled ones of its principal waits about k / per_key x hold_seconds).

A body that is decoded after it is read (the JSON of the HttpBody methods,
in a child process when large) keeps its slot until it is decoded
(``decoded``): while it waits for a decoder it is in memory two or three
times over, and a principal's bodies arriving faster than they are decoded
would otherwise pile up without bound.

Hand-written: asyncio.Semaphore does the waiting, but a slot that may be
handed back early by a timer, one table of keys that forgets idle ones, and a
bounded count of waiters are ours.
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from dataclasses import dataclass, field

from turnmesh.runtime.errors import RateLimited

DEFAULT_PER_PRINCIPAL = 4
DEFAULT_WAITING_PER_PRINCIPAL = 256
DEFAULT_HOLD_SECONDS = 10.0


@dataclass
class _Key:
    slots: asyncio.Semaphore
    users: int = 0  # holding or waiting: the entry goes when none are left


@dataclass
class Slot:
    """A held slot; ``release`` is idempotent (the timer and the read race)."""

    _owner: ReceiptSlots
    _key: str
    _timer: asyncio.TimerHandle | None = None
    _released: bool = field(default=False)

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        if self._timer is not None:
            self._timer.cancel()
        self._owner._give_back(self._key)


class ReceiptSlots:
    def __init__(
        self,
        per_key: int = DEFAULT_PER_PRINCIPAL,
        *,
        max_waiting: int = DEFAULT_WAITING_PER_PRINCIPAL,
        hold_seconds: float = DEFAULT_HOLD_SECONDS,
    ) -> None:
        if per_key < 1 or max_waiting < 0 or hold_seconds <= 0:
            raise ValueError("per_key >= 1, max_waiting >= 0 and hold_seconds > 0")
        self.per_key = per_key
        self.max_waiting = max_waiting
        self.hold_seconds = hold_seconds
        self._keys: dict[str, _Key] = {}
        self._waiting = 0

    def __len__(self) -> int:
        """Keys with a request holding or waiting for a slot."""
        return len(self._keys)

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot, of every key."""
        return self._waiting

    async def acquire(self, key: str) -> Slot:
        """A slot of ``key``'s, once one is free. RateLimited when too many
        of its requests already wait (the table of waiters is bounded)."""
        entry = self._keys.get(key)
        if entry is None:
            entry = self._keys[key] = _Key(asyncio.Semaphore(self.per_key))
        if entry.users >= self.per_key + self.max_waiting:
            raise RateLimited(
                f"this caller has {entry.users} requests arriving at once;"
                f" at most {self.per_key} are read at a time and {self.max_waiting} wait",
                retry_after=1,
                metadata={"limit": "requests_arriving"},
            )
        entry.users += 1
        self._waiting += 1
        try:
            await entry.slots.acquire()
        except BaseException:  # cancelled while waiting: it never held one
            self._forget(key, entry)
            raise
        finally:
            self._waiting -= 1
        slot = Slot(self, key)
        slot._timer = asyncio.get_running_loop().call_later(self.hold_seconds, slot.release)
        return slot

    def _give_back(self, key: str) -> None:
        entry = self._keys[key]
        entry.slots.release()
        self._forget(key, entry)

    def _forget(self, key: str, entry: _Key) -> None:
        entry.users -= 1
        if entry.users == 0:
            del self._keys[key]


# The slot a call keeps until its body is decoded (each call runs in a task
# of its own, so no call sees another's).
_UNDECODED: ContextVar[Slot | None] = ContextVar("turnmesh_receipt_undecoded", default=None)


def keep_until_decoded(slot: Slot) -> None:
    """The current call keeps ``slot`` until ``decoded`` (or its end, or the
    slot's timer)."""
    _UNDECODED.set(slot)


def decoded() -> None:
    """The current call's body is decoded (or refused): its slot, if it kept
    one, goes back."""
    slot = _UNDECODED.get()
    if slot is not None:
        slot.release()
