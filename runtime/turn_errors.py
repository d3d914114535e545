"""Why a turn ended with RUN_ERROR: the smaller table of a turn's in-band
problems (RFC 7807, in the event), beside the status table of
``turnmesh.runtime.errors``, and the row of that table a surface that
answers in one piece gives such a turn (``turn_error``). Agents add their
own codes (``AgentError``)."""

from __future__ import annotations

import enum

from turnmesh.runtime.errors import (
    PROBLEM_BASE,
    AwaitingClient,
    TurnCancelled,
    TurnFailed,
    TurnmeshError,
    Unavailable,
)
from turnmesh.v1 import event_pb2


class TurnError(enum.Enum):
    """Why a turn ended with RUN_ERROR: its ``code``, problem title and status.

    Agents add their own codes (``AgentError``); these are the mesh's.
    """

    CANCELLED = ("cancelled", "Turn cancelled", 499)
    INTERRUPTED = ("interrupted", "Turn interrupted by a newer turn", 499)
    DISCONNECTED = ("disconnected", "Client disconnected", 499)
    SESSION_DELETED = ("session_deleted", "Session deleted", 499)
    SHUTDOWN = ("shutdown", "Server shutting down", 499)
    WORKER_FAILED = ("worker_failed", "Worker failed", 502)
    WORKER_UNAVAILABLE = ("worker_unavailable", "No worker available", 503)
    OWNER_LOST = ("owner_lost", "Server lost", 503)
    # A queued turn reached a session that a turn before it left waiting.
    AWAITING_CLIENT = ("awaiting_client", "Session waits for the client", 409)
    AGENT_ERROR = ("agent_error", "Agent error", 500)
    INTERNAL = ("internal", "Internal error", 500)

    def __init__(self, code: str, title: str, status: int) -> None:
        self.code = code
        self.title = title
        self.status = status

    def event(self, detail: str) -> event_pb2.Event:
        """A RUN_ERROR event with this error's RFC 7807 problem."""
        return error_event(self.code, self.title, self.status, detail)


def problem(code: str, title: str, status: int, detail: str) -> event_pb2.Problem:
    """An in-band RFC 7807 problem; its type is named after the code."""
    return event_pb2.Problem(
        type=PROBLEM_BASE + code.replace("_", "-"), title=title, status=status, detail=detail
    )


def error_event(code: str, title: str, status: int, detail: str) -> event_pb2.Event:
    """A RUN_ERROR with an RFC 7807 problem."""
    return event_pb2.Event(
        type=event_pb2.RUN_ERROR,
        message=detail,
        code=code,
        problem=problem(code, title, status, detail),
    )


# RUN_ERROR codes that mean the turn was stopped on purpose, not that it broke.
STOPPED_CODES = frozenset(
    e.code
    for e in (
        TurnError.CANCELLED,
        TurnError.INTERRUPTED,
        TurnError.DISCONNECTED,
        TurnError.SESSION_DELETED,
    )
)
# The mesh's own faults: the turn never reached its agent's end, and the same
# request sent again may well succeed (by code: an agent's own AgentError
# says 502 too, and is no mesh fault).
MESH_FAULT_CODES = frozenset(
    e.code
    for e in (
        TurnError.WORKER_FAILED,
        TurnError.WORKER_UNAVAILABLE,
        TurnError.OWNER_LOST,
        TurnError.SHUTDOWN,
    )
)


def turn_error(event: event_pb2.Event) -> TurnmeshError:
    """A turn that ended with RUN_ERROR, for a surface that answers in one
    piece (the table is in docs/api.md, "A turn that fails"). History is
    unchanged in every case; only a mesh fault is worth the SDKs' automatic
    retry (503): the others say ``x-should-retry: false``, never a bare 500."""
    message = event.message or "the turn failed"
    if event.problem.detail and event.problem.detail != message:
        message = f"{message}: {event.problem.detail}"
    if event.code in MESH_FAULT_CODES:
        return Unavailable(message)
    if event.code == TurnError.AWAITING_CLIENT.code:
        # Queued behind a turn that then paused: the session's pause, as a
        # turn refused at once would have been told.
        return AwaitingClient(message)
    cause = {"cause": event.code or "internal"}
    if event.code in STOPPED_CODES:
        return TurnCancelled(message, metadata=cause)
    return TurnFailed(message, metadata=cause)
