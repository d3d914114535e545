"""What GetTurn reports of a turn, and the durable records of background turns.

A turn is described by its events while they are kept: its state, when it
started and ended (RUN_STARTED's and the terminal event's timestamps), its
usage, outcome or error. A background turn (StartTurn) also gets a record in
the session store, written when it is accepted and when it ends, which is kept
longer than its events (``--turn-record-ttl``). The record's end and the
turn's commit are two writes: until a record says the turn ended, the events
(and the commit status the store keeps beside them) decide, and a reader that
learns how the turn ended writes it to the record.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf import json_format, message, timestamp_pb2

from turnmesh.runtime import metrics
from turnmesh.runtime.errors import Unavailable
from turnmesh.runtime.principals import principal_of, public_id
from turnmesh.runtime.turn_errors import STOPPED_CODES, TurnError
from turnmesh.server.sessions.eventlog import TurnLog
from turnmesh.server.stores.base import SessionStore
from turnmesh.server.webhooks.outbox import MAX_NOTICE_BYTES, OutboxUnavailable
from turnmesh.server.webhooks.sender import WebhookSender
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb

log = logging.getLogger(__name__)

ENDED = frozenset({spb.TURN_STATE_FINISHED, spb.TURN_STATE_FAILED, spb.TURN_STATE_CANCELLED})
# RUN_ERROR codes of a turn that was cancelled (``turns.CancelReason``), not failed.
CANCELLED_CODES = STOPPED_CODES | {TurnError.SHUTDOWN.code}
# How long a draining server waits for the records of turns that just ended.
FLUSH_SECONDS = 5.0
# A turn's record, and its notice's data, at most, as protobuf and as JSON
# (the notice's envelope around it is far less than the room left).
MAX_TURN_BYTES = MAX_NOTICE_BYTES - 1024
# What a turn cut to fit keeps of each of its texts.
CUT_TEXT_CHARS = 1_000


def ended(turn: spb.Turn) -> bool:
    return turn.state in ENDED


def of_log(tlog: TurnLog, record: spb.Turn | None = None) -> spb.Turn:
    """The turn as its log tells it; ``record``: its stored record, for what
    a log rebuilt from another server's events does not know."""
    turn = spb.Turn(
        turn_id=tlog.turn_id,
        session_id=public_id(tlog.session_id),
        background=tlog.background or (record is not None and record.background),
        last_seq=tlog.last_seq,
        webhook_url=tlog.webhook or (record.webhook_url if record is not None else ""),
    )
    if tlog.started_ms:
        turn.start_time.CopyFrom(_from_ms(tlog.started_ms))
    if not tlog.restored:
        turn.create_time.CopyFrom(_from_ms(tlog.created_ms))
    elif record is not None and record.HasField("create_time"):
        turn.create_time.CopyFrom(record.create_time)
    elif tlog.started_ms:
        turn.create_time.CopyFrom(turn.start_time)
    end = tlog.end_event
    if end is None:
        turn.state = tlog.state
        return turn
    turn.end_time.CopyFrom(_from_ms(end.timestamp))
    if end.type == event_pb2.RUN_FINISHED:
        turn.state = spb.TURN_STATE_FINISHED
        turn.usage.extend(end.usage)
        if end.HasField("outcome"):
            turn.outcome.CopyFrom(end.outcome)
        return turn
    turn.state = spb.TURN_STATE_CANCELLED if end.code in CANCELLED_CODES else spb.TURN_STATE_FAILED
    turn.error_code = end.code
    turn.error_message = end.message
    if end.HasField("problem"):
        turn.problem.CopyFrom(end.problem)
    return turn


def notice_type(turn: spb.Turn) -> str:
    """The webhook notice of a turn that ended."""
    if turn.state == spb.TURN_STATE_FINISHED:
        waits = turn.outcome.interrupts or turn.outcome.pending_tool_call_ids
        return "turn.waiting" if waits else "turn.finished"
    return "turn.cancelled" if turn.state == spb.TURN_STATE_CANCELLED else "turn.failed"


def turn_json(turn: spb.Turn) -> dict[str, Any]:
    """The turn as GetTurn's REST answer shows it."""
    return json_format.MessageToDict(turn)


