"""Session ownership as one server sees it: which server handles a call on
a session, here (``Local``) or the owner it is forwarded to (``Forward``).

``SessionOwnership`` is the one place that knows it: the sessions this server
owns (created here or routed here; reported when it re-registers with a
restarted router) and the cached routes to other servers' sessions (from the
router, which assigns owners). Nothing else keeps either.

With a shared store (Redis) the router only suggests: a session is this
server's when the store says so under its lease (``server.mesh.leases``), checked
before a session is served here the first time, after this server's lease
lapsed, and at every commit. Without the router a server serves the sessions
it holds, forwards calls for sessions another live server holds, and takes
over only sessions whose holder's lease lapsed (the same rule as with the
router: the lease, not the router, makes a takeover safe); it creates none.
With a store of one server (memory, SQLite) sessions never move.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from turnmesh.runtime.errors import HeldElsewhere, OwnerAway, Unavailable
from turnmesh.runtime.principals import public_id
from turnmesh.server.mesh.leases import Claim, HeldBy, Leases, Mine, Missing, Owner

__all__ = ["LOCAL", "Forward", "Local", "Owner", "Placement", "Router", "SessionOwnership"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Local:
    """Handle the call on this server."""


@dataclass(frozen=True)
class Forward:
    """Forward the call to the session's owner."""

    owner: Owner


Placement = Local | Forward
LOCAL = Local()


class Router(Protocol):
    """What ownership needs of the router (``turnmesh.server.mesh.routing.RouterClient``)."""

    async def route(
        self, session_id: str, *, unreachable: Owner | None = None, assign: bool = False
    ) -> Owner | None:
        """The session's owner; None if it has none (and ``assign`` is False).
        Raises Unavailable when the router cannot be asked."""
        ...

    async def remove_session(self, session_id: str) -> None:
        """Forget the session's route (it was deleted); best effort."""
        ...


