"""The router's in-memory state: mesh membership and session ownership.

Pure logic, no gRPC, so it can be tested with a fake clock. Not thread-safe:
the router calls it only from its one event loop, and every method runs to
completion without awaiting.

Liveness uses the monotonic clock (immune to wall-clock jumps); the wall
clock only feeds the timestamps reported to callers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import IntEnum

from turnmesh.runtime.errors import NotFound, OwnerAway, Unavailable, UnknownMember
from turnmesh.runtime.principals import public_id

log = logging.getLogger(__name__)

Clock = Callable[[], float]

# How many heartbeat timeouts a dropped member's ownership entries are kept,
# so that a member dropped by mistake (a network blip, a wrong unreachable
# hint) gets its sessions back when it re-registers under the same id.
ORPHAN_TTL_TIMEOUTS = 10.0


class Role(IntEnum):
    """A member's role; the values equal turnmesh.v1.MemberRole's numbers."""

    SERVER = 1
    WORKER = 2


@dataclass(frozen=True)
class MemberSpec:
    """What a member announces about itself when it registers."""

    member_id: str
    role: Role
    address: str
    agent_name: str = ""
    inflight_turns: int = 0
    accepting: bool = True
    shared_store: bool = False


@dataclass(frozen=True)
class MemberRecord:
    """A live member as the router knows it. Immutable: updates replace it,
    so callers may keep a record without seeing later changes."""

    member_id: str
    role: Role
    address: str
    agent_name: str
    inflight_turns: int
    accepting: bool
    registered_at: float  # wall clock, seconds since the epoch
    last_heartbeat: float  # wall clock, seconds since the epoch
    last_seen: float  # monotonic clock
    # Servers: sessions live in a store every server shares, so they can move.
    shared_store: bool = False


class RouterState:
    def __init__(
        self,
        heartbeat_timeout: float,
        *,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
        orphan_ttl: float | None = None,
        warmup: float = 0.0,
    ) -> None:
        if heartbeat_timeout <= 0:
            raise ValueError("heartbeat_timeout must be positive")
        self.heartbeat_timeout = heartbeat_timeout
        # After a (re)start, live servers re-register with their sessions
        # within a heartbeat timeout. Until then "no owner" may only mean "not
        # told yet": lookups answer Unavailable (retryable), not NotFound.
        self._warm_until = clock() + warmup
        self._clock = clock
        self._wall_clock = wall_clock
        self._orphan_ttl = (
            orphan_ttl if orphan_ttl is not None else ORPHAN_TTL_TIMEOUTS * heartbeat_timeout
        )
        self._members: dict[str, MemberRecord] = {}
        self._owner: dict[str, str] = {}  # session_id -> member_id
        # Reverse index, so dropping or purging a member costs O(its sessions).
        self._owned: dict[str, set[str]] = {}  # member_id -> session_ids
        # Members dropped while still owning sessions -> monotonic drop time,
        # and their last record (whether their sessions can move, a shared
        # store, or stay theirs; their address).
        self._departed: dict[str, tuple[float, MemberRecord]] = {}
        # Round-robin cursor: the server last assigned. Keyed by id rather
        # than an index so joins and departures do not skew the rotation.
        self._last_assigned: str | None = None

    # -- membership ---------------------------------------------------------

    def register(self, member: MemberSpec, *, rejoining: bool = False) -> MemberRecord:
        """Add a member, or refresh it if its id is live. A member coming back
        under a dropped id keeps the sessions nobody took over meanwhile (and
        reports the ones it owns with ``report_sessions``)."""
        now, wall = self._clock(), self._wall_clock()
        role = Role(member.role)
        previous = self._members.get(member.member_id)
        record = MemberRecord(
            member_id=member.member_id,
            role=role,
            address=member.address,
            agent_name=member.agent_name,
            inflight_turns=member.inflight_turns,
            accepting=member.accepting,
            registered_at=previous.registered_at if previous else wall,
            last_heartbeat=wall,
            last_seen=now,
            shared_store=member.shared_store,
        )
        for other in [
            m for m in self._members.values() if m.address == member.address and m is not previous
        ]:
            # Another process serves its address now: it is dead for sure,
            # even before it missed its heartbeats.
            self._drop(other.member_id, "replaced at its address")
        self._members[member.member_id] = record
        self._departed.pop(member.member_id, None)
        for gone, (_, last) in list(self._departed.items()):
            if last.address == member.address:
                # Another process serves its address now: it is dead for sure,
                # and what only it held is gone (a restarted memory server).
                log.info(
                    "member %s was replaced at %s; forgetting its sessions", gone, last.address
                )
                self._forget_sessions_of(gone)
        if rejoining:
            # Other members will re-register within a heartbeat timeout.
            self._warm_until = max(self._warm_until, now + self.heartbeat_timeout)
        if previous is None:
            log.info(
                "member joined: %s role=%s address=%s agent=%r sessions=%d",
                member.member_id,
                role.name.lower(),
                member.address,
                member.agent_name,
                len(self._owned.get(member.member_id, ())),
            )
        elif (previous.role, previous.address, previous.agent_name) != (
            role,
            member.address,
            member.agent_name,
        ):
            log.info(
                "member re-registered with changes: %s role=%s address=%s agent=%r",
                member.member_id,
                role.name.lower(),
                member.address,
                member.agent_name,
            )
        return record

    def report_sessions(self, member_id: str, sessions: Iterable[str]) -> None:
        """A live server owns these sessions, so they route to it. With a
        shared store its lease proves it, whatever this table said; with a
        store of its own, a session another live server owns now (made
        again there while this one was presumed dead) stays there.
        NotFound if the member is not live."""
        record = self._members.get(member_id)
        if record is None or record.role != Role.SERVER:
            raise UnknownMember("unknown server; register again")
        for session_id in sessions:
            owner = self._owner.get(session_id)
            if owner == member_id:
                continue
            if record.shared_store or owner is None or owner not in self._members:
                self._assign(session_id, member_id)

    def heartbeat(self, member_id: str, inflight: int, accepting: bool) -> bool:
        """Mark a member alive. False if unknown, including a member that
        stayed silent past the timeout: it must register again."""
        self.expire()
        record = self._members.get(member_id)
        if record is None:
            return False
        if record.accepting != accepting:
            log.info("member %s %s", member_id, "accepting" if accepting else "draining")
        self._members[member_id] = replace(
            record,
            inflight_turns=inflight,
            accepting=accepting,
            last_heartbeat=self._wall_clock(),
            last_seen=self._clock(),
        )
        return True

    def unregister(self, member_id: str) -> bool:
        """Remove a member; its sessions move on their next route. False if
        it was not live (unregistering is idempotent)."""
        return self._drop(member_id, "left")

    def expire(self) -> list[str]:
        """Drop members silent for longer than the heartbeat timeout; forget
        the ownership of members gone longer than the orphan TTL."""
        now = self._clock()
        dropped = [
            member_id
            for member_id, record in self._members.items()
            if now - record.last_seen > self.heartbeat_timeout
        ]
        for member_id in dropped:
            self._drop(member_id, "missed heartbeats")
        for member_id, (since, _) in list(self._departed.items()):
            if now - since > self._orphan_ttl:
                self._forget_sessions_of(member_id)
        return sorted(dropped)

    def get(self, member_id: str) -> MemberRecord | None:
        return self._members.get(member_id)

    def list_members(
        self, role: Role | None = None, agent_name: str | None = None
    ) -> list[MemberRecord]:
        """Live members, by id; ``None`` or ``""`` means no filter."""
        self.expire()
        return [
            record
            for _, record in sorted(self._members.items())
            if (role is None or record.role == role)
            and (not agent_name or record.agent_name == agent_name)
        ]

    def learning(self, caller: str = "") -> bool:
        """Whether the member list may be incomplete: members are still
        registering again after a restart, or the caller has not yet."""
        return self._clock() < self._warm_until or bool(caller and caller not in self._members)

    # -- session ownership --------------------------------------------------

    def route(
        self,
        session_id: str,
        unreachable: Iterable[str] = (),
        *,
        lookup_only: bool = False,
        caller: str = "",
    ) -> tuple[MemberRecord, bool]:
        """The session's owner, and whether this call assigned it. With
        ``lookup_only``, a session with no recorded owner is NotFound."""
        self.expire()
        for member_id in unreachable:
            record = self._members.get(member_id)
            # Only servers: the hint comes from a server that failed to reach
            # a peer, and must not be able to evict workers.
            if record is not None and record.role == Role.SERVER:
                self._drop(member_id, "reported unreachable")
        owner_id = self._owner.get(session_id)
        if owner_id is not None:
            owner = self._members.get(owner_id)
            if owner is not None and owner.role == Role.SERVER:
                return owner, False
            departed = self._departed.get(owner_id)
            if departed is not None and not departed[1].shared_store:
                # Its sessions live only in its own store: they wait for it.
                # Callers fail fast instead of waiting on it.
                raise OwnerAway(
                    f"the server that holds session {public_id(session_id)!r} is unreachable; retry"
                )
        elif lookup_only:
            if self._clock() < self._warm_until or (caller and caller not in self._members):
                raise Unavailable("the router restarted and is still learning who owns what")
            raise NotFound(f"session {public_id(session_id)!r} has no owner")
        owner = self._next_server()
        self._assign(session_id, owner.member_id)
        return owner, True

    def remove_session(self, session_id: str) -> bool:
        """Forget a session's owner. False if none was recorded."""
        owner_id = self._owner.pop(session_id, None)
        if owner_id is None:
            return False
        self._unindex(session_id, owner_id)
        return True

    def owner_of(self, session_id: str) -> str | None:
        """The recorded owner id, live or not (for tests and diagnostics)."""
        return self._owner.get(session_id)

    # -- internals ----------------------------------------------------------

    def _next_server(self) -> MemberRecord:
        candidates = sorted(
            member_id
            for member_id, record in self._members.items()
            if record.role == Role.SERVER and record.accepting
        )
        if not candidates:
            raise Unavailable("no live session server")
        cursor = self._last_assigned
        chosen = next((c for c in candidates if cursor is None or c > cursor), candidates[0])
        self._last_assigned = chosen
        return self._members[chosen]

    def _assign(self, session_id: str, member_id: str) -> None:
        previous = self._owner.get(session_id)
        if previous is not None:
            self._unindex(session_id, previous)
        self._owner[session_id] = member_id
        self._owned.setdefault(member_id, set()).add(session_id)

    def _unindex(self, session_id: str, member_id: str) -> None:
        owned = self._owned.get(member_id)
        if owned is None:
            return
        owned.discard(session_id)
        if not owned:
            del self._owned[member_id]
            self._departed.pop(member_id, None)

    def _drop(self, member_id: str, reason: str) -> bool:
        record = self._members.pop(member_id, None)
        if record is None:
            return False
        owned = len(self._owned.get(member_id, ()))
        if owned:
            # Kept, not reassigned now: each moves lazily on its next route
            # (with a shared store), and the member gets them back if it
            # re-registers first.
            self._departed[member_id] = (self._clock(), record)
        log.info(
            "member dropped (%s): %s role=%s owned_sessions=%d",
            reason,
            member_id,
            record.role.name.lower(),
            owned,
        )
        return True

    def _forget_sessions_of(self, member_id: str) -> None:
        for session_id in self._owned.pop(member_id, set()):
            self._owner.pop(session_id, None)
        self._departed.pop(member_id, None)
