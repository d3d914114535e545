"""A session's turns under its policy: when each one runs.

A ``SessionTurns`` is the single place that decides when a session's turns
run. ``submit`` makes its decision without awaiting, so two requests can never
interleave; a drain task runs queued turns one after another on the
``TurnRunner`` (``turnmesh.server.sessions.runner``). A turn's history is appended only
when it finishes, so a failed, cancelled or interrupted turn leaves history
exactly as it was.

Who writes what: this module writes a turn's request (messages joined while
it is queued), its waiters, its task and why it was cancelled, and the log of
a turn that never started; the runner writes everything else once the turn
runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from google.protobuf import struct_pb2
from opentelemetry import context as otel_context
from opentelemetry import trace

from turnmesh.files import MAX_FILES, MAX_TOTAL_FILE_BYTES
from turnmesh.runtime import metrics, requests
from turnmesh.runtime.errors import NotFound, SessionBusy
from turnmesh.runtime.ids import new_id
from turnmesh.runtime.principals import principal_of, public_id
from turnmesh.runtime.turn_errors import TurnError
from turnmesh.server.sessions import answers, pauses
from turnmesh.server.sessions.admission import Admission
from turnmesh.server.sessions.eventlog import EventLogs, TurnLog
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb

MAX_IDEMPOTENCY_KEYS = 256

POLICY_LABELS = {
    spb.TURN_POLICY_REJECT: "reject",
    spb.TURN_POLICY_ENQUEUE: "enqueue",
    spb.TURN_POLICY_COLLECT: "collect",
    spb.TURN_POLICY_INTERRUPT: "interrupt",
}
COLLECTING = (spb.TURN_POLICY_COLLECT, spb.TURN_POLICY_UNSPECIFIED)


class CancelReason(enum.Enum):
    """Why a turn was cancelled: the RUN_ERROR it ends with."""

    CANCELLED = TurnError.CANCELLED
    INTERRUPTED = TurnError.INTERRUPTED
    DISCONNECTED = TurnError.DISCONNECTED
    SESSION_DELETED = TurnError.SESSION_DELETED
    SHUTDOWN = TurnError.SHUTDOWN

    def event(self) -> event_pb2.Event:
        error: TurnError = self.value
        return error.event(f"{error.title.lower()}; history is unchanged")


@dataclass
class PendingTurn:
    turn_id: str
    log: TurnLog
    messages: list[str]
    files: list[message_pb2.File]
    metadata: struct_pb2.Struct
    collecting: bool
    # Callers that submitted into this turn (more than one when coalesced).
    waiters: int = 0
    task: asyncio.Task[None] | None = None
    cancel_reason: CancelReason | None = None
    policy: str = "collect"
    # The owner token the session carried when the turn was placed: its
    # commit writes nothing if the session changed owner since.
    fence: str = ""
    # Bytes of its messages and files (budgets: ``pending_bytes``).
    size: int = 0
    # The trace of the call that created the turn; the worker call joins it.
    trace_context: otel_context.Context = field(default_factory=otel_context.get_current)
    # The edge's id of the request that created the turn, for its log line.
    request_id: str = field(default_factory=requests.current)
    # Called once the turn no longer counts as running or waiting (its
    # place in a quota the whole mesh shares: ``mesh.limits.TurnLease``).
    on_end: Callable[[], None] | None = None
    # The caller's tools for this turn.
    tools: list[message_pb2.ToolDefinition] = field(default_factory=list)
    # Its idempotency keys (a COLLECT batch may have several), as stored.
    keys: dict[str, str] = field(default_factory=dict)
    # What the turn answers the session's pause with (the client's answers,
    # or the server's for an expired or cancelled pause), and that pause.
    answers: answers.Answers = field(default_factory=answers.Answers)
    answering: message_pb2.Pause | None = None
    # The answers are the client's (not the server's for a pause that ended).
    client_answers: bool = False
    # Set by the runner when the turn commits: what the session waits for now.
    pause_after: message_pb2.Pause | None = None


def _fits(batch: PendingTurn, files: int, size: int) -> bool:
    """Whether a batch may take ``files`` more files in a request of ``size``
    bytes and stay within one turn's limits (its messages count as files)."""
    if len(batch.files) + files > MAX_FILES:
        return False
    return batch.size + size <= MAX_TOTAL_FILE_BYTES


