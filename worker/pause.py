"""How a turn that waits for the client ends: the RUN_FINISHED outcome.

Calls of the caller's tools left without a result are pending tool calls
(AG-UI's success outcome with ``pendingToolCallIds``); the agent's
``interrupts`` are approvals and questions (AG-UI's interrupt outcome). The
server stamps each interrupt's expiry and records the pause.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from google.protobuf import struct_pb2

from turnmesh.agent import MAX_CHECKPOINT_BYTES, AgentResponse
from turnmesh.runtime.ids import new_id
from turnmesh.v1 import event_pb2

__all__ = ["MAX_INTERRUPTS", "BadPause", "check_checkpoint", "outcome"]

# A turn asks at most this many things at once (each a client's answer).
MAX_INTERRUPTS = 16
MAX_TEXT = 10_000
MAX_INTERRUPT_BYTES = 64 * 1024


class BadPause(ValueError):
    """The agent's interrupts cannot be asked (logged; the turn fails)."""


def outcome(
    response: AgentResponse, unanswered: Mapping[str, str], client_tools: set[str]
) -> event_pb2.RunOutcome | None:
    """The turn's outcome, or None for a plain success."""
    interrupts = list(response.interrupts or ())
    # A call an approval gates is the agent's own, whatever its name: a
    # caller's tool of the same name does not make it the client's to run.
    gated = {getattr(asked, "tool_call_id", None) for asked in interrupts}
    pending = [
        call_id
        for call_id, name in unanswered.items()
        if name in client_tools and call_id not in gated
    ]
    if not interrupts and not pending:
        return None
    if len(interrupts) > MAX_INTERRUPTS:
        raise BadPause(f"{len(interrupts)} interrupts; at most {MAX_INTERRUPTS}")
    result = event_pb2.RunOutcome(
        type="interrupt" if interrupts else "success", pending_tool_call_ids=pending
    )
    seen: set[str] = set()
    for asked in interrupts:
        interrupt = result.interrupts.add(
            id=asked.id or f"int_{new_id()}",
            reason=asked.reason or ("tool_approval" if asked.tool_call_id else "question"),
            message=asked.message,
        )
        if interrupt.id in seen or len(interrupt.id) > 128:
            raise BadPause(f"interrupt id {interrupt.id!r} is repeated or too long")
        seen.add(interrupt.id)
        if len(interrupt.reason) > 64 or len(interrupt.message) > MAX_TEXT:
            raise BadPause("an interrupt's reason or message is too long")
        if asked.tool_call_id:
            if asked.tool_call_id not in unanswered or asked.tool_call_id in pending:
                raise BadPause(
                    f"interrupt {interrupt.id!r} gates call {asked.tool_call_id!r}, which is"
                    " not a call of this turn's own tools left without a result"
                )
            interrupt.tool_call_id = asked.tool_call_id
        if asked.response_schema is not None:
            if not isinstance(asked.response_schema, dict):
                raise BadPause("an interrupt's response_schema must be a JSON object")
            interrupt.response_schema.CopyFrom(_struct(asked.response_schema))
        if asked.metadata:
            interrupt.metadata.CopyFrom(_struct(dict(asked.metadata)))
        # Kept with the pause, in history and in webhook notices: bounded.
        if interrupt.ByteSize() > MAX_INTERRUPT_BYTES:
            raise BadPause(f"interrupt {interrupt.id!r} is over {MAX_INTERRUPT_BYTES} bytes")
    return result


def check_checkpoint(checkpoint: object) -> None:
    """What the agent saved with its pause: bytes, within the bound."""
    if not isinstance(checkpoint, bytes):
        raise BadPause(f"a checkpoint must be bytes, not {type(checkpoint).__name__}")
    if len(checkpoint) > MAX_CHECKPOINT_BYTES:
        raise BadPause(f"a checkpoint of {len(checkpoint)} bytes; at most {MAX_CHECKPOINT_BYTES}")


def _struct(value: dict[str, object]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    # Through JSON: values a Struct cannot hold become strings.
    struct.update(json.loads(json.dumps(value, default=str)))
    return struct
