"""One ``agent`` request run as a turn of the caller's session, as frames:
``res`` accepted once the turn has an id, its ``event`` frames, then ``res``
complete or failed."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from turnmesh.runtime.errors import AlreadyExists, TurnmeshError
from turnmesh.runtime.events import Answer
from turnmesh.runtime.turn_errors import turn_error
from turnmesh.server.compat._common import Mesh
from turnmesh.server.compat.areal_ws import frames
from turnmesh.v1 import event_pb2
from turnmesh.v1 import session_service_pb2 as spb

# A tool call's arguments, held until the call's end, at most (the mesh
# bounds events already; this bounds what one call can make us hold).
MAX_TOOL_ARGS_CHARS = 1024 * 1024


async def run(
    mesh: Mesh,
    request: frames.AgentRequest,
    on_disconnect: spb.DisconnectPolicy.ValueType = spb.DISCONNECT_POLICY_CONTINUE,
) -> AsyncIterator[str]:
    """The frames answering ``request``. If the socket closes, the turn goes
    on (the seed's agent service runs a run to its end) unless
    ``on_disconnect`` says cancel."""
    run_id = ""
    try:
        await _session(mesh, request.session_key)
        async with mesh.turn(
            request.session_key,
            request.message,
            policy=spb.TURN_POLICY_ENQUEUE if request.followup else spb.TURN_POLICY_COLLECT,
            on_disconnect=on_disconnect,
            idempotency_key=request.idempotency_key,
        ) as events:
            turn = _Turn()
            async for event in events:
                if not run_id and event.run_id:
                    run_id = frames.run_id(event.run_id)
                    yield frames.accepted(request.id, run_id)
                for frame in turn.feed(event, run_id):
                    yield frame
                if event.type == event_pb2.RUN_FINISHED:
                    yield frames.complete(
                        request.id, run_id, turn.summary(event), turn.asked(event)
                    )
                    return
                if event.type == event_pb2.RUN_ERROR:
                    error = turn_error(event)
                    yield frames.failed(request.id, error.detail, run_id, error.reason)
                    return
        yield frames.failed(request.id, "the turn ended without an outcome", run_id, "UNAVAILABLE")
    except TurnmeshError as exc:
        yield frames.failed(request.id, exc.detail, run_id, exc.reason)


async def _session(mesh: Mesh, session_key: str) -> None:
    """The caller's session named ``session_key``, made on first use with the
    server's default agent (another socket may make it at the same time)."""
    if await mesh.session_exists(session_key):
        return
    with contextlib.suppress(AlreadyExists):
        await mesh.create_session(session_key, None)


class _Turn:
    """A turn's events as the gateway's: text deltas, and each tool call once
    its arguments are complete."""

    def __init__(self) -> None:
        self._answer = Answer()
        self._calls: dict[str, tuple[str, list[str]]] = {}
        self._held = 0

    def feed(self, event: event_pb2.Event, run_id: str) -> list[str]:
        self._answer.feed(event)
        kind = event.type
        if kind == event_pb2.TEXT_MESSAGE_CONTENT and event.delta:
            return [frames.delta(run_id, event.delta)]
        if kind == event_pb2.TOOL_CALL_START:
            self._calls[event.tool_call_id] = (event.tool_call_name, [])
        elif kind == event_pb2.TOOL_CALL_ARGS and event.tool_call_id in self._calls:
            if self._held + len(event.delta) <= MAX_TOOL_ARGS_CHARS:
                self._calls[event.tool_call_id][1].append(event.delta)
                self._held += len(event.delta)
        elif kind == event_pb2.TOOL_CALL_END and event.tool_call_id in self._calls:
            name, parts = self._calls.pop(event.tool_call_id)
            self._held -= sum(len(p) for p in parts)
            return [frames.tool_call(run_id, name, "".join(parts) or "{}")]
        return []

    def summary(self, finished: event_pb2.Event) -> str:
        """The answer (the text after the last tool result); a turn that
        pauses for an approval or a question says what it asks."""
        interrupts = finished.outcome.interrupts
        return self._answer.text or "\n".join(i.message for i in interrupts if i.message)

    @staticmethod
    def asked(finished: event_pb2.Event) -> list[dict[str, str]]:
        """What a paused turn waits for (the ``interrupts`` extension)."""
        return [
            {
                key: value
                for key, value in (
                    ("id", i.id),
                    ("reason", i.reason),
                    ("message", i.message),
                    ("toolCallId", i.tool_call_id),
                )
                if value
            }
            for i in finished.outcome.interrupts
        ]