def bounded(turn: spb.Turn) -> tuple[spb.Turn, bool]:
    """The turn within ``MAX_TURN_BYTES``, and whether it was cut to fit (an
    agent's interrupts carry JSON of its own making, an error its text).
    What goes, step by step, until it fits: its outcome's interrupts'
    ``response_schema`` and ``metadata`` (the session's pause keeps them
    whole while it waits); then its texts past ``CUT_TEXT_CHARS`` (error,
    problem, interrupt messages); then its outcome's lists, problem and
    usage, leaving its ids, state, times, error code and outcome type."""
    if _size(turn) <= MAX_TURN_BYTES:
        return turn, False
    cut = spb.Turn()
    cut.CopyFrom(turn)
    for interrupt in cut.outcome.interrupts:
        interrupt.ClearField("response_schema")
        interrupt.ClearField("metadata")
    if _size(cut) <= MAX_TURN_BYTES:
        return cut, True
    cut.error_message = _shorten(cut.error_message)
    if cut.HasField("problem"):
        for name in ("type", "title", "detail"):
            setattr(cut.problem, name, _shorten(getattr(cut.problem, name)))
    for interrupt in cut.outcome.interrupts:
        interrupt.message = _shorten(interrupt.message)
    if _size(cut) <= MAX_TURN_BYTES:
        return cut, True
    kept = spb.Turn()
    for name in ("turn_id", "session_id", "state", "background", "last_seq", "webhook_url"):
        setattr(kept, name, getattr(cut, name))
    for stamp in ("create_time", "start_time", "end_time"):
        if cut.HasField(stamp):
            getattr(kept, stamp).CopyFrom(getattr(cut, stamp))
    kept.error_code = _shorten(cut.error_code, 100)
    kept.error_message = cut.error_message
    if cut.HasField("outcome"):
        kept.outcome.type = _shorten(cut.outcome.type, 100)
    return kept, True


def _size(turn: spb.Turn) -> int:
    # Either form may be the larger: JSON spells out names, protobuf frames
    # each value of a Struct.
    as_json = json.dumps(turn_json(turn), separators=(",", ":"))
    return max(turn.ByteSize(), len(as_json.encode()))


def _shorten(text: str, chars: int = CUT_TEXT_CHARS) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "\u2026"


def committed(
    record: spb.Turn, messages: list[message_pb2.Message], pause: message_pb2.Pause | None = None
) -> spb.Turn:
    """A turn whose commit is known while its events are not: FINISHED, with
    the usage and time its last message in the history carries, and, if the
    session's pause is the turn's, what it waits for."""
    turn = spb.Turn()
    turn.CopyFrom(record)
    turn.state = spb.TURN_STATE_FINISHED
    if pause is not None and pause.turn_id == record.turn_id:
        turn.outcome.CopyFrom(
            event_pb2.RunOutcome(
                type="interrupt" if pause.interrupts else "success",
                interrupts=pause.interrupts,
                pending_tool_call_ids=[call.id for call in pause.tool_calls],
            )
        )
    if messages:
        last = messages[-1]
        if last.HasField("usage"):
            turn.usage.append(last.usage)
        if last.HasField("created_at"):
            turn.end_time.CopyFrom(last.created_at)
    return turn


def lost(record: spb.Turn) -> spb.Turn:
    """A turn that the server which accepted it never finished: it stopped."""
    error = TurnError.OWNER_LOST.event("the server running this turn stopped; history is unchanged")
    turn = spb.Turn()
    turn.CopyFrom(record)
    turn.state = spb.TURN_STATE_FAILED
    turn.end_time.GetCurrentTime()
    turn.error_code = error.code
    turn.error_message = error.message
    turn.problem.CopyFrom(error.problem)
    return turn


