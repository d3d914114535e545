"""The session server's local operations, over the sessions this server owns.

The servicer decides where a call runs (here, or forwarded to the owner);
everything here is the owner's side.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from google.protobuf import json_format, struct_pb2, timestamp_pb2

from turnmesh.runtime import metrics
from turnmesh.runtime.errors import (
    AlreadyExists,
    FieldViolation,
    IdempotencyKeyReused,
    InvalidArgument,
    NoLiveWorker,
    NotFound,
    ResourceExhausted,
    TurnAlreadyFinished,
    Unavailable,
)
from turnmesh.runtime.ids import new_id
from turnmesh.runtime.principals import principal_of, public_id
from turnmesh.server.config import SessionLimits
from turnmesh.server.mesh.ownership import SessionOwnership
from turnmesh.server.sessions import pauses, turn_records
from turnmesh.server.sessions.admission import Admission
from turnmesh.server.sessions.eventlog import EventLogs, TurnLog, recorded
from turnmesh.server.sessions.quotas import TurnQuotas
from turnmesh.server.sessions.recorded import RecordedTurns
from turnmesh.server.sessions.runner import TurnRunner
from turnmesh.server.sessions.turns import CancelReason, KeyUse, PendingTurn, SessionTurns
from turnmesh.server.stores.base import SessionRecord, SessionStore, now, session_quota_exceeded
from turnmesh.server.stores.listing import FILTER_BATCH, SCAN_BUDGET, Filters, Page, Position
from turnmesh.server.webhooks.sender import WebhookSender
from turnmesh.server.workers.pool import WorkerPool
from turnmesh.server.workers.readiness import AgentReadiness
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb

if TYPE_CHECKING:
    from turnmesh.server.mesh.limits import TurnLeases

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KeyedTurn:
    """The turn a request's idempotency key named before the request was
    placed, and its log (None once its events are gone)."""

    use: KeyUse
    log: TurnLog | None
    # Its events went early (the server's budget for them): it finished.
    dropped_early: bool

    @property
    def runs_again(self) -> bool:
        """It changed nothing (failed, cancelled, or its events expired): a
        retry runs the turn again (the key then names the new one)."""
        if self.log is None:
            return not self.dropped_early
        return self.log.done and self.log.state != spb.TURN_STATE_FINISHED


@dataclass(frozen=True)
class Health:
    """What GetHealth reports of the core."""

    default_agent: str
    agent_ready: bool
    sessions: int
    running_turns: int
    sessions_available: int


class SessionCore:
    def __init__(
        self,
        store: SessionStore,
        workers: WorkerPool,
        default_agent: str,
        limits: SessionLimits,
        ownership: SessionOwnership | None = None,
        turn_leases: TurnLeases | None = None,
        webhooks: WebhookSender | None = None,
    ) -> None:
        self.store = store
        self.workers = workers
        self.default_agent = default_agent
        # Whether a turn of the default agent can run now (the app feeds it
        # each list of the mesh's workers).
        self.readiness = AgentReadiness(default_agent)
        self.limits = limits
        # Turns' ends notified to the callers' URLs (None: none allowed).
        self.webhooks = webhooks
        # The records of background turns and of turns with a webhook:
        # written as each is accepted and, told by the event logs, as it ends.
        self.records = turn_records.TurnRecords(store, limits.turn_record_ttl_seconds, webhooks)
        self.logs = EventLogs(
            limits.event_log_max_events,
            limits.event_log_max_turns,
            limits.event_log_ttl_seconds,
            store,
            limits.event_log_max_bytes,
            on_recorded_end=self.records.turn_ended,
        )
        self._turns: dict[str, SessionTurns] = {}
        self.draining = False
        # Told when sessions are created here and when they go.
        self.ownership = ownership or SessionOwnership("")
        self.recorded = RecordedTurns(
            store, self.logs, self.records, self.ownership, self.get_record
        )
        # A turn whose commit was fenced off: the session is no longer ours.
        self.runner = TurnRunner(
            store,
            workers,
            on_lost=self.ownership.release,
            principal_label=limits.metrics_principal_label,
            pause_timeout_seconds=limits.pause_timeout_seconds,
        )
        # With Redis the turn quota is the whole mesh's: ``turn_leases``.
        self.quotas = TurnQuotas(limits, lambda: self.runner.inflight, turn_leases)

    # Sessions ---------------------------------------------------------------

    async def require_agent(self, agent_name: str) -> str:
        """The agent a new session binds to: NotFound if no worker of it was
        ever seen, NoLiveWorker if none is live now."""
        agent = agent_name or self.default_agent
        await self._require_worker(agent, known=agent == self.default_agent)
        return agent

    async def create_session(
        self,
        session_id: str,
        agent_name: str,
        metadata: struct_pb2.Struct,
        messages: list[message_pb2.Message] | None = None,
        webhook_url: str = "",
    ) -> spb.Session:
        try:
            return await self._create(session_id, agent_name, metadata, messages, webhook_url)
        except AlreadyExists:
            raise
        except Exception:
            # Refused (full, no agent, store down): the route given for it goes too.
            await self.ownership.unassign(session_id)
            raise

    async def check_capacity(self, principal: str) -> None:
        """Refuse a create at once when a store every server shares is full,
        or holds the principal's quota (its counts are the mesh's): no route
        is asked for, none is left."""
        if self.store.shared:
            await self._has_room(principal)

    async def _has_room(self, principal: str) -> None:
        if await self.store.count() >= self.limits.max_sessions:
            raise ResourceExhausted(
                f"the mesh holds its maximum of {self.limits.max_sessions} sessions"
                if self.store.shared
                else f"this server holds its maximum of {self.limits.max_sessions} sessions"
            )
        quota = self.limits.max_sessions_per_principal
        if quota is not None and await self.store.count_of(principal) >= quota:
            raise session_quota_exceeded(quota)

    async def _create(
        self,
        session_id: str,
        agent_name: str,
        metadata: struct_pb2.Struct,
        messages: list[message_pb2.Message] | None,
        webhook_url: str,
    ) -> spb.Session:
        # webhook_url was checked by the service before the create was routed.
        agent = await self.require_agent(agent_name)
        if not self.store.shared:  # a shared store's counts were checked before routing
            await self._has_room(principal_of(session_id))
        t = now()
        record = SessionRecord(
            session_id=session_id or new_id(),
            agent_name=agent,
            created_at=t,
            last_activity=t,
            metadata=json_format.MessageToDict(metadata),
            owner=self.ownership.new_token(),
            webhook_url=webhook_url,
        )
        if messages and (pause := pauses.seeded(messages, self.limits.pause_timeout_seconds)):
            record.pause = pause.SerializeToString()
        # Checked again as it is written: creates racing at the quota never both pass.
        await self.store.create(record, messages, self.limits.max_sessions_per_principal)
        self.ownership.claim(record.session_id, record.owner)
        self._count_sessions(await self.store.count())
        return self._to_proto(record)

    async def get_record(self, session_id: str) -> SessionRecord:
        record = await self.store.get(session_id)
        if record is None:
            self.ownership.release(session_id)
            raise NotFound(f"session {public_id(session_id)!r} not found")
        return record

    async def holds(self, session_id: str) -> bool:
        """Whether this server's store has the session."""
        return await self.store.get(session_id) is not None

    async def get_session(self, session_id: str) -> spb.Session:
        return self._to_proto(await self.get_record(session_id))

    async def delete_session(self, session_id: str) -> bool:
        turns = self._turns.pop(session_id, None)
        if turns is not None:
            turns.cancel_all(CancelReason.SESSION_DELETED)
        self.logs.drop_session(session_id)
        self.workers.forget_session(session_id)
        deleted = await self.store.delete(session_id)
        await self.ownership.drop(session_id)
        self._count_sessions(await self.store.count())
        return deleted

    def _idle_until(self, record: SessionRecord, pause: message_pb2.Pause | None = None) -> float:
        """When the session expires for idleness: the TTL after its last
        activity, or after the end of a pause it waits in (not cancelled:
        the cancel was activity). ``pause``: the record's, if parsed."""
        since = record.last_activity
        if pause is None:
            pause = pauses.parse(record.pause)
        if pause is not None and not pause.cancelled:
            since = max(since, pause.expire_time.ToNanoseconds() / 1e9)
        return since + self.limits.session_ttl_seconds

    async def history(self, session_id: str) -> list[message_pb2.Message]:
        return await self.store.history(session_id)

    async def expire_idle(self) -> list[str]:
        """Delete sessions idle for longer than the TTL and with no turn running."""
        cutoff = now() - self.limits.session_ttl_seconds
        expired = []
        for session_id in await self.store.idle_sessions(cutoff):
            turns = self._turns.get(session_id)
            if turns is not None and turns.busy:
                continue
            # In a shared store, its owner expires it (and forgets it whole).
            if not await self.ownership.may_expire(session_id):
                continue
            # A session that waits for the client stays until its wait ends,
            # and its idle time counts from then (a late answer is told the
            # pause expired; the next turn tells the agent).
            record = await self.store.get(session_id)
            if record is not None and self._idle_until(record) > now():
                continue
            await self.delete_session(session_id)
            expired.append(session_id)
        return expired

    # Turns ------------------------------------------------------------------

    async def start_background_turn(self, admission: Admission) -> spb.Turn:
        """Place a turn as ``start_turn`` does (a background admission: it
        runs to its end with no caller), recorded in the store before this
        answers: the turn as it was accepted."""
        return turn_records.of_log(await self.start_turn(admission))

    async def get_turn(self, session_id: str, turn_id: str) -> spb.Turn:
        return await self.recorded.get(session_id, turn_id)

    async def start_turn(self, admission: Admission) -> TurnLog:
        """Place a turn of the session under its policy; returns the log its
        caller follows. A background turn, and one with a webhook, is
        recorded in the store before this returns."""
        if admission.webhook_url:
            self.check_webhook(admission.principal, admission.webhook_url)
        tlog = await self._start_turn(admission)
        if recorded(tlog):
            # Its state now (an idempotent retry's turn may have ended
            # already): a record that says it ended is final, so this never
            # undoes the end that the turn's own end writes meanwhile.
            await self.records.save(tlog.session_id, turn_records.of_log(tlog))
        return tlog

    def webhook_allowed(self, principal: str, url: str) -> bool:
        return self.webhooks is not None and self.webhooks.allows(principal, url)

    def check_webhook(self, principal: str, url: str) -> None:
        """The principal's webhooks may go to ``url`` (its keys-file list, or
        the server's), else InvalidArgument on ``webhook_url``."""
        if self.webhooks is None or not self.webhooks.enabled:
            raise InvalidArgument([FieldViolation("webhook_url", "this server sends no webhooks")])
        self.webhooks.check(principal, url, "webhook_url")

    async def _start_turn(self, admission: Admission) -> TurnLog:
        if self.draining:
            raise Unavailable("this server is shutting down; retry on another")
        known = self._turns.get(admission.session_id)
        # No turns known here yet: any made while the record is read start at 0.
        read_at = known.pause_version if known is not None else 0
        record = await self.get_record(admission.session_id)
        fence = self.ownership.fence(record.session_id, record.owner)
        turns = self._session_turns(record)
        # A turn that committed here while the record was read: it is newer.
        turns.sync_pause(record.pause, read_at if known is None or turns is known else None)
        keyed = await self._keyed_turn(turns, admission)
        lease = None
        if keyed is None or keyed.runs_again:
            # A new turn (unless one with the key arrives meanwhile): a
            # worker for it, and with Redis its place in the mesh's quota
            # first, so that the decision below never awaits.
            await self._require_worker(record.agent_name)
            lease = await self.quotas.lease(admission.principal)
        try:
            placed = self._place(record, turns, admission, keyed, fence)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        # Before any await: the turn may end (and be recorded) meanwhile. A
        # turn joined (COLLECT) keeps the webhook it had, if any.
        placed_log = placed.log if isinstance(placed, PendingTurn) else placed
        placed_log.background |= admission.background
        placed_log.webhook = placed_log.webhook or admission.webhook_url or record.webhook_url
        if lease is not None:
            if isinstance(placed, PendingTurn) and placed.on_end is None:
                placed.on_end = lease.release  # a new turn: it holds the lease
            else:
                lease.release()  # joined a turn that holds its own
        if not isinstance(placed, PendingTurn):
            return placed
        turn = placed
        try:
            if key := admission.idempotency_key:
                use = KeyUse(turn.turn_id, admission.digest)
                await self.store.set_key(record.session_id, key, use.encode())
            await self.store.touch(record.session_id, now())
        except Unavailable:
            # The turn runs already: its caller follows it rather than retry
            # it elsewhere (the key is known here; the commit still fences).
            log.warning("could not record turn %s's key or activity", turn.turn_id)
        return turn.log

    async def _keyed_turn(self, turns: SessionTurns, admission: Admission) -> KeyedTurn | None:
        """The turn the request's idempotency key named before it came (here
        or in the store), with its log if its events are still kept."""
        key = admission.idempotency_key
        if not key:
            return None
        use = turns.turn_for_key(key) or await self._stored_key(turns.session_id, key)
        if use is None:
            return None
        _same_request(use, admission.digest, key)
        try:
            tlog = await self.logs.find(turns.session_id, use.turn_id)
        except NotFound:
            dropped = self.logs.finished_early_dropped(turns.session_id, use.turn_id)
            return KeyedTurn(use, None, dropped)
        return KeyedTurn(use, tlog, False)

    def _place(
        self,
        record: SessionRecord,
        turns: SessionTurns,
        admission: Admission,
        keyed: KeyedTurn | None,
        fence: str,
    ) -> PendingTurn | TurnLog:
        """The one decision on a turn request, after the last await: the turn
        its idempotency key names (that turn's log), or a new turn placed
        under the session's policy, unless a limit refuses it (HTTP 429,
        Retry-After). Never awaits, so nothing changes meanwhile."""
        if keyed is not None and not keyed.runs_again:
            if keyed.log is None:
                # Its events went early (the server's budget for them);
                # running it again would answer twice.
                raise TurnAlreadyFinished(
                    f"turn {keyed.use.turn_id!r} with this idempotency key finished; its events"
                    " are no longer kept (the session's history has its messages)"
                )
            turns.rejoin(keyed.use.turn_id)
            return keyed.log
        # A request that waited for the store counts against the limits even
        # if the same key arrived meanwhile, as the mesh-wide lease it took does.
        self.quotas.check(turns, admission.size)
        key = admission.idempotency_key
        arrived = turns.turn_for_key(key) if key else None
        if arrived is not None and (keyed is None or arrived.turn_id != keyed.use.turn_id):
            # The same key arrived (and was submitted) while we looked in the store.
            _same_request(arrived, admission.digest, key)
            turns.rejoin(arrived.turn_id)
            return self.logs.get(record.session_id, arrived.turn_id)
        return turns.submit(admission, fence, webhook=admission.webhook_url or record.webhook_url)

    async def _require_worker(self, agent: str, *, known: bool = True) -> None:
        """A live worker of ``agent``, or NoLiveWorker; NotFound if no worker
        of it was ever seen and it is not ``known`` (a session's agent is)."""
        if not self.workers.has_agent(agent):
            await self.workers.refresh()
            if not self.workers.has_agent(agent):
                if known or self.workers.knows_agent(agent):
                    raise NoLiveWorker(f"no live worker serves agent {agent!r} now; retry")
                raise NotFound(f"no agent named {agent!r} is served by this mesh")

    def refuse_over_budget(self, session_id: str, size: int) -> None:
        """429 at once if a request of ``size`` bytes would take a session
        with turns here, or its principal, past its byte budget: before the
        request's files are read or copied (``start_turn`` checks again)."""
        turns = self._turns.get(session_id)
        if turns is not None:
            self.quotas.check_bytes(turns, size)

    async def _stored_key(self, session_id: str, key: str) -> KeyUse | None:
        stored = await self.store.get_key(session_id, key)
        return KeyUse.decode(stored) if stored else None

    def _session_turns(self, record: SessionRecord) -> SessionTurns:
        turns = self._turns.get(record.session_id)
        if turns is None:
            turns = SessionTurns(
                record.session_id,
                record.agent_name,
                self.runner,
                self.logs,
                self.quotas.in_flight,
                self.quotas.held_bytes,
            )
            self._turns[record.session_id] = turns
        return turns

    async def cancel_turn(
        self, session_id: str, turn_id: str, reason: CancelReason = CancelReason.CANCELLED
    ) -> spb.TurnState.ValueType:
        if (cancelled := await self._cancel_pause(session_id, turn_id)) is not None:
            return cancelled
        tlog = await self.logs.find(session_id, turn_id)
        if tlog.done:
            return tlog.state
        turns = self._turns.get(session_id)
        if turns is None:
            raise NotFound(f"turn {turn_id!r} of session {public_id(session_id)!r} not found")
        return turns.cancel(turn_id, reason)

    async def _cancel_pause(self, session_id: str, turn_id: str) -> spb.TurnState.ValueType | None:
        """CancelTurn of a turn that left the session waiting: the wait ends
        (stored before any later turn runs), and the next turn tells the
        agent its calls and interrupts went unanswered. None if the turn
        left no pause that waits."""
        known = self._turns.get(session_id)
        read_at = known.pause_version if known is not None else 0
        record = await self.get_record(session_id)
        pause = pauses.active(record.pause)
        if pause is None or pause.turn_id != turn_id:
            return None
        turns = self._session_turns(record)
        turns.sync_pause(record.pause, read_at if known is None or turns is known else None)
        fence = self.ownership.fence(record.session_id, record.owner)

        async def write(cancelled: message_pb2.Pause) -> None:
            await self.store.set_pause(session_id, cancelled.SerializeToString(), now(), fence)

        written = turns.cancel_pause(turn_id, write)
        if written is None:
            return None
        await written
        return spb.TURN_STATE_CANCELLED

    async def subscribe(
        self, session_id: str, turn_id: str, after_seq: int
    ) -> AsyncGenerator[event_pb2.Event, None]:
        """A turn's events after ``after_seq``, replayed then live (from the
        store if another server ran it)."""
        return self.follow(await self.logs.find(session_id, turn_id), after_seq, False)

    async def subscribe_batches(
        self, session_id: str, turn_id: str, after_seq: int
    ) -> AsyncGenerator[list[event_pb2.Event], None]:
        """``subscribe``'s events in batches (``TurnLog.follow_batches``)."""
        return self.follow_batches(await self.logs.find(session_id, turn_id), after_seq, False)

    def follow(
        self, tlog: TurnLog, after_seq: int, on_disconnect_cancel: bool
    ) -> AsyncGenerator[event_pb2.Event, None]:
        """The turn's events for one caller (no generator of its own: one
        layer less per event on the hottest path)."""
        return tlog.follow(
            after_seq, self.limits.keepalive_seconds, self._abandoner(tlog, on_disconnect_cancel)
        )

    def follow_batches(
        self, tlog: TurnLog, after_seq: int, on_disconnect_cancel: bool
    ) -> AsyncGenerator[list[event_pb2.Event], None]:
        """``follow``'s events in batches: every event ready when the caller
        asks for more (``TurnLog.follow_batches``)."""
        return tlog.follow_batches(
            after_seq, self.limits.keepalive_seconds, self._abandoner(tlog, on_disconnect_cancel)
        )

    def _abandoner(self, tlog: TurnLog, on_disconnect_cancel: bool) -> Callable[[], None] | None:
        """What runs when a caller who asked for that leaves the turn early."""
        if not on_disconnect_cancel:
            return None

        def abandoned() -> None:
            turns = self._turns.get(tlog.session_id)
            if turns is not None:
                log.info("a client left turn %s and asked to cancel it", tlog.turn_id)
                turns.caller_left(tlog.turn_id)

        return abandoned

    async def list_sessions(
        self, principal: str, before: Position | None, size: int, wanted: Filters
    ) -> Page[spb.Session]:
        """A page of the principal's sessions in this server's store, those
        the filters keep; looks at no more than ``SCAN_BUDGET`` sessions past
        a full page's worth (the page may then hold fewer, with a token)."""
        items: list[tuple[Position, spb.Session]] = []
        cursor, scanned = before, 0
        # Filters skip most sessions: read them in larger batches.
        batch_size = size if wanted == Filters() else FILTER_BATCH
        while True:
            batch = await self.store.list_sessions(principal, cursor, batch_size)
            for index, (at, record) in enumerate(batch.items):
                scanned += 1
                if not wanted.match(record.agent_name, record.metadata):
                    continue
                items.append((at, self._to_proto(record)))
                if len(items) == size:
                    last = index == len(batch.items) - 1 and batch.frontier is None
                    return Page(items, None if last else at)
            if batch.frontier is None:
                return Page(items, None)
            cursor = batch.frontier
            if scanned >= SCAN_BUDGET:
                return Page(items, cursor)

    @property
    def running_turns(self) -> int:
        return self.runner.inflight

    async def health(self) -> Health:
        sessions = await self.store.count()
        return Health(
            default_agent=self.default_agent,
            agent_ready=self.readiness.ready,
            sessions=sessions,
            running_turns=self.runner.inflight,
            sessions_available=self._count_sessions(sessions),
        )

    def _count_sessions(self, sessions: int) -> int:
        """Record the count; the sessions that can still be created."""
        available = max(0, self.limits.max_sessions - sessions)
        metrics.ACTIVE_SESSIONS.set(sessions)
        metrics.SESSIONS_AVAILABLE.set(available)
        return available

    async def drain(self, timeout: float) -> None:
        """Refuse new turns, then wait for running and queued ones to end."""
        self.draining = True
        waits = [t.wait_idle() for t in self._turns.values() if t.busy]
        if waits:
            log.info("draining %d sessions with turns in flight", len(waits))
            _, pending = await asyncio.wait(
                [asyncio.ensure_future(w) for w in waits], timeout=timeout
            )
            for turns in self._turns.values():
                turns.cancel_all(CancelReason.SHUTDOWN)
            if pending:
                await asyncio.wait(pending, timeout=2)
        await self.records.flush()  # background turns' ends, before the store closes

    # Conversion -------------------------------------------------------------

    def _to_proto(self, record: SessionRecord) -> spb.Session:
        turns = self._turns.get(record.session_id)
        running = turns.running if turns else None
        session = spb.Session(
            session_id=public_id(record.session_id),
            agent_name=record.agent_name,
            message_count=record.message_count,
            turn_running=running is not None,
            running_turn_id=running.turn_id if running else "",
            webhook_url=record.webhook_url,
        )
        session.created_at.CopyFrom(_ts(record.created_at))
        session.last_activity.CopyFrom(_ts(record.last_activity))
        stored = pauses.parse(record.pause)  # once: every listing row passes here
        session.expire_time.CopyFrom(_ts(self._idle_until(record, stored)))
        if record.metadata:
            json_format.ParseDict(record.metadata, session.metadata)
        # Waiting: no turn runs or waits to run here, and the stored pause
        # has neither expired nor been cancelled.
        idle = not (turns is not None and turns.busy)
        if idle and stored is not None and not pauses.expired(stored):
            session.pause.CopyFrom(stored)
            session.pause.ClearField("agent_checkpoint")  # the agent's own, never shown
        return session


def _same_request(use: KeyUse, digest: str, key: str) -> None:
    if use.digest and use.digest != digest:
        raise IdempotencyKeyReused(
            f"idempotency key {key!r} was used for turn {use.turn_id!r} with a different"
            " request; use a new key for a new request"
        )


def _ts(seconds: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts
