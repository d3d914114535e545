"""A2A task ids that name their session and turn (``<turn>.<session,
base64url>``), so any server can find a task from its id alone, as
Responses ids do; the context id is the session's id as its caller names it."""

from __future__ import annotations

import base64
import binascii

from turnmesh.runtime.errors import TaskNotFound

# Longer ids are not echoed back in an error (they name no task anyway).
MAX_ECHOED_ID = 200


def task_id(session_id: str, turn_id: str) -> str:
    encoded = base64.urlsafe_b64encode(session_id.encode()).decode().rstrip("=")
    return f"{turn_id}.{encoded}"


def not_found(value: str) -> TaskNotFound:
    shown = repr(value) if len(value) <= MAX_ECHOED_ID else "requested"
    return TaskNotFound(f"task {shown} not found")


def parse_task_id(value: str) -> tuple[str, str]:
    """(session, turn) of a task id; TaskNotFound for anything else (an id
    this mesh never made names no task: the spec's answer, not a 400)."""
    turn_id, _, encoded = value.partition(".")
    try:
        session_id = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise not_found(value) from None
    # Only the id as this mesh spells it: another spelling of the same bytes
    # (padding, base64's unused bits) would key a task's configs apart from it.
    if not turn_id or not session_id or task_id(session_id, turn_id) != value:
        raise not_found(value)
    return session_id, turn_id
