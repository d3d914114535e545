"""What turns may hold on this server: the checks that refuse a turn with
429 (Retry-After) before its stream starts.

Turns running here at once, messages waiting on one session, turns of one
principal (here, or with Redis in the whole mesh: a ``TurnLease`` each),
and the bytes of messages and files that turns running or waiting hold, per
session and per principal. The counts per principal are the ones
``SessionTurns`` keeps as its turns come and go.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from turnmesh.runtime.errors import ResourceExhausted, TurnQuotaExceeded
from turnmesh.runtime.principals import principal_of, public_id
from turnmesh.server.config import SessionLimits
from turnmesh.server.sessions.turns import SessionTurns

if TYPE_CHECKING:
    from turnmesh.server.mesh.limits import TurnLease, TurnLeases


class TurnQuotas:
    """The limits of ``SessionLimits`` that turns count against."""

    def __init__(
        self,
        limits: SessionLimits,
        running: Callable[[], int],
        leases: TurnLeases | None = None,
    ) -> None:
        self._limits = limits
        self._running = running  # turns running here (the runner's count)
        # Set when the turn quota is the whole mesh's (Redis): its leases.
        self._leases = leases
        # Turns running or queued here, per principal (its turn quota).
        self.in_flight: Counter[str] = Counter()
        # Bytes of messages and files those turns hold, per principal.
        self.held_bytes: Counter[str] = Counter()

    def check(self, turns: SessionTurns, size: int) -> None:
        """Refuse a new turn of ``size`` bytes on the session; never awaits."""
        limits = self._limits
        if self._running() >= limits.max_turns_in_flight:
            raise ResourceExhausted(
                f"this server runs its maximum of {limits.max_turns_in_flight} turns"
            )
        if turns.queued >= limits.max_queued_per_session:
            raise ResourceExhausted(
                f"session {public_id(turns.session_id)!r} has {turns.queued} messages"
                " waiting already"
            )
        quota = limits.max_turns_per_principal
        principal = principal_of(turns.session_id)
        if quota is not None and self._leases is None and self.in_flight[principal] >= quota:
            raise TurnQuotaExceeded(
                f"this caller has its maximum of {quota} turns running or waiting here"
            )
        self.check_bytes(turns, size)

    def check_bytes(self, turns: SessionTurns, size: int) -> None:
        """Refuse ``size`` more bytes on the session: past its budget, or its
        principal's."""
        if turns.pending_bytes + size > self._limits.max_pending_bytes_per_session:
            raise ResourceExhausted(
                f"session {public_id(turns.session_id)!r} holds"
                f" {turns.pending_bytes // 2**20} MiB of turns running or waiting already"
            )
        budget = self._limits.max_pending_bytes_per_principal
        if self.held_bytes[principal_of(turns.session_id)] + size > budget:
            raise TurnQuotaExceeded(
                f"this caller's turns running or waiting here hold {budget // 2**20} MiB already"
            )

    async def lease(self, principal: str) -> TurnLease | None:
        """A place in the principal's turn quota of the whole mesh (None
        when the quota is this server's, counted in ``check``)."""
        quota = self._limits.max_turns_per_principal
        if quota is None or self._leases is None:
            return None
        lease = await self._leases.take(principal, quota)
        if lease is None:
            raise TurnQuotaExceeded(
                f"this caller has its maximum of {quota} turns running or waiting in the mesh"
            )
        return lease
