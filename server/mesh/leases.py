"""Leases: which server owns a session when every server shares the store.

The router says where a session should run, but it can be down, restarted or
told wrong (a partition, a stalled server); the store is what decides. Each
server holds a *member lease* in the store (its address, expiring after
``lease_seconds`` unless renewed) and writes an *owner token* of its own
(``member-id/nonce``) into every session it owns. A session belongs to the
server whose token it carries while that server's lease lasts:

- taking a session over is a compare-and-swap of its token, allowed only once
  the holder's lease has lapsed (``claim``);
- every commit names the token its turn started under and writes nothing if
  the session's token changed meanwhile (the store's fence);
- a server that finds its own lease lapsed (it was stalled or cut off) checks
  every session it thought it owned before it serves any of them again, and
  keeps exactly those still carrying its token.

Stores of one server (memory, SQLite) need none of this: they have no leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from turnmesh.runtime.errors import Unavailable
from turnmesh.runtime.principals import public_id
from turnmesh.runtime.renewal import Renewal

log = logging.getLogger(__name__)

DEFAULT_LEASE_SECONDS = 6.0
# Attempts at a compare-and-swap before answering "retry" (another server is
# claiming the same session at the same moment).
CLAIM_ATTEMPTS = 3


@dataclass(frozen=True)
class Owner:
    """A session server that owns sessions: its member id and address."""

    member_id: str
    address: str


class LeaseStore(Protocol):
    """What leases need of a shared store (``stores.redis.RedisStore``,
    ``stores.postgres.PostgresStore``)."""

    async def owner_of(self, session_id: str) -> str | None: ...

    async def owners_of(self, session_ids: list[str]) -> list[str | None]: ...

    async def swap_owner(self, session_id: str, expected: str, new: str) -> bool | None: ...

    async def hold_member(self, member_id: str, address: str, ttl_ms: int) -> None: ...

    async def member_lease(self, member_id: str) -> tuple[str, float] | None:
        """The member's address and the seconds its lease has left; None
        once it lapsed."""
        ...

    async def drop_member(self, member_id: str) -> None: ...

    async def take_address(self, member_id: str, address: str, ttl_ms: int) -> str | None: ...


@dataclass(frozen=True)
class Mine:
    """This server owns the session, under ``token``."""

    token: str


@dataclass(frozen=True)
class HeldBy:
    """Another server owns the session and its lease lasts."""

    owner: Owner


@dataclass(frozen=True)
class Missing:
    """The store has no such session."""


Claim = Mine | HeldBy | Missing


def member_of(token: str) -> str:
    return token.rpartition("/")[0]


class Leases:
    def __init__(
        self,
        store: LeaseStore,
        member_id: str,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        *,
        on_lapse: Callable[[], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if lease_seconds <= 0:
            raise ValueError("lease_seconds must be positive")
        self.member_id = member_id
        self._store = store
        self._seconds = lease_seconds
        self._clock = clock
        self._sleep = sleep
        self._address = ""
        self._valid_until = 0.0
        self._renewing = asyncio.Lock()
        self._renewal = Renewal(
            self.renew,
            lease_seconds / 4,
            name="lease",
            log=log,
            failing="could not renew this server's lease; retrying",
            recovered="lease renewed again",
        )
        self._closed = False
        # Told when our lease lapsed, before it counts as fresh again: drop
        # the sessions no longer ours.
        self._on_lapse = on_lapse

    def new_token(self) -> str:
        return f"{self.member_id}/{secrets.token_hex(6)}"

    def fresh(self) -> bool:
        """Whether our lease surely still lasts (measured from before the
        last renewal was sent)."""
        return self._clock() < self._valid_until

    async def ensure(self) -> None:
        """Make sure our lease lasts (renewing it, and checking our sessions
        if it had lapsed). Raises Unavailable if the store cannot be reached."""
        if self.fresh():
            return
        async with self._renewing:
            if not self.fresh():  # not renewed by whoever held the lock
                await self._renew()

    async def renew(self) -> None:
        async with self._renewing:
            await self._renew()

    async def _renew(self) -> None:
        if self._closed:
            raise Unavailable("this server is leaving the mesh; retry")
        if not self._address:
            # A lease with no address would read as lapsed to the others.
            raise Unavailable("this server is starting; retry")
        lapsed = self._valid_until > 0 and not self.fresh()
        sent = self._clock()
        await self._store.hold_member(self.member_id, self._address, int(self._seconds * 1000))
        if lapsed:
            log.warning("this server's lease lapsed (stalled or cut off): checking its sessions")
            await self._on_lapse()
        self._valid_until = sent + self._seconds

    async def claim(self, session_id: str, *, wait_for: str | None = None) -> Claim:
        """Who owns the session, making it ours if nobody's lease holds it.
        ``wait_for``: a member thought dead (it could not be reached): if it
        holds the session, wait at most one lease time for its lease to
        lapse, so the caller's call fails over instead of failing."""
        await self.ensure()  # a token of ours counts only while our lease lasts
        give_up = self._clock() + self._seconds + 1.0
        attempts = 0
        while True:
            current = await self._store.owner_of(session_id)
            if current is None:
                return Missing()
            holder = member_of(current)
            if current and holder == self.member_id:
                return Mine(current)
            if current:
                lease = await self._store.member_lease(holder)
                if lease is not None:
                    address, left = lease
                    pause = min(left + 0.05, give_up - self._clock())
                    if holder != wait_for or pause <= 0:
                        return HeldBy(Owner(holder, address))
                    # Sleeping on the lease's own expiry: one wake-up, no polling.
                    await self._sleep(pause)
                    continue
            token = self.new_token()
            swapped = await self._store.swap_owner(session_id, current, token)
            if swapped is None:
                return Missing()
            if swapped:
                if current:
                    log.info("took session %s over from %s (its lease lapsed)", session_id, holder)
                return Mine(token)
            attempts += 1
            if attempts >= CLAIM_ATTEMPTS:
                raise Unavailable(f"session {public_id(session_id)!r} is changing owner; retry")

    async def still_mine(self, tokens: dict[str, str]) -> set[str]:
        """Which of these sessions still carry our token."""
        ids = list(tokens)
        owners = await self._store.owners_of(ids) if ids else []
        return {s for s, owner in zip(ids, owners, strict=True) if owner == tokens[s]}

    # Lifecycle ------------------------------------------------------------------

    async def start(self, address: str) -> None:
        """Take our lease (before serving) and keep renewing it. A member
        whose lease still names our address is a process that died there
        (we bound its port, e.g. restarted by `turnmesh up`): its lease ends
        now, so its sessions move at once instead of after its lease."""
        self._address = address
        ttl_ms = int(self._seconds * 1000)
        previous = await self._store.take_address(self.member_id, address, ttl_ms)
        if previous is not None and previous != self.member_id:
            log.info("%s held %s before this server: its lease ends now", previous, address)
            await self._store.drop_member(previous)
        await self.renew()
        self._renewal.start()

    async def stop(self) -> None:
        """Give the lease up (we are leaving): our sessions can be taken at once."""
        await self._renewal.stop()
        self._closed = True
        self._valid_until = 0.0
        with contextlib.suppress(Unavailable):
            await self._store.drop_member(self.member_id)
