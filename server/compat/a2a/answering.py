"""A message on an INPUT_REQUIRED task as the answers to its pause.

Its data parts may say them whole, in the native API's terms:
``{"resume": [{"interruptId", "status", "payload"}]}`` (one entry per
approval or question; ``status`` "resolved" unless said) and
``{"toolResults": [{"toolCallId", "content", "error"}]}`` (one per call of
the client's tools); the message's text then goes to the agent beside them.
Without either, a task that waits for one thing takes the message itself:
one question or approval is answered with the message's data part (its
value is the payload: ``{"approved": true}``, ``{"color": "green"}``) or,
with none, its text; one client tool's call gets the text as its result.
The mesh checks the answers as on every surface (``sessions.answers``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from turnmesh.server.compat._common import resume_entry
from turnmesh.server.compat.a2a.messages import Incoming, invalid_params
from turnmesh.server.sessions.answers import MAX_ANSWERS
from turnmesh.v1 import event_pb2, message_pb2

RESUME_KEY = "resume"
RESULTS_KEY = "toolResults"


@dataclass
class Answers:
    tool_results: list[message_pb2.ToolResult] = field(default_factory=list)
    resume: list[message_pb2.ResumeEntry] = field(default_factory=list)
    # The message's text for the agent (empty when it was the answer).
    text: str = ""


def _text(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise invalid_params(where, "must be a string")
    return value


def _entries(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise invalid_params(where, "must be a list of objects")
    if len(value) > MAX_ANSWERS:
        raise invalid_params(where, f"at most {MAX_ANSWERS}")
    return value


def _given(incoming: Incoming) -> Answers | None:
    """The answers the data parts say whole, if any do."""
    found = Answers(text=incoming.text)
    said = False
    for index, data in enumerate(incoming.data):
        if not isinstance(data, dict):
            continue
        where = f"message.parts[{index}].data"
        if RESUME_KEY in data:
            said = True
            for n, entry in enumerate(_entries(data[RESUME_KEY], f"{where}.{RESUME_KEY}")):
                at = f"{where}.{RESUME_KEY}[{n}]"
                found.resume.append(
                    resume_entry(
                        f"{at}.payload",
                        _text(entry.get("interruptId"), f"{at}.interruptId"),
                        _text(entry.get("status", "resolved"), f"{at}.status"),
                        entry.get("payload"),
                    )
                )
        if RESULTS_KEY in data:
            said = True
            for n, entry in enumerate(_entries(data[RESULTS_KEY], f"{where}.{RESULTS_KEY}")):
                at = f"{where}.{RESULTS_KEY}[{n}]"
                found.tool_results.append(
                    message_pb2.ToolResult(
                        tool_call_id=_text(entry.get("toolCallId"), f"{at}.toolCallId"),
                        content=_text(entry.get("content"), f"{at}.content"),
                        error=_text(entry.get("error"), f"{at}.error"),
                    )
                )
    return found if said else None


def answers(incoming: Incoming, outcome: event_pb2.RunOutcome) -> Answers:
    """The answers a message gives to what its task waits for (``outcome``)."""
    given = _given(incoming)
    if given is not None:
        return given
    interrupts, calls = list(outcome.interrupts), list(outcome.pending_tool_call_ids)
    if len(interrupts) == 1 and not calls:
        payload = incoming.data[0] if incoming.data else incoming.text
        entry = resume_entry("message.parts", interrupts[0].id, "resolved", payload)
        return Answers(resume=[entry])
    if len(calls) == 1 and not interrupts:
        content = incoming.text
        if not content and incoming.data:
            content = json.dumps(incoming.data[0], separators=(",", ":"))
        result = message_pb2.ToolResult(tool_call_id=calls[0], content=content)
        return Answers(tool_results=[result])
    raise invalid_params(
        "message.parts",
        "the task waits for several answers: send them as a data part"
        ' {"resume": [...], "toolResults": [...]}',
    )
