"""``turnmesh.v1.WorkerService``: runs one agent turn per ``Run`` call."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import grpc
from google.protobuf import struct_pb2
from opentelemetry import trace

from turnmesh.agent import AgentError, AgentRequest, AgentResponse, AgentRunnable
from turnmesh.files import Sandbox
from turnmesh.runtime import metrics
from turnmesh.runtime.errors import Unavailable
from turnmesh.runtime.turn_errors import TurnError, problem
from turnmesh.v1 import event_pb2, message_pb2, worker_service_pb2, worker_service_pb2_grpc
from turnmesh.worker import pause
from turnmesh.worker import relay as worker_relay  # the servicer's Relay method shadows the class
from turnmesh.worker._convert import history_message, to_agent_request
from turnmesh.worker.attachments import file_events, read_files
from turnmesh.worker.emitter import ET, QueueEmitter, make_event
from turnmesh.worker.extract_cache import ExtractCache
from turnmesh.worker.history_cache import DEFAULT_MAX_BYTES, HistoryCache
from turnmesh.worker.relay import RelayClosed, Relays

__all__ = ["WorkerServicer"]

log = logging.getLogger(__name__)

# Sent instead of the exception: agent errors may carry secrets or internals.
AGENT_ERROR_PROBLEM = problem(
    TurnError.AGENT_ERROR.code,
    TurnError.AGENT_ERROR.title,
    TurnError.AGENT_ERROR.status,
    "the agent raised an error while running this turn",
)


class WorkerServicer(worker_service_pb2_grpc.WorkerServiceServicer):
    def __init__(
        self,
        agent: AgentRunnable,
        *,
        agent_name: str,
        worker_id: str,
        sandbox: Sandbox | None = None,
        history_cache_bytes: int = DEFAULT_MAX_BYTES,
        file_texts: ExtractCache | None = None,
    ) -> None:
        self.agent = agent
        self.sandbox = sandbox or Sandbox()
        self.file_texts = ExtractCache() if file_texts is None else file_texts
        self.agent_name = agent_name
        self.worker_id = worker_id
        self.ready = True  # the agent is loaded before the servicer exists
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._histories = HistoryCache(max_bytes=history_cache_bytes)
        self._relays = Relays()
        self._relays_refused = False  # stopping: turns stream on their Run calls

    @property
    def inflight(self) -> int:
        """Turns running now."""
        return self._inflight

    async def close_relays_when_idle(self, grace: float) -> None:
        """At shutdown: refuse new relays; once the running turns have ended
        and their events are written, or after ``grace``, end the servers'
        relays, which would otherwise hold the server's stop for its whole
        grace period."""
        self._relays_refused = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self._idle.wait()
                await self._relays.flush_all()
        self._relays.close_all()

    async def Relay(
        self,
        request: worker_service_pb2.RelayRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[worker_service_pb2.RelayResponse]:
        if self._relays_refused:
            raise Unavailable("the worker is stopping")
        relay = self._relays.open(request.relay_id)
        try:
            yield worker_service_pb2.RelayResponse()  # open: Run may name it now
            async for response in relay.responses():
                yield response
        finally:
            # The server went away or the worker is stopping: the turns that
            # used this relay are stopped, and their Run calls fail.
            self._relays.close(relay)

    async def GetInfo(
        self,
        request: worker_service_pb2.GetInfoRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> worker_service_pb2.GetInfoResponse:
        return worker_service_pb2.GetInfoResponse(
            agent_name=self.agent_name,
            ready=self.ready,
            worker_id=self.worker_id,
            inflight_turns=self._inflight,
        )

    async def Run(
        self,
        request: worker_service_pb2.RunRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[worker_service_pb2.RunResponse]:
        # Invalid input or a history miss: a status, before any event.
        history = self._histories.resolve(
            request.session_id, request.history_base, await _history_tail(request)
        )
        turn = _Turn(request, to_agent_request(request, history))
        span = trace.get_current_span()
        span.set_attribute("turnmesh.session_id", request.session_id)
        span.set_attribute("turnmesh.turn_id", request.turn_id)
        relay = self._relays.get(request.relay_id) if request.relay_id else None
        # The server started the turn (RUN_STARTED) and numbers its events:
        # the turn sends only what the agent does, then how it ended.
        responses = self._streamed(turn) if relay is None else self._relayed(turn, relay)
        outcome = "failed"  # until it is known
        self._inflight += 1
        self._idle.clear()
        try:
            # Closed with Run, so a caller that goes away stops the agent now.
            async with contextlib.aclosing(responses):
                async for response in responses:
                    yield response
            if turn.finished:
                outcome = "finished"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._idle.set()
            metrics.WORKER_RUNS.labels(outcome).inc()
            metrics.WORKER_RUN_SECONDS.observe(time.monotonic() - turn.started)

    async def _streamed(self, turn: _Turn) -> AsyncGenerator[worker_service_pb2.RunResponse, None]:
        """The turn's events on its Run call: its files' events, then each
        batch as the agent emits it; the last response also ends the run."""
        if turn.request.files:
            refs = await self._read_files(turn)
            yield worker_service_pb2.RunResponse(events=file_events(refs), files=refs)
        emitter = QueueEmitter()
        task = self._start_agent(turn, emitter)
        pending: list[event_pb2.Event] = []
        try:
            async for batch, ended in emitter.batches():
                pending.extend(batch)
                if ended:
                    break  # the last response also carries the run's end
                yield worker_service_pb2.RunResponse(events=pending)
                pending = []
        finally:
            await _stop_agent(task)
        yield _last_response(turn, task, emitter, pending, relayed=0)

    async def _relayed(
        self, turn: _Turn, relay: worker_relay.Relay
    ) -> AsyncGenerator[worker_service_pb2.RunResponse, None]:
        """The turn's events on the server's relay as the agent emits them;
        Run's one response says how many went there and ends the run."""
        key = turn.request.relay_key
        relayed = 0  # the files' events; the agent's are counted by the emitter
        if turn.request.files:
            refs = await self._read_files(turn)
            events = file_events(refs)
            _relay_put(relay, key, events, refs)
            relayed = len(events)
        emitter = QueueEmitter(sink=lambda event: relay.put(key, (event,)), room=relay.room)
        task = self._start_agent(turn, emitter)
        relay.attach(key, task)
        try:
            # Not `await task`: the caller's cancel must reach the finally
            # below, which cancels the agent.
            await asyncio.wait((task,))
            if relay.closed:
                raise Unavailable("the relay to the server ended")
        finally:
            relay.detach(key)
            await _stop_agent(task)
        yield _last_response(turn, task, emitter, [], relayed=relayed + emitter.sunk)

    async def _read_files(self, turn: _Turn) -> list[message_pb2.FileRef]:
        """Read the turn's files into its agent's request; their refs, for
        the history and the file events."""
        files, refs = await read_files(
            self.sandbox,
            self.file_texts,
            list(turn.request.files),
            principal=turn.agent_request.principal,
            # Scoped session ids are unique mesh-wide; ids hold no space.
            turn=f"{turn.request.session_id} {turn.request.turn_id}",
        )
        turn.agent_request = dataclasses.replace(turn.agent_request, files=files)
        return refs

    def _start_agent(self, turn: _Turn, emitter: QueueEmitter) -> asyncio.Task[AgentResponse]:
        task = asyncio.create_task(
            self.agent.run(turn.agent_request, emitter=emitter), name=f"turn-{turn.request.turn_id}"
        )
        task.add_done_callback(lambda _: emitter.finish())
        return task


