"""Turns on one session: serialization under a policy, execution on a worker.

A ``SessionTurns`` is the single place that decides when a session's turns run.
``submit`` makes its decision without awaiting, so two requests can never
interleave; a drain task runs queued turns one after another. A turn's history
is appended only when it finishes, so a failed, cancelled or interrupted turn
leaves history exactly as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import grpc
from google.protobuf import struct_pb2, timestamp_pb2
from opentelemetry import context as otel_context
from opentelemetry import trace

from turnmesh.runtime import metrics, tracing
from turnmesh.runtime.errors import HistoryMiss, NotFound, SessionBusy, error_event, from_rpc_error
from turnmesh.runtime.ids import new_id
from turnmesh.server.eventlog import EventLogs, TurnLog
from turnmesh.server.history import HistoryBuilder
from turnmesh.server.store import SessionStore, TurnAbandoned, now
from turnmesh.server.workers import WorkerPool, WorkerRef
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb
from turnmesh.v1 import worker_service_pb2 as wpb

log = logging.getLogger(__name__)

MAX_IDEMPOTENCY_KEYS = 256

# Why a turn was cancelled: the RUN_ERROR code and title it ends with.
CANCEL_REASONS = {
    "cancelled": "Turn cancelled",
    "interrupted": "Turn interrupted by a newer turn",
    "disconnected": "Client disconnected",
    "session_deleted": "Session deleted",
    "shutdown": "Server shutting down",
}


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
    cancel_reason: str | None = None
    policy: str = "collect"
    started: float = 0.0  # monotonic, when the runner took it
    first_event_seen: bool = False
    # What the worker read from the files (text, checksums), for the history.
    file_refs: list[message_pb2.FileRef] = field(default_factory=list)
    # The trace of the call that created the turn; the worker call joins it.
    trace_context: otel_context.Context = field(default_factory=otel_context.get_current)


@dataclass
class TurnOutcome:
    """What a worker's stream ended with."""

    ok: bool
    usage: list[event_pb2.TokenUsage] = field(default_factory=list)
    result: struct_pb2.Struct | None = None
    error: event_pb2.Event | None = None


class WorkerFailed(Exception):
    """The worker's stream broke (not an agent error)."""

    def __init__(self, streamed: bool) -> None:
        super().__init__("worker failed")
        self.streamed = streamed


class SessionTurns:
    """The turns of one session."""

    def __init__(
        self,
        session_id: str,
        agent_name: str,
        runner: TurnRunner,
        logs: EventLogs,
    ) -> None:
        self.session_id = session_id
        self.agent_name = agent_name
        self._runner = runner
        self._logs = logs
        self.running: PendingTurn | None = None
        self._queue: deque[PendingTurn] = deque()
        self._drain_task: asyncio.Task[None] | None = None
        # idempotency key -> turn id, the most recent keys only.
        self._by_key: OrderedDict[str, str] = OrderedDict()
        self._turns: dict[str, PendingTurn] = {}

    @property
    def busy(self) -> bool:
        return self.running is not None or bool(self._queue)

    @property
    def queued(self) -> int:
        """Turns waiting behind the running one."""
        return len(self._queue)

    def turn_for_key(self, key: str) -> str | None:
        """The turn a retried request with this idempotency key belongs to."""
        return self._by_key.get(key) if key else None

    def submit(
        self,
        message: str,
        files: list[message_pb2.File],
        metadata: struct_pb2.Struct,
        policy: spb.TurnPolicy.ValueType,
        idempotency_key: str,
    ) -> PendingTurn:
        """Place a new message under the policy. Never awaits: decisions are atomic."""
        if policy == spb.TURN_POLICY_REJECT and self.busy:
            raise SessionBusy(f"session {self.session_id!r} has a turn running")
        if policy in (spb.TURN_POLICY_COLLECT, spb.TURN_POLICY_UNSPECIFIED):
            # The head of the queue of an idle session is as good as running
            # (the drain task just has not picked it up yet): never join it.
            head_is_next = self.running is None and len(self._queue) == 1
            if self._queue and self._queue[-1].collecting and not head_is_next:
                batch = self._queue[-1]
                batch.messages.append(message)
                batch.files.extend(files)
                batch.metadata.MergeFrom(metadata)
                batch.waiters += 1
                self._remember_key(batch, idempotency_key)
                return batch
        turn = self._new_turn(message, files, metadata, policy)
        turn.waiters = 1
        self._remember_key(turn, idempotency_key)
        if policy == spb.TURN_POLICY_INTERRUPT:
            self._queue.appendleft(turn)
            if self.running is not None:
                self.cancel(self.running.turn_id, "interrupted")
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
            collecting=policy in (spb.TURN_POLICY_COLLECT, spb.TURN_POLICY_UNSPECIFIED),
            policy=POLICY_LABELS.get(policy, "collect"),
        )
        self._turns[turn_id] = turn
        span = trace.get_current_span()
        span.set_attribute("turnmesh.session_id", self.session_id)
        span.set_attribute("turnmesh.turn_id", turn_id)
        return turn

    def _remember_key(self, turn: PendingTurn, key: str) -> None:
        if key:
            self._by_key[key] = turn.turn_id
            while len(self._by_key) > MAX_IDEMPOTENCY_KEYS:
                self._by_key.popitem(last=False)

    def cancel(self, turn_id: str, reason: str) -> spb.TurnState.ValueType:
        turn = self._turns.get(turn_id)
        if turn is None:
            raise NotFound(f"turn {turn_id!r} of session {self.session_id!r} not found")
        if turn.log.done:
            return turn.log.state
        if turn.cancel_reason is None:
            turn.cancel_reason = reason
        if turn is self.running and turn.task is not None:
            turn.task.cancel(reason)
        elif turn in self._queue:
            self._queue.remove(turn)
            self._runner.end_cancelled(turn)
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
        if turn is None or turn.log.done:
            return
        turn.waiters -= 1
        if turn.waiters <= 0:
            self.cancel(turn_id, "disconnected")

    def cancel_all(self, reason: str) -> None:
        for turn in [*self._queue, *([self.running] if self.running else [])]:
            self.cancel(turn.turn_id, reason)

    async def _drain(self) -> None:
        try:
            while self._queue:
                turn = self._queue.popleft()
                self.running = turn
                turn.task = asyncio.create_task(
                    self._runner.run(self.session_id, self.agent_name, turn),
                    name=f"turn-{turn.turn_id}",
                )
                # The turn's own cancellation must not stop the drain loop.
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(turn.task)
                if not turn.log.done:
                    # Cancelled before its coroutine ever ran.
                    self._runner.end_cancelled(turn)
                self.running = None
                self._forget(turn)
        finally:
            self.running = None
            self._drain_task = None

    def _forget(self, turn: PendingTurn) -> None:
        # The log stays in EventLogs (for SubscribeTurn); the pending record goes.
        self._turns.pop(turn.turn_id, None)

    async def wait_idle(self) -> None:
        task = self._drain_task
        if task is not None:
            await asyncio.shield(task)


