"""Recorded turns read back: GetTurn's answer, and the sweep that settles
turns whose server died before it recorded their end.

A turn with a record (background, or with a webhook) is written as it is
accepted and as it ends (``turn_records``). A record that says it ended is
final; one that does not is settled here from what the store knows: the
turn's events, else its commit. Only the session's owner settles (a live
holder records its own turns' ends), and the answer is written back, so a
record never says "running" again and the turn's webhook is sent.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from turnmesh.runtime.errors import NotFound, Unavailable
from turnmesh.runtime.principals import public_id
from turnmesh.server.mesh.ownership import SessionOwnership
from turnmesh.server.sessions import turn_records
from turnmesh.server.sessions.eventlog import EventLogs
from turnmesh.server.stores.base import SessionStore
from turnmesh.v1 import message_pb2
from turnmesh.v1 import session_service_pb2 as spb

log = logging.getLogger(__name__)

# Open turn records looked at per page of a sweep, and pages per sweep
# (RecordedTurns.settle_open): a sweep's work is bounded, and the next one
# goes on from where it stopped, so records that stay open (running on live
# servers, or unreadable) never hide the ones behind them.
SWEEP_BATCH = 100
SWEEP_PAGES = 10


class RecordedTurns:
    """The recorded turns of the sessions this server owns."""

    def __init__(
        self,
        store: SessionStore,
        logs: EventLogs,
        records: turn_records.TurnRecords,
        ownership: SessionOwnership,
        require_session: Callable[[str], Awaitable[object]],
    ) -> None:
        self._store = store
        self._logs = logs
        self._records = records
        self._ownership = ownership
        # NotFound when the session is gone (``SessionCore.get_record``).
        self._require = require_session
        self._sweep_cursor = 0  # where settle_open goes on

    async def get(self, session_id: str, turn_id: str) -> spb.Turn:
        """A turn of the session: from this server's log of a turn it runs or
        ran, else its record, else the store's events; NotFound if none knows it.

        A record that says the turn ended is final. One that does not, for a
        turn this owner does not run, is settled by what the store knows: its
        events (a turn stored unfinished is given up for lost, atomically
        against its commit, as SubscribeTurn does), or, with none kept, its
        commit (its messages in the history). The answer is written to the
        record, so it never says "running" again."""
        tlog = self._logs.peek(session_id, turn_id)
        if tlog is not None and not tlog.restored:
            return turn_records.of_log(tlog)
        await self._require(session_id)  # NotFound for a missing session
        record = await self._records.load(session_id, turn_id)
        if record is not None and turn_records.ended(record):
            return record
        if tlog is None:
            try:
                tlog = await self._logs.find(session_id, turn_id)
            except NotFound:
                if record is None:
                    raise NotFound(
                        f"turn {turn_id!r} of session {public_id(session_id)!r} not found"
                    ) from None
        if tlog is not None:
            turn = turn_records.of_log(tlog, record)
            if record is not None and turn_records.ended(turn):
                await self._records.save(session_id, turn)
            return turn
        assert record is not None
        return await self._settle(session_id, record)

    async def settle_open(self, limit: int = SWEEP_BATCH, pages: int = SWEEP_PAGES) -> int:
        """Settle recorded turns whose server died before it recorded their
        end (no reader need ask for them first: their webhooks are sent now).
        Only turns of sessions placed here, and not running here: a live
        owner records its own turns' ends. At most ``pages`` pages of
        ``limit`` records, from where the last call stopped. How many were
        settled."""
        settled = 0
        for _ in range(pages):
            page, cursor = await self._store.open_turns(limit, self._sweep_cursor)
            done = 0
            for session_id, turn_id in page:
                done += await self._settle_open(session_id, turn_id)
            settled += done
            if cursor is None:  # the last page: the next sweep starts over
                self._sweep_cursor = 0
                break
            # Those settled left the open records: the next page is that
            # much nearer the start.
            self._sweep_cursor = max(0, cursor - done)
        return settled

    async def _settle_open(self, session_id: str, turn_id: str) -> bool:
        tlog = self._logs.peek(session_id, turn_id)
        if tlog is not None and not tlog.restored:
            if not tlog.done or self._records.writing(session_id, turn_id):
                return False  # it runs here, or its end is being recorded here
            # It ended here and its record is still open: writing the end
            # failed (its webhook could not be queued, say). Again, now.
            return await self._records.save(session_id, turn_records.of_log(tlog))
        # A log restored from the store (a SubscribeTurn found the turn lost)
        # records nothing by itself: settled here like any other.
        try:
            # Ours, or taken over from a holder whose lease lapsed; a live
            # holder records its own turns' ends.
            if not await self._ownership.holds_or_takes(session_id):
                return False
            if not turn_records.ended(await self.get(session_id, turn_id)):
                return False
            # Settled only if its end was written (its notice queued): one
            # that could not be stays open, where the next page begins.
            stored = await self._records.load(session_id, turn_id)
        except (NotFound, Unavailable):
            return False
        return stored is not None and turn_records.ended(stored)

    async def _settle(self, session_id: str, record: spb.Turn) -> spb.Turn:
        """A recorded turn that this owner does not run and that left no
        events: accepted by a server that stopped (or by this one before a
        restart). Given up for lost unless it committed."""
        turn_id = record.turn_id
        lost = await self._store.abandon_turn(session_id, turn_id)
        # The commit status expires with the events: the history says too.
        mine = [m for m in await self._store.history(session_id) if m.turn_id == turn_id]
        if mine or not lost:
            session = await self._store.get(session_id)
            pause = (
                message_pb2.Pause.FromString(session.pause) if session and session.pause else None
            )
            turn = turn_records.committed(record, mine, pause)
        else:
            log.info("background turn %s was lost with the server running it", turn_id)
            turn = turn_records.lost(record)
        await self._records.save(session_id, turn)
        return turn
