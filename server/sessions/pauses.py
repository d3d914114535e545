"""Turns that wait for the client: what a session waits for.

A turn pauses when its agent leaves calls of the caller's tools without a
result, or asks for approvals and answers (the RUN_FINISHED outcome). Its
commit records a ``Pause`` on the session (durably, with the history); the
next turn must answer it (``answers``: one ``ToolResult`` per call and one
``ResumeEntry`` per interrupt). A pause past its expiry, or cancelled, is
answered by the server: each call gets an error result and each interrupt a
"cancelled" entry, which the next turn (or the cancel) writes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from google.protobuf import timestamp_pb2

from turnmesh.runtime.errors import AwaitingClient
from turnmesh.runtime.principals import public_id
from turnmesh.v1 import event_pb2, message_pb2

__all__ = [
    "EXPIRED",
    "active",
    "expired",
    "gated_results",
    "keep_interrupts",
    "make_pause",
    "parse",
    "refuse_plain_turn",
    "seeded",
    "since",
    "why_unanswered",
]

EXPIRED = "the client did not answer before the pause expired"
CANCELLED = "the client cancelled the pause"
NO_RESULT = "the agent reported no result for this call"


def parse(stored: bytes) -> message_pb2.Pause | None:
    """A record's pause, or None when it waits for nothing."""
    if not stored:
        return None
    return message_pb2.Pause.FromString(stored)


def expired(pause: message_pb2.Pause, now: float | None = None) -> bool:
    """Whether the pause waits no more: past its expiry, or cancelled."""
    if pause.cancelled:
        return True
    at = pause.expire_time.ToNanoseconds() / 1e9
    return (time.time() if now is None else now) >= at


def why_unanswered(pause: message_pb2.Pause) -> str:
    return CANCELLED if pause.cancelled else EXPIRED


def active(stored: bytes) -> message_pb2.Pause | None:
    """A record's pause while it still waits (not expired or cancelled)."""
    pause = parse(stored)
    return None if pause is None or expired(pause) else pause


def make_pause(
    turn_id: str,
    outcome: event_pb2.RunOutcome,
    calls: dict[str, message_pb2.ToolCall],
    timeout_seconds: float,
    tool_calls: Sequence[message_pb2.ToolCall] = (),
) -> message_pb2.Pause:
    """The pause a turn leaves (its outcome's interrupts get their expiry)."""
    expire = timestamp_pb2.Timestamp()
    expire.FromNanoseconds(int((time.time() + timeout_seconds) * 1e9))
    pause = message_pb2.Pause(turn_id=turn_id, expire_time=expire, tool_calls=tool_calls)
    for call_id in outcome.pending_tool_call_ids:
        if call_id in calls:
            pause.tool_calls.append(calls[call_id])
    for interrupt in outcome.interrupts:
        interrupt.expires_at.CopyFrom(expire)
        pause.interrupts.append(interrupt)
    return pause


def seeded(
    messages: Sequence[message_pb2.Message], timeout_seconds: float
) -> message_pb2.Pause | None:
    """The pause a session created with history starts in: the calls of a
    last assistant message that no tool message answers yet, and what it
    asked (its ``interrupts``: a fork or branch of a turn that paused). This
    is how a stateless caller (chat completions, Responses, a new AG-UI
    thread) that resends the whole conversation continues a tool loop:
    history up to the calls seeds the session, and the trailing tool
    messages answer them. A call an approval gates is the agent's: it waits
    for the approval, never for a result from the client."""
    # From the end back to the last message with calls: the results of the
    # agent's own calls among them (tool messages), and what it said or asked
    # after them (assistant messages); a user's message ends the search.
    answered: set[str] = set()
    interrupts: list[event_pb2.Interrupt] = []
    calls: Sequence[message_pb2.ToolCall] = ()
    spoke_after = False  # the agent went on after its calls: none is the client's
    for message in reversed(messages):
        if message.role == "tool":
            answered.add(message.tool_call_id)
            continue
        if message.role != "assistant":
            break
        interrupts[:0] = message.interrupts
        if message.tool_calls:
            calls = message.tool_calls
            break
        spoke_after = True
    gated = {i.tool_call_id for i in interrupts if i.tool_call_id}
    waiting = [c for c in calls if not spoke_after and c.id not in answered and c.id not in gated]
    if not waiting and not interrupts:
        return None
    outcome = event_pb2.RunOutcome(type="interrupt" if interrupts else "success")
    for interrupt in interrupts:
        outcome.interrupts.add().CopyFrom(interrupt)
    return make_pause(messages[-1].turn_id, outcome, {}, timeout_seconds, waiting)