class TurnRunner:
    """Runs one turn: picks a worker, streams its events into the turn's log,
    and appends the turn to history when (and only when) it finishes."""

    def __init__(self, store: SessionStore, workers: WorkerPool) -> None:
        self._store = store
        self._workers = workers
        self.inflight = 0
        self._running: dict[str, PendingTurn] = {}

    async def run(self, session_id: str, agent_name: str, turn: PendingTurn) -> None:
        tlog = turn.log
        started = time.monotonic()
        tlog.set_state(spb.TURN_STATE_RUNNING)
        first = event_pb2.Event(type=event_pb2.RUN_STARTED)
        if len(turn.messages) > 1:
            first.collected_messages = len(turn.messages)
        tlog.append(first)
        self.inflight += 1
        metrics.TURNS_IN_FLIGHT.inc()
        turn.started = started
        self._running[turn.turn_id] = turn
        try:
            builder = HistoryBuilder(turn.turn_id)
            outcome = await self._run_on_workers(session_id, agent_name, turn, builder)
            if not outcome.ok:
                assert outcome.error is not None
                tlog.append(outcome.error)
                tlog.set_state(spb.TURN_STATE_FAILED)
                return
            created = timestamp_pb2.Timestamp()
            created.GetCurrentTime()
            users = [
                message_pb2.Message(
                    role="user", content=text, turn_id=turn.turn_id, created_at=created
                )
                for text in turn.messages
            ]
            if len(turn.file_refs) == len(turn.files):
                users[-1].files.extend(turn.file_refs)
            else:  # a worker that does not read files: what is known here
                for file in turn.files:
                    users[-1].files.add(
                        mime_type=file.mime_type,
                        filename=file.filename,
                        size_bytes=len(file.content),
                    )
            if turn.metadata.fields:
                users[-1].metadata.CopyFrom(turn.metadata)
            messages = users + builder.finish(created, outcome.result)
            if outcome.usage:
                messages[-1].usage.CopyFrom(_total(outcome.usage))
            # Once the agent has finished, the turn commits even if a cancel
            # arrives during the write; the turn then ends as finished. The
            # history and the RUN_FINISHED event are stored in one step, after
            # the turn's other events.
            final = tlog.stamp(_finished_event(started, outcome))
            commit = asyncio.ensure_future(self._commit(session_id, messages, final, tlog))
            cancelled = False
            while not commit.done():
                try:
                    await asyncio.shield(commit)
                except asyncio.CancelledError:
                    cancelled = True  # every cancel: the write goes on regardless
            commit.result()
            tlog.append(final, persisted=True)
            tlog.set_state(spb.TURN_STATE_FINISHED)
            if cancelled:
                raise asyncio.CancelledError
        except asyncio.CancelledError:
            if not tlog.done:
                reason = turn.cancel_reason or "cancelled"
                tlog.append(_cancel_event(reason))
                tlog.set_state(spb.TURN_STATE_CANCELLED)
            raise
        except NotFound:
            # The session was deleted while its turn ran.
            if not tlog.done:
                tlog.append(_cancel_event("session_deleted"))
                tlog.set_state(spb.TURN_STATE_CANCELLED)
        except TurnAbandoned:
            # Cut off from the mesh, this server lost the turn: another server
            # declared it lost and its caller ran it again there. Nothing of
            # it was written; its result is void.
            log.warning("turn %s was taken over elsewhere; its result is discarded", turn.turn_id)
            if not tlog.done:
                tlog.append(
                    error_event(
                        "owner_lost",
                        "Server lost",
                        503,
                        "the turn was given up for lost here and may have run again elsewhere",
                    )
                )
                tlog.set_state(spb.TURN_STATE_FAILED)
        except Exception:
            log.exception("turn %s failed", turn.turn_id)
            if not tlog.done:
                tlog.append(error_event("internal", "Internal error", 500, "the turn failed"))
                tlog.set_state(spb.TURN_STATE_FAILED)
        finally:
            self.inflight -= 1
            self._running.pop(turn.turn_id, None)
            metrics.TURNS_IN_FLIGHT.dec()
            outcome = _outcome_label(tlog.state)
            elapsed = time.monotonic() - started
            metrics.TURNS.labels(outcome, turn.policy).inc()
            metrics.TURN_SECONDS.observe(elapsed)
            # One line per turn: ids, status and latency; never the content.
            fields: dict[str, object] = {
                "session_id": session_id,
                "turn_id": turn.turn_id,
                "status": outcome,
                "policy": turn.policy,
                "latency_ms": round(elapsed * 1000, 2),
            }
            if (trace_id := tracing.trace_id(turn.trace_context)) is not None:
                fields["trace_id"] = trace_id  # finds the turn's trace from its log line
            log.info("turn ended", extra=fields)
            log.debug("turn %s messages: %r", turn.turn_id, turn.messages)

    async def _commit(
        self,
        session_id: str,
        messages: list[message_pb2.Message],
        final: event_pb2.Event,
        tlog: TurnLog,
    ) -> None:
        await tlog.flush()
        with metrics.STORE_SECONDS.labels("commit_turn").time():
            await self._store.commit_turn(session_id, messages, final, now())

    def end_cancelled(self, turn: PendingTurn) -> None:
        """End a turn that never started."""
        turn.log.append(_cancel_event(turn.cancel_reason or "cancelled"))
        turn.log.set_state(spb.TURN_STATE_CANCELLED)

    async def _run_on_workers(
        self,
        session_id: str,
        agent_name: str,
        turn: PendingTurn,
        builder: HistoryBuilder,
    ) -> TurnOutcome:
        tried: set[str] = set()
        for _attempt in range(2):  # one transparent retry
            worker = self._workers.pick(agent_name, session_id, tried)
            if worker is None:
                await self._workers.refresh()
                worker = self._workers.pick(agent_name, session_id, tried)
            if worker is None:
                break
            tried.add(worker.member_id)
            try:
                return await self._run_on(worker, session_id, turn, builder)
            except WorkerFailed as failure:
                self._workers.mark_failed(worker)
                log.warning(
                    "worker %s failed during turn %s (streamed=%s)",
                    worker.member_id,
                    turn.turn_id,
                    failure.streamed,
                )
                if not failure.streamed:
                    metrics.WORKER_RETRIES.inc()
                if failure.streamed:
                    return TurnOutcome(
                        ok=False,
                        error=error_event(
                            "worker_failed",
                            "Worker failed",
                            502,
                            "the worker running this turn failed; history is unchanged",
                        ),
                    )
        if not tried:
            detail = f"no live worker serves agent {agent_name!r}"
        else:
            detail = "the workers for this turn failed before answering; history is unchanged"
        return TurnOutcome(
            ok=False, error=error_event("worker_unavailable", "No worker available", 503, detail)
        )

    def _first_event(self, turn_id: str) -> None:
        turn = self._running.get(turn_id)
        if turn is not None and not turn.first_event_seen:
            turn.first_event_seen = True
            metrics.FIRST_EVENT_SECONDS.observe(time.monotonic() - turn.started)

    async def _run_on(
        self, worker: WorkerRef, session_id: str, turn: PendingTurn, builder: HistoryBuilder
    ) -> TurnOutcome:
        """Run the turn on one worker, sending only the history it lacks."""
        base = self._workers.history_base(worker, session_id)
        while True:
            with metrics.STORE_SECONDS.labels("history").time():
                history = await self._store.history(session_id, start=base)
            request = wpb.RunRequest(
                session_id=session_id,
                turn_id=turn.turn_id,
                messages=turn.messages,
                files=turn.files,
                history=history,
                history_base=base,
                metadata=turn.metadata,
            )
            try:
                with tracing.client_span(
                    "turnmesh.v1.WorkerService/Run",
                    turn.trace_context,
                    **{"turnmesh.worker_id": worker.member_id, "turnmesh.turn_id": turn.turn_id},
                ) as trace_metadata:
                    outcome = await self._stream(
                        worker, session_id, request, turn, builder, trace_metadata
                    )
            except HistoryMiss:
                if base == 0:
                    raise WorkerFailed(streamed=False) from None
                base = 0  # the worker restarted or evicted it: send everything
                continue
            except WorkerFailed:
                self._workers.forget_history(worker, session_id)
                raise
            self._workers.remember_history(worker, session_id, base + len(history))
            return outcome

    async def _stream(
        self,
        worker: WorkerRef,
        session_id: str,
        request: wpb.RunRequest,
        turn: PendingTurn,
        builder: HistoryBuilder,
        trace_metadata: tracing.Metadata = (),
    ) -> TurnOutcome:
        tlog = turn.log
        self._workers.acquire(worker, session_id)
        streamed = False
        call = worker.stub.Run(request, metadata=(*self._workers.call_metadata, *trace_metadata))
        try:
            async for response in call:
                if response.files:
                    turn.file_refs = list(response.files)
                for event in response.events:
                    if event.type == event_pb2.RUN_STARTED:
                        continue
                    if event.type == event_pb2.RUN_FINISHED:
                        return TurnOutcome(
                            ok=True,
                            usage=list(event.usage),
                            result=event.result if event.HasField("result") else None,
                        )
                    if event.type == event_pb2.RUN_ERROR:
                        return TurnOutcome(ok=False, error=_copy_error(event))
                    if not streamed:
                        self._first_event(request.turn_id)
                    streamed = True
                    builder.feed(event)
                    tlog.append(event)  # the log stamps its own seq and ids
        except grpc.aio.AioRpcError as exc:
            if not streamed and isinstance(from_rpc_error(exc), HistoryMiss):
                raise HistoryMiss(session_id) from exc
            log.debug("worker %s stream error: %s", worker.member_id, exc.code())
            raise WorkerFailed(streamed) from exc
        except asyncio.CancelledError:
            call.cancel()
            raise
        finally:
            self._workers.release(worker)
        # The stream ended without RUN_FINISHED or RUN_ERROR.
        raise WorkerFailed(streamed)