@dataclasses.dataclass(slots=True)
class _Turn:
    """One Run call's turn, as either transport runs it."""

    request: worker_service_pb2.RunRequest
    agent_request: AgentRequest  # with the files' texts once they are read
    started: float = dataclasses.field(default_factory=time.monotonic)
    finished: bool = False  # its last response ends it with RUN_FINISHED


async def _stop_agent(task: asyncio.Task[AgentResponse]) -> None:
    """Cancel the agent if it still runs: only when the caller went away
    (cancel or close); the agent sees CancelledError inside run."""
    if not task.done():
        task.cancel("the caller cancelled the turn")
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _last_response(
    turn: _Turn,
    task: asyncio.Task[AgentResponse],
    emitter: QueueEmitter,
    events: list[event_pb2.Event],
    *,
    relayed: int,
) -> worker_service_pb2.RunResponse:
    """Run's last response, once the agent's task is done: ``events`` not
    sent yet, how the run ended, and how many events went on the relay.
    Whether it ended with RUN_FINISHED is recorded on ``turn``."""
    response = _outcome(task, turn.request.turn_id)
    finished = (
        _run_finished(
            response,
            turn.started,
            turn.request.turn_id,
            emitter.unanswered_calls,
            {tool.name for tool in turn.request.tools},
        )
        if isinstance(response, AgentResponse)
        else None
    )
    if isinstance(response, AgentError):
        events.append(_agent_error_event(response))
    elif response is None or finished is None:
        events.append(
            make_event(
                ET.RUN_ERROR,
                message="the agent failed",
                code="agent_error",
                problem=AGENT_ERROR_PROBLEM,
            )
        )
    else:
        events.extend(emitter.closing_events(response.text))
        events.append(finished)
    last = worker_service_pb2.RunResponse(events=events, relayed_events=relayed)
    if finished is not None and finished.HasField("outcome"):
        assert isinstance(response, AgentResponse)
        last.agent_checkpoint = response.checkpoint  # checked by _run_finished
    turn.finished = finished is not None
    return last


