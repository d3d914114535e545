"""Responses read back (``GET /v1/responses/{id}``) and cancelled."""

from __future__ import annotations

import contextlib

from google.api import httpbody_pb2

from turnmesh.runtime.errors import InvalidArgument, NotFound
from turnmesh.server.compat._common import Mesh, invalid, json_body
from turnmesh.server.compat.openai_responses.ids import parse_response_id
from turnmesh.server.compat.openai_responses.request import ResponseRequest
from turnmesh.server.compat.openai_responses.response import STATUSES, Response
from turnmesh.v1 import event_pb2
from turnmesh.v1 import session_service_pb2 as spb


async def get(mesh: Mesh, response_id_value: str) -> httpbody_pb2.HttpBody:
    return json_body((await _stored(mesh, response_id_value)).body())


async def _stored(mesh: Mesh, response_id_value: str) -> Response:
    """A response as the store keeps it: its answer from the history, or,
    before it has one (a background response queued or running, or one
    that failed), its turn's state."""
    session_id, turn_id = parse_response_id(response_id_value, "response_id")
    missing = NotFound(f"response {response_id_value!r} not found")
    # The turn first: one that says it finished committed before, so the
    # history read next holds its answer.
    turn = await _turn(mesh, session_id, turn_id)
    try:
        session = await mesh.get_session(session_id)
        history = await mesh.history(session_id)
    except NotFound as exc:
        raise missing from exc
    # The model a response was made with is the session's agent.
    request = ResponseRequest(model=session.agent_name, input="")
    response = Response(request, session_id)
    response.started(turn_id)
    request.background = turn is not None and turn.background
    messages = [m for m in history if m.turn_id == turn_id]
    if not messages or messages[-1].role != "assistant":
        if turn is None or turn.state not in STATUSES:
            raise missing
        response.status = STATUSES[turn.state]
        response.created_at = turn.create_time.seconds
        if turn.state == spb.TURN_STATE_FAILED:
            response.error = {
                "code": turn.error_code or "server_error",
                "message": turn.error_message or "the response failed",
            }
        return response
    final = messages[-1]
    response.created_at = final.created_at.seconds
    # The stored answer, folded as the live one was.
    response.feed(event_pb2.Event(type=event_pb2.TEXT_MESSAGE_CONTENT, delta=final.content))
    for message in messages:
        for call in message.tool_calls:
            response.calls[call.id] = [call.function.name, call.function.arguments]
    # What it waits for, while it waits (once answered, its output is its text).
    outcome = event_pb2.RunOutcome()
    if session.HasField("pause") and session.pause.turn_id == turn_id:
        outcome.pending_tool_call_ids.extend(c.id for c in session.pause.tool_calls)
        outcome.interrupts.extend(session.pause.interrupts)
    response.feed(
        event_pb2.Event(type=event_pb2.RUN_FINISHED, usage=[final.usage], outcome=outcome)
    )
    return response


async def _turn(mesh: Mesh, session_id: str, turn_id: str) -> spb.Turn | None:
    """The turn, if the server still knows it (a background one: for days)."""
    try:
        return await mesh.get_turn(session_id, turn_id)
    except (NotFound, InvalidArgument):
        return None


async def cancel(mesh: Mesh, response_id_value: str) -> httpbody_pb2.HttpBody:
    """Cancel a background response (OpenAI's rule: only those); a response
    that ended already is answered as it ended."""
    session_id, turn_id = parse_response_id(response_id_value, "response_id")
    turn = await _turn(mesh, session_id, turn_id)
    if turn is None:
        raise NotFound(f"response {response_id_value!r} not found")
    if not turn.background:
        raise invalid("response_id", "only a background response can be cancelled")
    cancelled = False
    if turn.state in (spb.TURN_STATE_QUEUED, spb.TURN_STATE_RUNNING):
        with contextlib.suppress(NotFound):  # it ended meanwhile
            state = await mesh.cancel_turn(session_id, turn_id)
            cancelled = state == spb.TURN_STATE_CANCELLED
    response = await _stored(mesh, response_id_value)
    if cancelled and response.status in ("queued", "in_progress"):
        response.status = "cancelled"  # its end (RUN_ERROR) is on its way
    return json_body(response.body())