class SessionOwnership:
    def __init__(
        self,
        member_id: str,
        router: Router | None = None,
        holds: Callable[[str], Awaitable[bool]] | None = None,
        leases: Leases | None = None,
    ) -> None:
        self.member_id = member_id
        self._router = router
        # Whether this server's store holds the session: the fallback, while
        # the router is unreachable, of a store no other server shares.
        self._holds = holds
        self._leases = leases
        # Owned session -> the lease token it carries ("" without leases).
        self._owned: dict[str, str] = {}
        self._routes: dict[str, Owner] = {}

    # What this server owns --------------------------------------------------

    def owns(self, session_id: str) -> bool:
        return session_id in self._owned

    def new_token(self) -> str:
        """The owner token a session created here carries ("" without leases)."""
        return self._leases.new_token() if self._leases is not None else ""

    def claim(self, session_id: str, token: str = "") -> None:
        """This server owns the session (it created it, or the router said so)."""
        self._owned[session_id] = token
        self._routes.pop(session_id, None)

    def release(self, session_id: str) -> None:
        """The session is gone from this server (deleted, expired, not found,
        or taken over)."""
        self._owned.pop(session_id, None)
        self._routes.pop(session_id, None)

    async def drop(self, session_id: str) -> None:
        """The session was deleted here: release it and tell the router."""
        self.release(session_id)
        if self._router is not None:
            await self._router.remove_session(session_id)

    async def unassign(self, session_id: str) -> None:
        """A create routed here failed: the router forgets the route it gave,
        so refused creates leave nothing behind."""
        if session_id not in self._owned and self._router is not None:
            await self._router.remove_session(session_id)

    async def may_expire(self, session_id: str) -> bool:
        """Whether this server should delete the idle session: its own store's
        always; in a shared store, only one it owns (or takes over: its owner
        is gone), so the owner forgets it whole and no server twice."""
        if self._leases is None or session_id in self._owned:
            return True
        return isinstance(await self._take(session_id), Mine)

    def fence(self, session_id: str, owner: str) -> str:
        """The token a turn on the session commits under. ``owner``: the
        token the store's record carries now. Unavailable (retry: the call is
        placed again) if the session is no longer this server's."""
        if self._leases is None:
            return ""
        token = self._owned.get(session_id)
        if token is None or token != owner:
            self.release(session_id)
            raise Unavailable(f"session {public_id(session_id)!r} moved to another server; retry")
        return token

    def owned(self) -> list[str]:
        """The sessions this server owns."""
        return sorted(self._owned)

    async def verified(self) -> list[str]:
        """The sessions this server owns, checked against the store if our
        lease lapsed: what it reports to a router that forgot it."""
        if self._leases is not None:
            await self._leases.ensure()
        return sorted(self._owned)

    def forget_routes(self) -> None:
        """The router restarted and may have moved sessions: ask it again.
        What this server owns stays: its store (and lease) say so."""
        self._routes.clear()

    async def after_lapse(self) -> None:
        """Our lease lapsed (``leases``' ``on_lapse``): keep only the sessions
        that still carry our token."""
        assert self._leases is not None
        snapshot = dict(self._owned)  # sessions claimed meanwhile are not judged
        kept = await self._leases.still_mine(snapshot)
        lost = [s for s, token in snapshot.items() if s not in kept and self._owned.get(s) == token]
        for session_id in lost:
            self.release(session_id)
        if lost:
            log.warning("%d sessions were taken over while this server was away", len(lost))

    # Where a call runs ------------------------------------------------------

    async def place(self, session_id: str, *, assign: bool = False) -> Placement:
        """Where a call on the session runs. ``assign``: give an unknown
        session an owner (creating it); else an unknown session is handled
        here (and is not found)."""
        if session_id in self._owned:
            if self._leases is None or self._leases.fresh():
                return LOCAL
            await self._leases.ensure()  # lapsed: rechecks what we own
            if session_id in self._owned:
                return LOCAL
        cached = None if assign else self._routes.get(session_id)
        if cached is not None:
            return Forward(cached)
        try:
            owner = await self._ask(session_id, assign=assign)
        except Unavailable as exc:
            if isinstance(exc, OwnerAway):
                raise  # its owner is away, and nobody else has it: retry later
            return await self._without_router(session_id, assign=assign)
        return await self._placement(session_id, owner, assign=assign)

    async def accept_forwarded(self, session_id: str, unreachable: str | None = None) -> None:
        """Another server forwarded a call here (the router named us): take
        the session if nobody's lease holds it. ``unreachable``: the member
        the forwarding server could not reach; if it holds the session, wait
        out its lease. Another live holder: HeldElsewhere (with
        its address), and the forwarding server sends the call there."""
        if self._leases is None:
            return
        if session_id in self._owned and self._leases.fresh():
            return
        claim = await self._take(session_id, wait_for=unreachable)
        if isinstance(claim, HeldBy):
            raise HeldElsewhere(
                f"session {public_id(session_id)!r} is held by server"
                f" {claim.owner.member_id}; retry there",
                metadata={
                    "owner_id": claim.owner.member_id,
                    "owner_address": claim.owner.address,
                },
            )

    async def holds_or_takes(self, session_id: str) -> bool:
        """Whether the session is this server's, taking it over if its
        holder's lease lapsed (a store of one server: every session in it is
        ours). Asks the store, not the router: the router may still name a
        holder that died, until its heartbeats are missed."""
        if self._leases is None:
            return True
        if session_id in self._owned and self._leases.fresh():
            return True
        return isinstance(await self._take(session_id), Mine)

    def held_by(self, session_id: str, owner: Owner) -> Placement:
        """Another server said ``owner`` holds the session (by its lease):
        route there from now on."""
        if owner.member_id == self.member_id:
            return LOCAL
        self._routes[session_id] = owner
        return Forward(owner)

    async def after_unreachable(self, session_id: str, unreachable: Owner) -> Placement:
        """The owner could not be reached: tell the router (it drops that
        member and reassigns its sessions at once) and place the call again."""
        for sid in [s for s, o in self._routes.items() if o.member_id == unreachable.member_id]:
            del self._routes[sid]
        owner = await self._ask(session_id, unreachable=unreachable)
        return await self._placement(session_id, owner, unreachable=unreachable)

    async def after_silence(self, session_id: str, silent: Owner) -> Placement | None:
        """The owner took a call but says nothing (frozen, or cut off). Ask the
        router again, without an "unreachable" hint (a slow owner must not be
        evicted): the new placement if the session moved, None if the silent
        owner still holds it (or the router cannot say)."""
        self._routes.pop(session_id, None)
        try:
            owner = await self._ask(session_id)
        except Unavailable as exc:
            if isinstance(exc, OwnerAway):
                raise  # the router dropped it, and nobody else can serve it
            if self._leases is None:
                return None
            # No router: the lease says whether the silent owner still holds it.
            try:
                placement = await self._without_router(session_id, assign=False)
            except Unavailable:
                return None
            if isinstance(placement, Forward) and placement.owner.member_id == silent.member_id:
                return None
            return placement
        if owner is not None and owner.member_id == silent.member_id:
            self._routes[session_id] = owner
            return None
        placement = await self._placement(session_id, owner)
        if isinstance(placement, Forward) and placement.owner.member_id == silent.member_id:
            return None  # its lease still holds it: keep waiting
        return placement

    async def _take(self, session_id: str, wait_for: str | None = None) -> Claim:
        """Claim the session under the lease; one that is ours is owned here."""
        assert self._leases is not None
        claim = await self._leases.claim(session_id, wait_for=wait_for)
        if isinstance(claim, Mine):
            self.claim(session_id, claim.token)
        return claim

    async def _ask(
        self, session_id: str, *, unreachable: Owner | None = None, assign: bool = False
    ) -> Owner | None:
        if self._router is None:
            raise Unavailable("this server has no router")
        return await self._router.route(session_id, unreachable=unreachable, assign=assign)

    async def _without_router(self, session_id: str, *, assign: bool) -> Placement:
        """The router cannot be asked: serve what this server holds (or takes
        over: its holder's lease lapsed), forward what another live server
        holds. Creates wait for the router (it spreads sessions)."""
        if assign:
            raise Unavailable("the mesh router is unavailable; retry")
        if self._leases is not None:
            claim = await self._take(session_id)
            if isinstance(claim, Mine):
                return LOCAL
            if isinstance(claim, HeldBy):
                self._routes[session_id] = claim.owner
                return Forward(claim.owner)
            return LOCAL  # no such session: not found here
        if self._holds is not None and await self._holds(session_id):
            return LOCAL  # a store no other server shares: ours
        raise Unavailable("the mesh router is unavailable; retry")

    async def _placement(
        self,
        session_id: str,
        owner: Owner | None,
        *,
        assign: bool = False,
        unreachable: Owner | None = None,
    ) -> Placement:
        if owner is not None and owner.member_id != self.member_id:
            if not assign:  # a create may be refused there: nothing cached for it
                self._routes[session_id] = owner
            return Forward(owner)
        if assign:
            return LOCAL  # created here: owned once the create succeeds
        if self._leases is None:
            if owner is not None:
                self.claim(session_id)
            return LOCAL  # nobody owns it: here it is not found
        # Routed here, or known to nobody: the store's lease decides (and an
        # owner found unreachable gets the rest of its lease to come back).
        claim = await self._take(
            session_id, wait_for=unreachable.member_id if unreachable else None
        )
        if isinstance(claim, Mine):
            return LOCAL
        if isinstance(claim, Missing):
            return LOCAL  # not found here
        if unreachable is not None and claim.owner.member_id == unreachable.member_id:
            raise Unavailable(
                f"the server holding session {public_id(session_id)!r} cannot be reached and"
                " its lease has not lapsed; retry"
            )
        self._routes[session_id] = claim.owner
        return Forward(claim.owner)