def keep_interrupts(
    built: list[message_pb2.Message],
    outcome: event_pb2.RunOutcome,
    turn_id: str,
    created: timestamp_pb2.Timestamp,
) -> None:
    """Record what a paused turn asked, so that history alone says what the
    turn waits for (``seeded``): on the message with the calls it waits on
    (those its approvals gate, the client's; the agent's own results may
    follow it, as a chat model requires), else on its last assistant
    message (one more, empty, if the turn ended on a tool's result)."""
    interrupts = outcome.interrupts
    waits_on = {i.tool_call_id for i in interrupts if i.tool_call_id}
    waits_on.update(outcome.pending_tool_call_ids)
    target = next(
        (
            m
            for m in reversed(built)
            if m.role == "assistant" and any(c.id in waits_on for c in m.tool_calls)
        ),
        None,
    )
    if target is None:
        if not built or built[-1].role != "assistant":
            built.append(message_pb2.Message(role="assistant", turn_id=turn_id, created_at=created))
        target = built[-1]
    for interrupt in interrupts:
        kept = target.interrupts.add()
        kept.CopyFrom(interrupt)
        kept.ClearField("expires_at")  # the pause's, renewed by whatever seeds from it


def since(pause: message_pb2.Pause) -> str:
    """What a pause waits since, in words."""
    return f"turn {pause.turn_id!r}" if pause.turn_id else "its seeded history"


def _waits_for(pause: message_pb2.Pause) -> dict[str, str]:
    """ErrorInfo metadata: what the session waits for."""
    return {
        "turn_id": pause.turn_id,
        "tool_call_ids": ",".join(c.id for c in pause.tool_calls),
        "interrupt_ids": ",".join(i.id for i in pause.interrupts),
    }


def _describe(pause: message_pb2.Pause) -> str:
    parts = []
    if pause.tool_calls:
        ids = ", ".join(c.id for c in pause.tool_calls)
        parts.append(f"tool_results for calls {ids}")
    if pause.interrupts:
        ids = ", ".join(i.id for i in pause.interrupts)
        parts.append(f"resume entries for interrupts {ids}")
    return " and ".join(parts)


def refuse_plain_turn(session_id: str, pause: message_pb2.Pause) -> AwaitingClient:
    """A turn that does not answer a session that waits."""
    # A seeded pause has no turn of this session to cancel.
    cancel = f", or cancel turn {pause.turn_id!r}" if pause.turn_id else ""
    return AwaitingClient(
        f"session {public_id(session_id)!r} waits for the client since"
        f" {since(pause)}: send {_describe(pause)}{cancel}",
        metadata=_waits_for(pause),
    )


def gated_results(
    answering: message_pb2.Pause | None,
    built: list[message_pb2.Message],
    turn_id: str,
    created: timestamp_pb2.Timestamp,
) -> tuple[list[message_pb2.Message], list[message_pb2.Message]]:
    """The results of the calls an answered pause's approvals gated, apart
    from the rest of what the turn built: they answer the paused assistant
    message, so they go before the turn's user message (a chat model takes
    a tool message only right after the calls it answers). A gated call the
    agent left without a result gets an error one, so history stays
    well-formed whatever the agent did."""
    gated = [i.tool_call_id for i in (answering.interrupts if answering else ()) if i.tool_call_id]
    if not gated:
        return [], built
    wanted = set(gated)
    results: dict[str, message_pb2.Message] = {}
    rest: list[message_pb2.Message] = []
    for message in built:
        if message.role == "tool" and message.tool_call_id in wanted:
            results.setdefault(message.tool_call_id, message)  # a repeat is dropped
        else:
            rest.append(message)
    hoisted = [
        results.get(call_id)
        or message_pb2.Message(
            role="tool", tool_call_id=call_id, error=NO_RESULT, turn_id=turn_id, created_at=created
        )
        for call_id in dict.fromkeys(gated)
    ]
    return hoisted, rest
