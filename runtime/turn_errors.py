"""Why a turn ended with RUN_ERROR: the smaller table of a turn's in-band
problems (RFC 7807, in the event), beside the status table of
``turnmesh.runtime.errors``. Agents add their own codes (``AgentError``)."""

from __future__ import annotations

import enum

from turnmesh.runtime.errors import PROBLEM_BASE
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
