"""Session ownership as one server sees it: which server handles a call on
a session, here (``Local``) or the owner it is forwarded to (``Forward``).

``SessionOwnership`` is the one place that knows it: the sessions this server
owns (created here or routed here; reported when it re-registers with a
restarted router) and the cached routes to other servers' sessions (from the
router, which assigns owners). Nothing else keeps either.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from turnmesh.runtime.errors import Unavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Owner:
    """A session server that owns sessions: its member id and address."""

    member_id: str
    address: str


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
    """What ownership needs of the router (``turnmesh.server.routing.RouterClient``)."""

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
    ) -> None:
        self.member_id = member_id
        self._router = router
        # Whether this server's store holds the session (the fallback while
        # the router is unreachable).
        self._holds = holds
        self._owned: set[str] = set()
        self._routes: dict[str, Owner] = {}

    # What this server owns --------------------------------------------------

    def owns(self, session_id: str) -> bool:
        return session_id in self._owned

    def claim(self, session_id: str) -> None:
        """This server owns the session (it created it, or the router said so)."""
        self._owned.add(session_id)
        self._routes.pop(session_id, None)

    def release(self, session_id: str) -> None:
        """The session is gone from this server (deleted, expired, not found)."""
        self._owned.discard(session_id)
        self._routes.pop(session_id, None)

    async def drop(self, session_id: str) -> None:
        """The session was deleted here: release it and tell the router."""
        self.release(session_id)
        if self._router is not None:
            await self._router.remove_session(session_id)

    def owned(self) -> list[str]:
        """The sessions this server owns, for re-registering with the router."""
        return sorted(self._owned)

    def forget_all(self) -> None:
        """The router restarted and may have moved sessions: ask it again."""
        self._owned.clear()
        self._routes.clear()

    # Where a call runs ------------------------------------------------------

    async def place(self, session_id: str, *, assign: bool = False) -> Placement:
        """Where a call on the session runs. ``assign``: give an unknown
        session an owner (creating it); else an unknown session is handled
        here (and is not found)."""
        if session_id in self._owned:
            return LOCAL
        cached = self._routes.get(session_id)
        if cached is not None:
            return Forward(cached)
        try:
            owner = await self._ask(session_id, assign=assign)
        except Unavailable:
            # Without the router, serve what this server's store holds rather than fail.
            if self._holds is not None and await self._holds(session_id):
                return LOCAL
            raise
        return self._placement(session_id, owner)

    async def after_unreachable(self, session_id: str, unreachable: Owner) -> Placement:
        """The owner could not be reached: tell the router (it drops that
        member and reassigns its sessions at once) and place the call again."""
        for sid in [s for s, o in self._routes.items() if o.member_id == unreachable.member_id]:
            del self._routes[sid]
        owner = await self._ask(session_id, unreachable=unreachable)
        return self._placement(session_id, owner)

    async def after_silence(self, session_id: str, silent: Owner) -> Placement | None:
        """The owner took a call but says nothing (frozen, or cut off). Ask the
        router again, without an "unreachable" hint (a slow owner must not be
        evicted): the new placement if the session moved, None if the silent
        owner still holds it (or the router cannot say)."""
        self._routes.pop(session_id, None)
        try:
            owner = await self._ask(session_id)
        except Unavailable:
            return None
        if owner is not None and owner.member_id == silent.member_id:
            self._routes[session_id] = owner
            return None
        return self._placement(session_id, owner)

    async def _ask(
        self, session_id: str, *, unreachable: Owner | None = None, assign: bool = False
    ) -> Owner | None:
        if self._router is None:
            raise Unavailable("this server has no router")
        return await self._router.route(session_id, unreachable=unreachable, assign=assign)

    def _placement(self, session_id: str, owner: Owner | None) -> Placement:
        if owner is None:
            return LOCAL  # nobody owns it: here it is not found (or created)
        if owner.member_id == self.member_id:
            self.claim(session_id)
            return LOCAL
        self._routes[session_id] = owner
        return Forward(owner)