def _relay_put(
    relay: worker_relay.Relay, key: int, events: list[event_pb2.Event], refs: list[Any]
) -> None:
    try:
        relay.put(key, events, refs)
    except RelayClosed:
        raise Unavailable("the relay to the server ended") from None


# A tail longer than this is a whole history (a seeded one may hold 64 MiB).
SMALL_TAIL = 8


async def _history_tail(request: worker_service_pb2.RunRequest) -> list[dict[str, Any]]:
    """The request's history messages, converted; a long one in a thread,
    where the event loop runs between one message's copy and the next."""
    if len(request.history) <= SMALL_TAIL:
        return [history_message(m) for m in request.history]
    return await asyncio.to_thread(lambda: [history_message(m) for m in request.history])


def _agent_error_event(error: AgentError) -> event_pb2.Event:
    """The agent's own account of its failure, as RUN_ERROR."""
    return make_event(
        ET.RUN_ERROR,
        message=error.title,
        code=error.code,
        problem=problem(error.code, error.title, error.status, error.detail),
    )


def _outcome(task: asyncio.Task[Any], turn_id: str) -> AgentResponse | AgentError | None:
    """The agent's response, its AgentError, or None (logged here, server side
    only) if it failed otherwise."""
    if task.cancelled():
        log.error("the agent cancelled turn %s by itself", turn_id)
        return None
    exc = task.exception()
    if isinstance(exc, AgentError):
        log.warning("turn %s failed in the agent: %s", turn_id, exc.title)
        return exc
    if exc is not None:
        log.error("the agent raised on turn %s", turn_id, exc_info=exc)
        return None
    response = task.result()
    if not isinstance(response, AgentResponse):
        log.error(
            "the agent returned %s on turn %s, not an AgentResponse",
            type(response).__name__,
            turn_id,
        )
        return None
    return response


def _run_finished(
    response: AgentResponse,
    started: float,
    turn_id: str,
    unanswered: dict[str, str],
    client_tools: set[str],
) -> event_pb2.Event | None:
    """RUN_FINISHED for the response (with its outcome when the turn waits
    for the client), or None (logged) if its usage, metadata or interrupts
    are unusable."""
    try:
        event = make_event(
            ET.RUN_FINISHED,
            execution_time_ms=int((time.monotonic() - started) * 1000),
            result=_to_struct(response.metadata),
        )
        if (waits := pause.outcome(response, unanswered, client_tools)) is not None:
            event.outcome.CopyFrom(waits)
            pause.check_checkpoint(response.checkpoint)
        if response.usage is not None:
            usage = response.usage
            event.usage.append(
                event_pb2.TokenUsage(
                    input_tokens=usage.input_tokens,
                    output_tokens=usage.output_tokens,
                    total_tokens=usage.total_tokens,
                )
            )
    except (AttributeError, TypeError, ValueError):
        log.exception(
            "the agent's response to turn %s has bad usage, metadata or interrupts", turn_id
        )
        return None
    return event


def _to_struct(metadata: dict[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    # Through JSON so that values a Struct cannot hold (datetimes, sets) become strings.
    struct.update(json.loads(json.dumps(metadata, default=str)))
    return struct
