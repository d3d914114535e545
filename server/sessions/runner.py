"""Running one turn: pick a worker, stream its events into the turn's log,
and append the turn to history when (and only when) it finishes.

The runner is the only writer of a started turn's log and of everything it
learns while the turn runs (the worker's file readings, when the first
event came); ``SessionTurns`` decides when a turn runs and never writes a
started turn's log.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from google.protobuf import struct_pb2, timestamp_pb2
from google.protobuf.message import Message

from turnmesh.runtime import metrics, tracing, wire
from turnmesh.runtime.error_decoding import from_rpc_error
from turnmesh.runtime.errors import HistoryMiss, NotFound, Unavailable
from turnmesh.runtime.events import sum_usage
from turnmesh.runtime.principals import principal_of
from turnmesh.runtime.turn_errors import TurnError
from turnmesh.server.sessions import answers, pauses
from turnmesh.server.sessions.eventlog import TurnLog
from turnmesh.server.sessions.history import HistoryBuilder
from turnmesh.server.sessions.turns import CancelReason, PendingTurn
from turnmesh.server.stores.base import SessionStore, TurnAbandoned, now
from turnmesh.server.workers.pool import WorkerPool, WorkerRef
from turnmesh.server.workers.relay import RelayedTurn
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb
from turnmesh.v1 import worker_service_pb2 as wpb

log = logging.getLogger(__name__)


class Outcome(enum.StrEnum):
    """How a turn ended (the metrics label and the log line's status)."""

    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @classmethod
    def of(cls, state: spb.TurnState.ValueType) -> Outcome:
        if state == spb.TURN_STATE_FINISHED:
            return cls.FINISHED
        if state == spb.TURN_STATE_CANCELLED:
            return cls.CANCELLED
        return cls.FAILED


@dataclass
class WorkerEnd:
    """How a worker's stream ended: RUN_FINISHED (usage, result) or RUN_ERROR."""

    ok: bool
    usage: list[event_pb2.TokenUsage] = field(default_factory=list)
    result: struct_pb2.Struct | None = None
    error: event_pb2.Event | None = None
    # Set when the turn ends waiting for the client, with what the agent saved.
    outcome: event_pb2.RunOutcome | None = None
    agent_checkpoint: bytes = b""


class WorkerFailed(Exception):
    """The worker's stream broke (not an agent error)."""

    def __init__(self, streamed: bool) -> None:
        super().__init__("worker failed")
        self.streamed = streamed


@dataclass
class _Run:
    """What the runner learns while a turn runs (it alone writes it)."""

    turn: PendingTurn
    started: float
    builder: HistoryBuilder
    first_event_seen: bool = False
    # What the worker read from the files (text, checksums), for the history.
    file_refs: list[message_pb2.FileRef] = field(default_factory=list)


class TurnRunner:
    def __init__(
        self,
        store: SessionStore,
        workers: WorkerPool,
        on_lost: Callable[[str], None] = lambda session_id: None,
        *,
        principal_label: bool = False,
        pause_timeout_seconds: float = 86_400.0,
    ) -> None:
        self._store = store
        self.pause_timeout_seconds = pause_timeout_seconds
        self._workers = workers
        self._on_lost = on_lost
        # Count turns per principal too (--metrics-principal-label).
        self.principal_label = principal_label
        self.inflight = 0

    async def run(self, session_id: str, agent_name: str, turn: PendingTurn) -> None:
        """Run the turn to its end; its log says how it ended. Re-raises a
        cancellation (after logging the turn's cancel event)."""
        tlog = turn.log
        run = _Run(turn, time.monotonic(), HistoryBuilder(turn.turn_id))
        tlog.set_state(spb.TURN_STATE_RUNNING)
        # The turn starts now, before a worker is chosen: its caller learns
        # its id at once (to resume or cancel it).
        first = event_pb2.Event(type=event_pb2.RUN_STARTED)
        if len(turn.messages) > 1:
            first.collected_messages = len(turn.messages)
        tlog.append(first)
        self.inflight += 1
        metrics.TURNS_IN_FLIGHT.inc()
        try:
            await self._checkpoint_for(session_id, turn)
            end = await self._run_on_workers(session_id, agent_name, run)
            if not end.ok:
                assert end.error is not None
                tlog.append(end.error)
                tlog.set_state(spb.TURN_STATE_FAILED)
                return
            await self._commit(session_id, run, end)
        except asyncio.CancelledError:
            if not tlog.done:
                tlog.append((turn.cancel_reason or CancelReason.CANCELLED).event())
                tlog.set_state(spb.TURN_STATE_CANCELLED)
            raise
        except NotFound:
            # The session was deleted while its turn ran.
            if not tlog.done:
                tlog.append(CancelReason.SESSION_DELETED.event())
                tlog.set_state(spb.TURN_STATE_CANCELLED)
        except TurnAbandoned:
            # Cut off from the mesh, this server lost the turn: another server
            # declared it lost and its caller ran it again there. Nothing of
            # it was written; its result is void.
            log.warning("turn %s was taken over elsewhere; its result is discarded", turn.turn_id)
            self._on_lost(session_id)
            if not tlog.done:
                tlog.append(
                    TurnError.OWNER_LOST.event(
                        "the turn was given up for lost here and may have run again elsewhere"
                    )
                )
                tlog.set_state(spb.TURN_STATE_FAILED)
        except Exception:
            log.exception("turn %s failed", turn.turn_id)
            if not tlog.done:
                tlog.append(TurnError.INTERNAL.event("the turn failed"))
                tlog.set_state(spb.TURN_STATE_FAILED)
        finally:
            self.inflight -= 1
            metrics.TURNS_IN_FLIGHT.dec()
            self._account(session_id, run)

    async def _checkpoint_for(self, session_id: str, turn: PendingTurn) -> None:
        """The agent's checkpoint of the pause the turn answers, from the
        store when this server's view of the pause has none (it was read from
        the store: after a restart or a failover). Kept apart from the
        session's record, which every call reads, so read only here."""
        answering = turn.answering
        if answering is None or answering.agent_checkpoint or not answering.turn_id:
            return
        with metrics.STORE_SECONDS.labels("checkpoint").time():
            answering.agent_checkpoint = await self._store.checkpoint(session_id)

    async def _commit(self, session_id: str, run: _Run, end: WorkerEnd) -> None:
        """Append the turn to history and log RUN_FINISHED. Once the agent has
        finished, the turn commits even if a cancel arrives during the write
        (the turn then ends as finished); the history and the RUN_FINISHED
        event are stored in one step, after the turn's other events."""
        tlog = run.turn.log
        created = timestamp_pb2.Timestamp()
        created.GetCurrentTime()
        built = run.builder.finish(created, end.result, paused=end.outcome is not None)
        gated, built = pauses.gated_results(run.turn.answering, built, run.turn.turn_id, created)
        if end.outcome is not None and end.outcome.interrupts:
            pauses.keep_interrupts(built, end.outcome, run.turn.turn_id, created)
        messages = (
            answers.lead_messages(run.turn.turn_id, run.turn.answers, created)
            + gated
            + self._user_messages(run, created)
            + built
        )
        pause = None
        stored = b""
        if end.outcome is not None:
            pause = pauses.make_pause(
                run.turn.turn_id, end.outcome, run.builder.calls, self.pause_timeout_seconds
            )
            stored = pause.SerializeToString()  # the record's: without the checkpoint
            pause.agent_checkpoint = end.agent_checkpoint  # this server's own view keeps it
        if end.usage:
            messages[-1].usage.CopyFrom(sum_usage(end.usage))
        final = tlog.stamp(_finished_event(run.started, end))
        commit = asyncio.ensure_future(
            self._write(
                session_id,
                messages,
                final,
                tlog,
                run.turn.fence,
                stored,
                end.agent_checkpoint if pause is not None else b"",
            )
        )
        cancelled = False
        try:
            while not commit.done():
                try:
                    await asyncio.shield(commit)
                except asyncio.CancelledError:
                    cancelled = True  # every cancel: the write goes on regardless
            commit.result()
        except Unavailable:
            # The store failed to answer, not necessarily to write: settle
            # the outcome (abandoning is atomic against the commit), so that
            # a turn that did commit is never reported failed (and re-run).
            if not await self._committed_after_all(session_id, run.turn.turn_id):
                raise
        run.turn.pause_after = pause
        tlog.append(final, persisted=True)
        tlog.set_state(spb.TURN_STATE_FINISHED)
        await self._keep_keys(session_id, run.turn)
        if cancelled:
            raise asyncio.CancelledError

    async def _keep_keys(self, session_id: str, turn: PendingTurn) -> None:
        """The turn's idempotency keys count from its end, as its events do:
        a retry within the event-log window never runs it again, however
        long it queued or ran (a store that fails keeps them from its start)."""
        for key, use in turn.keys.items():
            try:
                await self._store.set_key(session_id, key, use)
            except (Unavailable, NotFound):  # down, or the session went meanwhile
                log.warning("could not renew turn %s's idempotency key", turn.turn_id)
                return

    async def _committed_after_all(self, session_id: str, turn_id: str) -> bool:
        try:
            return not await self._store.abandon_turn(session_id, turn_id)
        except Unavailable:
            return False  # still unknown: reported as failed (and void if it was not written)

    def _user_messages(
        self, run: _Run, created: timestamp_pb2.Timestamp
    ) -> list[message_pb2.Message]:
        turn = run.turn
        users = [
            message_pb2.Message(role="user", content=text, turn_id=turn.turn_id, created_at=created)
            for text in turn.messages
        ]
        if not users:
            return users  # a turn that only answers a pause
        if len(run.file_refs) == len(turn.files):
            users[-1].files.extend(run.file_refs)
        else:  # a worker that does not read files: what is known here
            for file in turn.files:
                users[-1].files.add(
                    mime_type=file.mime_type, filename=file.filename, size_bytes=len(file.content)
                )
        if turn.metadata.fields:
            users[-1].metadata.CopyFrom(turn.metadata)
        return users

    async def _write(
        self,
        session_id: str,
        messages: list[message_pb2.Message],
        final: event_pb2.Event,
        tlog: TurnLog,
        fence: str,
        pause: bytes,
        checkpoint: bytes,
    ) -> None:
        await tlog.flush()
        with metrics.STORE_SECONDS.labels("commit_turn").time():
            await self._store.commit_turn(
                session_id, messages, final, now(), fence, pause, checkpoint
            )

    def _account(self, session_id: str, run: _Run) -> None:
        """Metrics and the one log line a turn gets: ids, status, latency;
        never the content."""
        turn = run.turn
        outcome = Outcome.of(turn.log.state)
        elapsed = time.monotonic() - run.started
        metrics.TURNS.labels(outcome.value, turn.policy).inc()
        principal = principal_of(session_id)
        if self.principal_label:
            metrics.PRINCIPAL_TURNS.labels(principal, outcome.value).inc()
        metrics.TURN_SECONDS.observe(elapsed)
        fields: dict[str, object] = {
            "principal": principal,
            "session_id": session_id,
            "turn_id": turn.turn_id,
            "status": outcome.value,
            "policy": turn.policy,
            "latency_ms": round(elapsed * 1000, 2),
        }
        if turn.request_id:
            fields["request_id"] = turn.request_id  # the edge's access log and problem `instance`
        if (trace_id := tracing.trace_id(turn.trace_context)) is not None:
            fields["trace_id"] = trace_id  # finds the turn's trace from its log line
        log.info("turn ended", extra=fields)
        log.debug("turn %s messages: %r", turn.turn_id, turn.messages)

    async def _run_on_workers(self, session_id: str, agent_name: str, run: _Run) -> WorkerEnd:
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
                return await self._run_on(worker, session_id, run)
            except WorkerFailed as failure:
                self._workers.mark_failed(worker)
                log.warning(
                    "worker %s failed during turn %s (streamed=%s)",
                    worker.member_id,
                    run.turn.turn_id,
                    failure.streamed,
                )
                if failure.streamed:
                    return WorkerEnd(
                        ok=False,
                        error=TurnError.WORKER_FAILED.event(
                            "the worker running this turn failed; history is unchanged"
                        ),
                    )
                metrics.WORKER_RETRIES.inc()
        if not tried:
            detail = f"no live worker serves agent {agent_name!r}"
        else:
            detail = "the workers for this turn failed before answering; history is unchanged"
        return WorkerEnd(ok=False, error=TurnError.WORKER_UNAVAILABLE.event(detail))

    async def _run_on(self, worker: WorkerRef, session_id: str, run: _Run) -> WorkerEnd:
        """Run the turn on one worker, sending only the history it lacks."""
        turn = run.turn
        base = self._workers.history_base(worker, session_id)
        while True:
            with metrics.STORE_SECONDS.labels("history").time():
                history = await self._store.history(session_id, start=base)
            head = wpb.RunRequest(
                session_id=session_id,
                turn_id=turn.turn_id,
                messages=turn.messages,
                history_base=base,
                metadata=turn.metadata,
                tools=turn.tools,
                tool_results=turn.answers.tool_results,
                resume=turn.answers.resume,
            )
            if turn.answering is not None:
                head.answering.CopyFrom(turn.answering)
            feed = _Feed(run)
            link = self._workers.relay(worker)
            relayed = link.register(feed.relayed) if link is not None else None
            if link is not None and relayed is not None:
                head.relay_id = link.relay_id
                head.relay_key = relayed.key
            request: wpb.RunRequest | bytes = head
            try:
                if worker.run_serialized and (turn.files or len(history) > SMALL_HISTORY):
                    # Possibly megabytes: serialized a piece at a time, off the loop.
                    repeated: dict[str, Sequence[Message]] = {
                        "history": history,
                        "files": turn.files,
                    }
                    request = await wire.serialize_off_loop(head, repeated)
                else:
                    head.history.extend(history)
                    head.files.extend(turn.files)
                with tracing.client_span(
                    "turnmesh.v1.WorkerService/Run",
                    turn.trace_context,
                    **{"turnmesh.worker_id": worker.member_id, "turnmesh.turn_id": turn.turn_id},
                ) as trace_metadata:
                    end = await self._stream(
                        worker, session_id, request, feed, relayed, trace_metadata
                    )
            except HistoryMiss:
                if base == 0:
                    raise WorkerFailed(streamed=False) from None
                base = 0  # the worker restarted or evicted it: send everything
                continue
            except WorkerFailed:
                self._workers.forget_history(worker, session_id)
                raise
            finally:
                if link is not None and relayed is not None:
                    link.unregister(relayed)
            self._workers.remember_history(worker, session_id, base + len(history))
            return end

    async def _stream(
        self,
        worker: WorkerRef,
        session_id: str,
        request: wpb.RunRequest | bytes,
        feed: _Feed,
        relayed: RelayedTurn | None,
        trace_metadata: tracing.Metadata = (),
    ) -> WorkerEnd:
        self._workers.acquire(worker, session_id)
        metadata = (*self._workers.call_metadata, *trace_metadata)
        call: grpc.aio.UnaryStreamCall[Any, wpb.RunResponse]
        if isinstance(request, bytes):
            assert worker.run_serialized is not None
            call = worker.run_serialized(request, metadata=metadata)
        else:
            call = worker.stub.Run(request, metadata=metadata)
        try:
            async for response in wire.responses(call):
                if response.files:
                    feed.run.file_refs = list(response.files)
                if response.relayed_events and not (
                    relayed is not None and await relayed.wait_for(response.relayed_events)
                ):
                    break  # the relay ended before it brought them all
                for event in response.events:
                    if (end := feed.event(event)) is not None:
                        end.agent_checkpoint = response.agent_checkpoint
                        return end
        except grpc.aio.AioRpcError as exc:
            if not feed.streamed and isinstance(from_rpc_error(exc), HistoryMiss):
                raise HistoryMiss(session_id) from exc
            log.debug("worker %s stream error: %s", worker.member_id, exc.code())
            raise WorkerFailed(feed.streamed) from exc
        except asyncio.CancelledError:
            call.cancel()
            raise
        finally:
            self._workers.release(worker)
        # The stream ended without RUN_FINISHED or RUN_ERROR.
        call.cancel()
        raise WorkerFailed(feed.streamed)

    @staticmethod
    def _first_event(run: _Run) -> None:
        if not run.first_event_seen:
            run.first_event_seen = True
            metrics.FIRST_EVENT_SECONDS.observe(time.monotonic() - run.started)


class _Feed:
    """Takes a turn's events from its worker, from the turn's Run stream or
    from the server's relay, into the turn's log and history."""

    def __init__(self, run: _Run) -> None:
        self.run = run
        self.streamed = False  # whether any of the agent's events came

    def event(self, event: event_pb2.Event) -> WorkerEnd | None:
        """Log the event, or return how the run ended."""
        if event.type == event_pb2.RUN_STARTED:
            return None  # an older worker's: the server started the run
        if event.type == event_pb2.RUN_FINISHED:
            return WorkerEnd(
                ok=True,
                usage=list(event.usage),
                result=event.result if event.HasField("result") else None,
                outcome=event.outcome if event.HasField("outcome") else None,
            )
        if event.type == event_pb2.RUN_ERROR:
            return WorkerEnd(ok=False, error=_copy_error(event))
        if not self.streamed:
            self.streamed = True
            TurnRunner._first_event(self.run)
        self.run.builder.feed(event)
        self.run.turn.log.append(event)  # the log numbers it and names its turn
        return None

    def relayed(self, entry: wpb.RelayedEvents) -> None:
        """A relay's events of this turn. Each is copied out of the relay's
        message, which holds other turns' events: a kept reference would keep
        all of them in memory as long as this turn's log holds it."""
        if entry.files:
            self.run.file_refs = [_copied(message_pb2.FileRef, ref) for ref in entry.files]
        for event in entry.events:
            if event.type in (event_pb2.RUN_FINISHED, event_pb2.RUN_ERROR):
                raise ValueError("a relay carries no turn's end")
            self.event(_copied(event_pb2.Event, event))


_M = TypeVar("_M", bound=Message)


def _copied(kind: type[_M], message: _M) -> _M:
    copy = kind()
    copy.CopyFrom(message)
    return copy


# A history tail longer than this is a worker that lacks the history (its
# first turn of the session, or a seeded one): possibly megabytes.
SMALL_HISTORY = 8


def _finished_event(started: float, end: WorkerEnd) -> event_pb2.Event:
    done = event_pb2.Event(
        type=event_pb2.RUN_FINISHED, execution_time_ms=int((time.monotonic() - started) * 1000)
    )
    done.usage.extend(end.usage)
    if end.result is not None:
        done.result.CopyFrom(end.result)
    if end.outcome is not None:
        done.outcome.CopyFrom(end.outcome)  # its interrupts' expiry stamped by make_pause
    return done


def _copy_error(event: event_pb2.Event) -> event_pb2.Event:
    out = event_pb2.Event(
        type=event_pb2.RUN_ERROR, message=event.message, code=event.code or "agent_error"
    )
    if event.HasField("problem"):
        out.problem.CopyFrom(event.problem)
    return out