class TurnRecords:
    """The session store's turn records, as protos, kept ``ttl_seconds``."""

    def __init__(
        self, store: SessionStore, ttl_seconds: float, webhooks: WebhookSender | None = None
    ) -> None:
        self._store = store
        self._ttl = ttl_seconds
        self._webhooks = webhooks
        # Told of each turn's end before its record says so (A2A pushes:
        # ``compat.a2a.push``); OutboxUnavailable or Unavailable leaves the
        # record open, to be ended (and told) again.
        self.on_end: Callable[[str, spb.Turn], Awaitable[None]] | None = None
        # The ends being written, by (session, turn): a reader waits for its
        # turn's, so it never settles a turn whose end is on its way.
        self._writing: dict[tuple[str, str], asyncio.Task[bool]] = {}

    async def save(self, session_id: str, turn: spb.Turn) -> bool:
        """Write the record (a record that says the turn ended is final);
        False if it was not written. A store that fails is logged: the record
        is what GetTurn reads once the events are gone, never a reason to
        fail the turn."""
        webhooks = self._webhooks
        kind = notice_type(turn)  # of the turn whole: a cut one may have lost what it waits for
        if ended(turn) and self.on_end is not None:
            try:
                await self.on_end(session_id, turn)
            except (OutboxUnavailable, Unavailable):
                log.warning(
                    "turn %s's end not recorded: its pushes could not be queued", turn.turn_id
                )
                return False
        turn, cut = bounded(turn)
        if ended(turn) and turn.webhook_url and webhooks is not None and webhooks.enabled:
            # Queued before the record's end, under the turn's own id: a
            # crash between the two loses nothing, and every writer of the
            # end (the owner, a reader that settles a lost turn) queues the
            # same notice, which the outbox keeps once. Whatever this
            # server's allow-list says: the delivering server checks its own
            # (one whose list differs, for a while, may send it).
            try:
                await webhooks.send(
                    turn.webhook_url,
                    kind,
                    turn_json(turn),
                    f"msg_{turn.turn_id}",
                    principal_of(session_id),
                    truncated=cut,
                )
            except OutboxUnavailable:
                # Not queued, though the outbox may take it later (a full
                # one drops it: nothing to wait for). The end stays
                # unwritten, since an ended record is final and no one would
                # queue its notice again: the sweep, or a GetTurn once this
                # server's log of the turn is gone, writes it and queues the
                # notice then.
                log.warning(
                    "turn %s's end not recorded: its webhook could not be queued", turn.turn_id
                )
                return False
        try:
            with metrics.STORE_SECONDS.labels("put_turn").time():
                written = await self._store.put_turn(
                    session_id,
                    turn.turn_id,
                    turn.SerializeToString(),
                    ended=ended(turn),
                    ttl_seconds=self._ttl,
                )
        except Unavailable:
            log.warning(
                "could not record turn %s (%s)", turn.turn_id, spb.TurnState.Name(turn.state)
            )
            return False
        return written

    def writing(self, session_id: str, turn_id: str) -> bool:
        """Whether this server is writing the turn's end now."""
        return (session_id, turn_id) in self._writing

    async def load(self, session_id: str, turn_id: str) -> spb.Turn | None:
        """The stored record, once an end this server is writing is in it."""
        if (writing := self._writing.get((session_id, turn_id))) is not None:
            await asyncio.wait([writing])
        stored = await self._store.get_turn(session_id, turn_id)
        if not stored:
            return None
        try:
            return spb.Turn.FromString(stored)
        except message.DecodeError:
            # Not a record this mesh wrote (a damaged or foreign store): as
            # if there were none, so neither GetTurn nor a sweep fails on it.
            log.warning("turn %s has a record that does not parse; ignored", turn_id)
            return None

    def turn_ended(self, tlog: TurnLog) -> None:
        """A background turn ended here: its record's end, written in the
        background (the turn's end is not held up by it)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a synchronous caller (a unit test): nothing to write with
            return
        key = (tlog.session_id, tlog.turn_id)
        task = loop.create_task(
            self.save(tlog.session_id, of_log(tlog)), name=f"record-{tlog.turn_id}"
        )
        self._writing[key] = task
        task.add_done_callback(lambda done: self._written(key, done))

    def _written(self, key: tuple[str, str], task: asyncio.Task[bool]) -> None:
        if self._writing.get(key) is task:
            del self._writing[key]
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("could not record a turn's end", exc_info=exc)

    async def flush(self, timeout: float = FLUSH_SECONDS) -> None:
        """Wait for the records being written (a draining server)."""
        if self._writing:
            await asyncio.wait(set(self._writing.values()), timeout=timeout)


def _from_ms(ms: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromMilliseconds(int(ms))
    return ts