POLICY_LABELS = {
    spb.TURN_POLICY_REJECT: "reject",
    spb.TURN_POLICY_ENQUEUE: "enqueue",
    spb.TURN_POLICY_COLLECT: "collect",
    spb.TURN_POLICY_INTERRUPT: "interrupt",
}


def _outcome_label(state: spb.TurnState.ValueType) -> str:
    return {
        spb.TURN_STATE_FINISHED: "finished",
        spb.TURN_STATE_CANCELLED: "cancelled",
    }.get(state, "failed")


def _finished_event(started: float, outcome: TurnOutcome) -> event_pb2.Event:
    done = event_pb2.Event(
        type=event_pb2.RUN_FINISHED,
        execution_time_ms=int((time.monotonic() - started) * 1000),
    )
    done.usage.extend(outcome.usage)
    if outcome.result is not None:
        done.result.CopyFrom(outcome.result)
    return done


def _total(usage: list[event_pb2.TokenUsage]) -> event_pb2.TokenUsage:
    total = event_pb2.TokenUsage()
    for u in usage:
        total.input_tokens += u.input_tokens
        total.output_tokens += u.output_tokens
        total.total_tokens += u.total_tokens
    return total


def _copy_error(event: event_pb2.Event) -> event_pb2.Event:
    out = event_pb2.Event(
        type=event_pb2.RUN_ERROR, message=event.message, code=event.code or "agent_error"
    )
    if event.HasField("problem"):
        out.problem.CopyFrom(event.problem)
    return out


def _cancel_event(reason: str) -> event_pb2.Event:
    title = CANCEL_REASONS.get(reason, "Turn cancelled")
    # 499: the de facto status for a request the client cancelled.
    return error_event(reason, title, 499, f"{title.lower()}; history is unchanged")