class KeyUse(NamedTuple):
    """The turn an idempotency key names, and a digest of the request that
    first used it (a retry must send the same request)."""

    turn_id: str
    digest: str

    def encode(self) -> str:
        return f"{self.turn_id} {self.digest}"

    @classmethod
    def decode(cls, stored: str) -> KeyUse:
        turn_id, _, digest = stored.partition(" ")
        return cls(turn_id, digest)  # "" from an older server: not checked


class Runner(Protocol):
    """What SessionTurns needs of ``turnmesh.server.sessions.runner.TurnRunner``."""

    def run(
        self, session_id: str, agent_name: str, turn: PendingTurn
    ) -> Coroutine[Any, Any, None]: ...


class SessionTurns:
    """The turns of one session."""

    def __init__(
        self,
        session_id: str,
        agent_name: str,
        runner: Runner,
        logs: EventLogs,
        in_flight: Counter[str] | None = None,
        held_bytes: Counter[str] | None = None,
    ) -> None:
        self.session_id = session_id
        # Turns running or queued, per principal: this session's count there.
        self._in_flight = in_flight if in_flight is not None else Counter()
        # Bytes of messages and files those turns hold, here and per principal.
        self.pending_bytes = 0
        self._held_bytes = held_bytes if held_bytes is not None else Counter()
        self._principal = principal_of(session_id)
        self.agent_name = agent_name
        self._runner = runner
        self._logs = logs
        self.running: PendingTurn | None = None
        self._queue: deque[PendingTurn] = deque()
        self._drain_task: asyncio.Task[None] | None = None
        # idempotency key -> turn id, the most recent keys only.
        self._by_key: OrderedDict[str, KeyUse] = OrderedDict()
        self._turns: dict[str, PendingTurn] = {}
        # What the session waits for from the client (``server.sessions.pauses``):
        # the store's, read while no turn runs; this server's own view while
        # its turns run (it alone commits them).
        self.pause: message_pb2.Pause | None = None
        # Bumped by each change of the pause made here (a commit, a cancel):
        # a record read before one is older than what is known here.
        self.pause_version = 0
        # A cancelled pause being written: the next turn runs after it.
        self._pause_write: asyncio.Future[None] | None = None

    @property
    def busy(self) -> bool:
        return self.running is not None or bool(self._queue)

    @property
    def queued(self) -> int:
        """Messages waiting behind the running turn (each one of a
        coalesced batch counts)."""
        return sum(len(turn.messages) for turn in self._queue)

    def _hold(self, turn: PendingTurn, size: int) -> None:
        turn.size += size
        self.pending_bytes += size
        self._held_bytes[self._principal] += size
        metrics.PENDING_BYTES.inc(size)

    def sync_pause(self, stored: bytes, read_at: int | None = None) -> None:
        """The store's record of the pause, taken while no turn runs here,
        unless it was read (at ``pause_version`` ``read_at``) before a change
        made here since."""
        if read_at is not None and read_at != self.pause_version:
            return
        if not self.busy and self._pause_write is None:
            cached, self.pause = self.pause, pauses.parse(stored)
            if (
                self.pause is not None
                and cached is not None
                and cached.turn_id == self.pause.turn_id
                and not self.pause.agent_checkpoint
            ):
                # The store keeps the agent's checkpoint apart: the one this
                # server committed with the pause is still the pause's.
                self.pause.agent_checkpoint = cached.agent_checkpoint

    def cancel_pause(
        self, turn_id: str, write: Callable[[message_pb2.Pause], Coroutine[Any, Any, None]]
    ) -> asyncio.Future[None] | None:
        """Cancel the pause that ``turn_id`` left, if the session still waits
        for it: the pause is marked cancelled here at once (answers get 409,
        the next turn tells the agent), and ``write`` stores that before
        another turn runs. None if the turn left no pause that waits."""
        pause = self.pause
        if self.busy or pause is None or pause.turn_id != turn_id or pauses.expired(pause):
            return None
        cancelled = message_pb2.Pause()
        cancelled.CopyFrom(pause)
        cancelled.cancelled = True
        self.pause = cancelled
        self.pause_version += 1
        self._pause_write = asyncio.ensure_future(write(cancelled))
        self._pause_write.add_done_callback(self._pause_written)
        return self._pause_write

    def _pause_written(self, write: asyncio.Future[None]) -> None:
        if self._pause_write is write:
            self._pause_write = None

    def turn_for_key(self, key: str) -> KeyUse | None:
        """The turn a retried request with this idempotency key belongs to."""
        return self._by_key.get(key) if key else None

    def submit(self, admission: Admission, fence: str = "", *, webhook: str = "") -> PendingTurn:
        """Place the request under its policy. Never awaits: decisions are
        atomic. ``fence``: the owner token the session carried (its commit
        writes nothing if the session changed owner since); ``webhook``:
        where the turn's end is notified.

        A turn that answers the session's pause runs only on a session that
        waits, with no turn running or queued, whatever its policy; a plain
        turn on a session that waits gets 409 (one queued behind a turn that
        pauses ends with RUN_ERROR ``awaiting_client``)."""
        message, files, size = admission.message, admission.files, admission.size
        policy, given = admission.policy, admission.answers
        if given:
            if self.busy or self._pause_write is not None:
                raise SessionBusy(
                    f"session {public_id(self.session_id)!r} has a turn running; answers are"
                    " taken once it waits for them"
                )
            answers.check(self.session_id, self.pause, given)
        elif not self.busy and self.pause is not None and not pauses.expired(self.pause):
            raise pauses.refuse_plain_turn(self.session_id, self.pause)
        if policy == spb.TURN_POLICY_REJECT and self.busy:
            raise SessionBusy(f"session {public_id(self.session_id)!r} has a turn running")
        if (
            policy == spb.TURN_POLICY_INTERRUPT
            and self.running is not None
            and self.running.client_answers
        ):
            # Cancelling it would throw the client's results away and leave
            # the session waiting for them again: nothing the caller wants.
            raise SessionBusy(
                f"session {public_id(self.session_id)!r} runs the turn that answers its pause;"
                " it is not interrupted: send this once it ends"
            )
        if policy in COLLECTING and not given:
            # The head of the queue of an idle session is as good as running
            # (the drain task just has not picked it up yet): never join it.
            head_is_next = self.running is None and len(self._queue) == 1
            batch = self._queue[-1] if self._queue else None
            if (
                batch is not None
                and batch.collecting
                and not head_is_next
                and _fits(batch, len(files), size)
                # A batch notifies one URL: a message that names another is
                # a turn of its own, so each caller is told.
                and (not webhook or batch.log.webhook in ("", webhook))
            ):
                batch.messages.append(message)
                batch.tools = list(admission.tools or batch.tools)  # the newest request's
                batch.files.extend(files)
                batch.metadata.MergeFrom(admission.metadata)
                batch.waiters += 1
                self._hold(batch, size)
                self._remember_key(batch, admission.idempotency_key, admission.digest)
                return batch
            # A batch that would outgrow one turn's file limits stays as it
            # is: this message starts the next batch (one more queued turn).
        turn = self._new_turn(message, files, admission.metadata, policy, fence)
        if not message:  # an answer alone
            turn.messages = []
            turn.collecting = False
        turn.tools = list(admission.tools)
        if given:
            turn.answers = given
            turn.client_answers = True
            turn.collecting = False
        self._hold(turn, size)
        turn.waiters = 1
        self._remember_key(turn, admission.idempotency_key, admission.digest)
        if policy == spb.TURN_POLICY_INTERRUPT:
            self._queue.appendleft(turn)
            if self.running is not None:
                self.cancel(self.running.turn_id, CancelReason.INTERRUPTED)
        else:
            self._queue.append(turn)
        if self._drain_task is None:
            self._drain_task = asyncio.create_task(self._drain(), name=f"turns-{self.session_id}")
        return turn

    def _new_turn(
        self,
        message: str,
        files: list[message_pb2.File],
        metadata: struct_pb2.Struct,
        policy: spb.TurnPolicy.ValueType,
        fence: str,
    ) -> PendingTurn:
        turn_id = new_id()
        meta = struct_pb2.Struct()
        meta.CopyFrom(metadata)
        turn = PendingTurn(
            turn_id=turn_id,
            log=self._logs.create(self.session_id, turn_id),
            messages=[message],
            files=list(files),
            metadata=meta,
            collecting=policy in COLLECTING,
            policy=POLICY_LABELS.get(policy, "collect"),
            fence=fence,
        )
        self._turns[turn_id] = turn
        self._in_flight[self._principal] += 1
        span = trace.get_current_span()
        span.set_attribute("turnmesh.session_id", self.session_id)
        span.set_attribute("turnmesh.principal", self._principal)
        span.set_attribute("turnmesh.turn_id", turn_id)
        return turn

    def _remember_key(self, turn: PendingTurn, key: str, digest: str) -> None:
        if key:
            self._by_key[key] = KeyUse(turn.turn_id, digest)
            turn.keys[key] = self._by_key[key].encode()
            while len(self._by_key) > MAX_IDEMPOTENCY_KEYS:
                self._by_key.popitem(last=False)

    def cancel(self, turn_id: str, reason: CancelReason) -> spb.TurnState.ValueType:
        """Cancel a queued or running turn (why first, then the task)."""
        turn = self._turns.get(turn_id)
        if turn is None:
            raise NotFound(f"turn {turn_id!r} of session {public_id(self.session_id)!r} not found")
        if turn.log.done:
            return turn.log.state
        if turn.cancel_reason is None:
            turn.cancel_reason = reason
        if turn is self.running and turn.task is not None:
            turn.task.cancel(reason.value.code)
        elif turn in self._queue:
            self._queue.remove(turn)
            self._end_unstarted(turn)
            self._forget(turn)
        return spb.TURN_STATE_CANCELLED

    def rejoin(self, turn_id: str) -> None:
        """A retried request (same idempotency key) follows this turn too."""
        turn = self._turns.get(turn_id)
        if turn is not None:
            turn.waiters += 1

    def caller_left(self, turn_id: str) -> None:
        """A caller that asked for DISCONNECT_POLICY_CANCEL dropped its stream:
        cancel the turn unless other callers (coalesced into it) still wait."""
        turn = self._turns.get(turn_id)
        if turn is None or turn.log.done or turn.log.background:
            return  # a background turn has no caller whose leaving ends it
        turn.waiters -= 1
        if turn.waiters <= 0:
            self.cancel(turn_id, CancelReason.DISCONNECTED)

    def cancel_all(self, reason: CancelReason) -> None:
        for turn in [*self._queue, *([self.running] if self.running else [])]:
            self.cancel(turn.turn_id, reason)

    async def _drain(self) -> None:
        try:
            while self._queue:
                if (write := self._pause_write) is not None:
                    # A cancelled pause is stored before any turn runs after it.
                    with contextlib.suppress(Exception):
                        await asyncio.shield(write)
                    self._pause_written(write)
                    continue  # the queue may have changed meanwhile
                turn = self._queue.popleft()
                self.running = turn
                try:
                    if not self._answer_pause(turn):
                        continue
                    turn.task = asyncio.create_task(
                        self._runner.run(self.session_id, self.agent_name, turn),
                        name=f"turn-{turn.turn_id}",
                    )
                    # The turn's own cancellation must not stop the drain loop.
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.shield(turn.task)
                    if not turn.log.done:
                        self._end_unstarted(turn)  # cancelled before its coroutine ever ran
                    elif turn.log.state == spb.TURN_STATE_FINISHED:
                        self.pause = turn.pause_after  # committed with the turn
                        self.pause_version += 1
                finally:
                    # Whatever happened, the turn no longer counts as in flight.
                    self.running = None
                    self._forget(turn)
        finally:
            self.running = None
            self._drain_task = None

    def _answer_pause(self, turn: PendingTurn) -> bool:
        """Before a turn runs: the pause it answers (the server answers an
        expired or cancelled one); False (the turn ended) if the session
        waits for answers the turn does not carry."""
        pause = self.pause
        if pause is None:
            return True
        if pauses.expired(pause) and answers.withdraws(turn.answers):
            turn.answers = answers.Answers()  # the server answers it, as below
        if not turn.answers:
            if not pauses.expired(pause):
                turn.log.append(
                    TurnError.AWAITING_CLIENT.event(
                        "a turn before this one left the session waiting for the client;"
                        " history is unchanged"
                    )
                )
                turn.log.set_state(spb.TURN_STATE_FAILED)
                return False
            turn.answers = answers.unanswered(pause, pauses.why_unanswered(pause))
        turn.answering = pause
        return True

    @staticmethod
    def _end_unstarted(turn: PendingTurn) -> None:
        turn.log.append((turn.cancel_reason or CancelReason.CANCELLED).event())
        turn.log.set_state(spb.TURN_STATE_CANCELLED)

    def _forget(self, turn: PendingTurn) -> None:
        # The log stays in EventLogs (for SubscribeTurn); the pending record goes.
        if self._turns.pop(turn.turn_id, None) is not None:
            if turn.on_end is not None:
                turn.on_end()
            self._in_flight[self._principal] -= 1
            if self._in_flight[self._principal] <= 0:
                del self._in_flight[self._principal]
            self.pending_bytes -= turn.size
            self._held_bytes[self._principal] -= turn.size
            metrics.PENDING_BYTES.dec(turn.size)
            if self._held_bytes[self._principal] <= 0:
                del self._held_bytes[self._principal]

    async def wait_idle(self) -> None:
        task = self._drain_task
        if task is not None:
            await asyncio.shield(task)
