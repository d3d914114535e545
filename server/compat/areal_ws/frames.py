"""The AReaL gateway's WebSocket frames (SEED-CONTRACTS.md §3): a client's
``req`` read and checked, and the ``res`` and ``event`` frames written back.

Pure functions: nothing here touches a socket or the mesh."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from turnmesh.server.sessions import validation

# The id a failed answer carries when the frame named none (the seed's).
UNKNOWN_ID = "unknown"
# The one method the gateway serves.
AGENT_METHOD = "agent"
# A client's request id: echoed back, so bounded like any other name.
MAX_ID_CHARS = 256
MAX_IDEMPOTENCY_KEY_CHARS = 256
# A frame's JSON nesting, checked before parsing it (json.loads recurses).
MAX_DEPTH = 32


class FrameError(ValueError):
    """A frame answered by ``res`` failed with ``reason``, naming ``request_id``."""

    def __init__(self, request_id: str, reason: str) -> None:
        super().__init__(reason)
        self.request_id = request_id
        self.reason = reason


@dataclass(frozen=True)
class AgentRequest:
    """A ``req`` with method ``agent``, as the mesh runs it."""

    id: str
    message: str
    session_key: str
    idempotency_key: str
    # True for queueMode "followup" (ENQUEUE); anything else collects.
    followup: bool


def parse(text: str) -> AgentRequest:
    """The request a text frame carries; raises FrameError with the reason
    the client is told (and the request's id when it has one)."""
    if _too_deep(text):
        raise FrameError(UNKNOWN_ID, f"frame is nested deeper than {MAX_DEPTH} levels")
    try:
        frame = json.loads(text)
    except ValueError:  # RecursionError cannot happen: the depth is checked
        raise FrameError(UNKNOWN_ID, "frame is not JSON") from None
    if not isinstance(frame, dict):
        raise FrameError(UNKNOWN_ID, "frame is not a JSON object")
    request_id = _request_id(frame.get("id"))
    if frame.get("type") != "req":
        raise FrameError(request_id, "frame type must be 'req'")
    if frame.get("method") != AGENT_METHOD:
        raise FrameError(request_id, f"unknown method {_shown(frame.get('method'))}")
    params = frame.get("params", {})
    if not isinstance(params, dict):
        raise FrameError(request_id, "params must be an object")
    session_key = params.get("sessionKey")
    if not session_key:
        raise FrameError(request_id, "sessionKey is required")
    if not isinstance(session_key, str) or validation.session_id_violations(session_key):
        raise FrameError(request_id, "sessionKey must be 1-128 characters of A-Z a-z 0-9 . _ : -")
    message = params.get("message", "")
    if not isinstance(message, str) or not _encodable(message):
        raise FrameError(request_id, "message must be a string of valid Unicode")
    if violations := validation.message_violations(message, "message"):
        raise FrameError(request_id, "; ".join(f"{v.field}: {v.description}" for v in violations))
    key = params.get("idempotencyKey") or ""
    if not isinstance(key, str) or len(key) > MAX_IDEMPOTENCY_KEY_CHARS or not _encodable(key):
        raise FrameError(
            request_id,
            f"idempotencyKey must be a string of at most {MAX_IDEMPOTENCY_KEY_CHARS} characters",
        )
    return AgentRequest(
        id=request_id,
        message=message,
        session_key=session_key,
        idempotency_key=key,
        followup=params.get("queueMode") == "followup",
    )


def _request_id(value: Any) -> str:
    """The id to answer with: the client's when it is a usable one."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return UNKNOWN_ID
    text = str(value)
    return text if 0 < len(text) <= MAX_ID_CHARS and _encodable(text) else UNKNOWN_ID


def _encodable(text: str) -> bool:
    """JSON may escape lone surrogates, which no UTF-8 text (a frame, a
    protobuf string) can carry."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _shown(value: Any) -> str:
    """A client's value quoted in a reason, bounded."""
    text = value if isinstance(value, str) else json.dumps(value)
    return ascii(text[:64])


def _too_deep(text: str) -> bool:
    """Whether brackets outside strings nest past MAX_DEPTH (a linear scan,
    so a hostile frame costs no recursion)."""
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif char in "]}":
            depth -= 1
    return False


def run_id(turn_id: str) -> str:
    """The seed's run id form (``run-`` and 12 hex digits), derived from the
    turn's id: the same turn (a retry with its idempotency key) has the same."""
    return "run-" + hashlib.sha256(turn_id.encode()).hexdigest()[:12]


def _dump(frame: dict[str, Any]) -> str:
    return json.dumps(frame, separators=(",", ":"), ensure_ascii=False)


def accepted(request_id: str, run: str) -> str:
    return _dump(
        {
            "type": "res",
            "id": request_id,
            "ok": True,
            "payload": {"runId": run, "status": "accepted"},
        }
    )


def complete(
    request_id: str, run: str, summary: str, interrupts: list[dict[str, str]] | None = None
) -> str:
    """The run's end; ``summary`` omitted when empty, as the seed does.
    ``interrupts`` (turnmesh's extension): what a paused turn waits for."""
    payload: dict[str, Any] = {"runId": run, "status": "complete"}
    if summary:
        payload["summary"] = summary
    if interrupts:
        payload["interrupts"] = interrupts
    return _dump({"type": "res", "id": request_id, "ok": True, "payload": payload})


def failed(request_id: str, error: str, run: str = "", code: str = "") -> str:
    """A refused or failed request. ``runId`` only once a turn had one;
    ``code`` (an extension): the mesh's reason, e.g. SESSION_BUSY."""
    payload: dict[str, Any] = {"status": "failed", "error": error}
    if run:
        payload["runId"] = run
    if code:
        payload["code"] = code
    return _dump({"type": "res", "id": request_id, "ok": False, "payload": payload})


def delta(run: str, text: str) -> str:
    return _dump({"type": "event", "event": "agent", "payload": {"runId": run, "delta": text}})


def tool_call(run: str, name: str, args: str) -> str:
    return _dump(
        {
            "type": "event",
            "event": "agent",
            "payload": {"runId": run, "toolCall": {"name": name, "args": args}},
        }
    )
