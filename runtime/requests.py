"""The request id a call carries: Envoy's ``x-request-id`` (it makes one for
every request from outside, and returns it to the client), so that one id
finds a request in the edge's access log, in its problem+json ``instance``
and in the log line of the turn it ran.

Forwarded with a call to the session's owner, and held by the turn (a turn
outlives the call that started it).
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Iterable

__all__ = ["REQUEST_ID_METADATA", "current", "set_from"]

REQUEST_ID_METADATA = "x-request-id"
# Envoy's are UUIDs; anything else is kept out of the logs.
_WELL_FORMED = re.compile(r"[A-Za-z0-9._:-]{1,128}")

_current: contextvars.ContextVar[str] = contextvars.ContextVar("turnmesh_request_id", default="")


def current() -> str:
    """This call's request id, or "" when it came with none."""
    return _current.get()


def set_from(metadata: Iterable[tuple[str, str | bytes]]) -> None:
    """Take the call's request id from its metadata (every call: each runs in
    a task of its own, so no call sees another's)."""
    for key, value in metadata:
        if key == REQUEST_ID_METADATA:
            well_formed = isinstance(value, str) and _WELL_FORMED.fullmatch(value)
            _current.set(value if well_formed and isinstance(value, str) else "")
            return
    _current.set("")
