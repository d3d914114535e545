"""The simple chat API: ``POST /v1/chat`` and ``POST /v1/chat:stream``.

``/v1/chat`` answers HoloDeck's ``ChatResponse`` field for field: tool calls
with their arguments as an object and a status of success, error or pending,
``tool_calls`` always present, and ``execution_time_ms`` the request's latency.

A turn that ends waiting for the client leaves calls ``pending``: calls of the
request's own ``tools`` (the client runs them) and calls that wait for an
approval (listed in ``interrupts`` with the questions). The next request on
the session answers with ``tool_results`` (one per pending call of its tools,
by ``tool_calls[].id``) and ``resume`` (one per interrupt), TurnRequest's
fields under the same names; its ``message`` may then be empty.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator

from google.protobuf import json_format

from turnmesh.runtime.errors import NotFound
from turnmesh.runtime.events import Answer
from turnmesh.runtime.turn_errors import turn_error
from turnmesh.server.compat._common import Mesh, invalid
from turnmesh.v1 import compat_service_pb2 as cpb
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb

# turnmesh's tool runner reports a failed tool as a result starting with this.
TOOL_ERROR_PREFIX = "error:"


def health(native: spb.GetHealthResponse) -> cpb.ChatHealth:
    """HoloDeck's health: healthy while this server takes turns of the
    default agent (a live worker serves it)."""
    serving = native.status in (spb.LIFECYCLE_STATE_READY, spb.LIFECYCLE_STATE_RUNNING)
    return cpb.ChatHealth(
        status="healthy" if serving and native.agent_ready else "unhealthy",
        agent_name=native.agent_name,
        agent_ready=native.agent_ready,
        active_sessions=native.active_sessions,
        uptime_seconds=native.uptime_seconds,
    )


async def _session_for(mesh: Mesh, request: cpb.ChatRequest) -> str:
    """The request's session, or a new one if it is absent, unknown or
    expired; answers only to the session that waits for them."""
    if request.session_id and await mesh.session_exists(request.session_id):
        return request.session_id
    if request.tool_results or request.resume:
        if not request.session_id:
            raise invalid("session_id", "required with tool_results or resume")
        raise NotFound(
            f"session {request.session_id!r} is unknown or expired: nothing waits for"
            " these tool_results or resume entries"
        )
    return await mesh.create_session(None, request.agent_name or None)


async def stream(mesh: Mesh, request: cpb.ChatRequest) -> AsyncIterator[event_pb2.Event]:
    session_id = await _session_for(mesh, request)
    async with mesh.turn(
        session_id,
        request.message,
        # Each request its own turn and answer, as the seed's server gives
        # (COLLECT would answer two requests on a busy session with one).
        policy=spb.TURN_POLICY_ENQUEUE,
        files=request.files,
        tools=request.tools,
        tool_results=request.tool_results,
        resume=request.resume,
    ) as events:
        async for event in events:
            yield event


def _refuse(constant: str) -> float:
    raise ValueError(f"{constant} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999
        raise ValueError(f"{text} is out of range")
    return value


class _Calls:
    """A turn's tool calls as ``ChatToolCall``s. Events naming a call never
    started (an agent's mistake) add one rather than fail the answer."""

    def __init__(self, response: cpb.ChatResponse) -> None:
        self._response = response
        self._calls: dict[str, cpb.ChatToolCall] = {}
        self._args: dict[str, list[str]] = {}

    def _call(self, call_id: str, name: str) -> cpb.ChatToolCall:
        call = self._calls.get(call_id)
        if call is None:
            call = self._calls[call_id] = self._response.tool_calls.add(
                id=call_id, name=name, status="pending"
            )
            self._args[call_id] = []
        return call

    def feed(self, event: event_pb2.Event) -> None:
        if event.type == event_pb2.TOOL_CALL_START:
            self._call(event.tool_call_id, event.tool_call_name)
        elif event.type == event_pb2.TOOL_CALL_ARGS:
            self._call(event.tool_call_id, event.tool_call_name)
            self._args[event.tool_call_id].append(event.delta)
        elif event.type == event_pb2.TOOL_CALL_RESULT:
            failed = event.content.lstrip().lower().startswith(TOOL_ERROR_PREFIX)
            self._call(event.tool_call_id, event.tool_call_name).status = (
                "error" if failed else "success"
            )

    @property
    def unnamed(self) -> bool:
        """Whether a result came for a call this turn did not make (one an
        approval gated, made by the turn before)."""
        return any(not call.name for call in self._calls.values())

    def name_from(self, history: list[message_pb2.Message]) -> None:
        """Name the calls made by earlier turns as their messages did."""
        made = {call.id: call for m in history for call in m.tool_calls}
        for call_id, call in self._calls.items():
            if not call.name and (earlier := made.get(call_id)) is not None:
                call.name = earlier.function.name
                self._args[call_id] = [earlier.function.arguments]

    def finish(self, outcome: event_pb2.RunOutcome | None = None) -> None:
        """``outcome``: the turn's (RUN_FINISHED's); with it, a call without
        a result is ``pending`` only if the turn waits for the client to act
        on it (run it, or approve it), else ``error`` (it never returned)."""
        awaited = None
        if outcome is not None:
            awaited = set(outcome.pending_tool_call_ids)
            awaited.update(i.tool_call_id for i in outcome.interrupts if i.tool_call_id)
        for call_id, call in self._calls.items():
            if call.status == "pending" and awaited is not None and call_id not in awaited:
                call.status = "error"
            call.arguments_json = "".join(self._args[call_id])
            try:
                # NaN and Infinity parse, but no JSON answer can print them.
                value = json.loads(
                    call.arguments_json or "{}", parse_constant=_refuse, parse_float=_finite
                )
                if isinstance(value, dict):
                    json_format.ParseDict(value, call.arguments)
            except (ValueError, RecursionError, json_format.ParseError):
                # Not JSON (a model's slip), or deeper than a Struct holds:
                # the text stays, the object is {}.
                call.arguments.Clear()


async def chat(mesh: Mesh, request: cpb.ChatRequest) -> cpb.ChatResponse:
    started = time.monotonic()
    response = cpb.ChatResponse()
    calls = _Calls(response)
    answer = Answer()
    outcome = event_pb2.RunOutcome()
    async for event in stream(mesh, request):
        answer.feed(event)
        calls.feed(event)
        response.session_id = event.thread_id
        if event.type == event_pb2.RUN_STARTED:
            response.message_id = event.run_id  # until the answer's own message starts
        elif event.type == event_pb2.TEXT_MESSAGE_START:
            response.message_id = event.message_id
        elif event.type == event_pb2.RUN_FINISHED:
            outcome.CopyFrom(event.outcome)
        elif event.type == event_pb2.RUN_ERROR:
            raise turn_error(event)
    if calls.unnamed:
        calls.name_from(await mesh.history(response.session_id))
    calls.finish(outcome)
    for interrupt in outcome.interrupts:
        asked = response.interrupts.add(
            id=interrupt.id,
            reason=interrupt.reason,
            message=interrupt.message,
            tool_call_id=interrupt.tool_call_id,
        )
        if interrupt.HasField("response_schema"):
            asked.response_schema.CopyFrom(interrupt.response_schema)
        if interrupt.HasField("expires_at"):
            asked.expires_at.CopyFrom(interrupt.expires_at)
    # A turn that waits on an approval or a question says what it asks,
    # even when its agent said nothing (the call it gates is `pending`).
    response.content = answer.text or "\n".join(i.message for i in outcome.interrupts if i.message)
    if answer.usage.ByteSize():
        # Absent (the seed's null) when the agent reported no usage: the
        # transcoder prints no null, and zeros would claim a count.
        response.tokens_used.prompt_tokens = answer.usage.input_tokens
        response.tokens_used.completion_tokens = answer.usage.output_tokens
        response.tokens_used.total_tokens = answer.usage.total_tokens
    response.execution_time_ms = round((time.monotonic() - started) * 1000)
    return response
