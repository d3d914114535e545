"""A turn's answers to a session's pause: what they are, the one check of
them, and the table that names them in a caller's words.

Every surface answers a pause the same way underneath: one ``ToolResult``
per call the session waits on, one ``ResumeEntry`` per interrupt. The checks
are here and only here: ``violations`` (the answers alone, as the request
is validated), ``check`` (against the pause, as the turn is placed, or
against the calls a resent conversation ends with, before a session is
made for it). Their errors name the native fields (``tool_results[0]
.tool_call_id``); a surface that names them otherwise (``messages[3]``,
``input[2].call_id``) passes its ``Names`` and ``Names.rename`` puts the
errors in its words, the same way for every surface. What can only be known
as the turn is taken (an expired pause, a turn still queued) is checked by
``turns`` at that moment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from google.protobuf import timestamp_pb2

from turnmesh.runtime.errors import FieldViolation, InvalidArgument, NotWaiting
from turnmesh.runtime.principals import public_id
from turnmesh.server.sessions.pauses import expired, since
from turnmesh.v1 import event_pb2, message_pb2

__all__ = [
    "MAX_ANSWERS",
    "MAX_ID_CHARS",
    "Answers",
    "Names",
    "check",
    "check_resent",
    "lead_messages",
    "unanswered",
    "violations",
    "withdraws",
]

MAX_ANSWERS = 128
MAX_RESULT_CHARS = 1_000_000
# A call or interrupt id a caller sends back (ids the mesh and agents make are far shorter).
MAX_ID_CHARS = 256
RESUME_STATUSES = ("resolved", "cancelled")


class Answers:
    """What a turn answers a pause with."""

    __slots__ = ("resume", "tool_results")

    def __init__(
        self,
        tool_results: Sequence[message_pb2.ToolResult] = (),
        resume: Sequence[message_pb2.ResumeEntry] = (),
    ) -> None:
        self.tool_results = list(tool_results)
        self.resume = list(resume)

    def __bool__(self) -> bool:
        return bool(self.tool_results or self.resume)


def withdraws(answers: Answers) -> bool:
    """Answers that only cancel interrupts (no results, nothing resolved)."""
    return (
        bool(answers.resume)
        and not answers.tool_results
        and all(e.status == "cancelled" for e in answers.resume)
    )


def violations(answers: Answers) -> list[FieldViolation]:
    """What is wrong with answers on their own (before the pause is known)."""
    out: list[FieldViolation] = []
    if len(answers.tool_results) > MAX_ANSWERS:
        out.append(FieldViolation("tool_results", f"at most {MAX_ANSWERS}"))
    if len(answers.resume) > MAX_ANSWERS:
        out.append(FieldViolation("resume", f"at most {MAX_ANSWERS}"))
    for n, result in enumerate(answers.tool_results[:MAX_ANSWERS]):
        out += _id_violations(f"tool_results[{n}].tool_call_id", result.tool_call_id)
        if len(result.content) + len(result.error) > MAX_RESULT_CHARS:
            out.append(
                FieldViolation(
                    f"tool_results[{n}].content", f"at most {MAX_RESULT_CHARS} characters"
                )
            )
    for n, entry in enumerate(answers.resume[:MAX_ANSWERS]):
        out += _id_violations(f"resume[{n}].interrupt_id", entry.interrupt_id)
        if entry.status not in RESUME_STATUSES:
            out.append(FieldViolation(f"resume[{n}].status", "must be resolved or cancelled"))
    return out


def _id_violations(where: str, value: str) -> list[FieldViolation]:
    if not value:
        return [FieldViolation(where, "required")]
    if len(value) > MAX_ID_CHARS:
        return [FieldViolation(where, f"at most {MAX_ID_CHARS} characters")]
    return []


def check(session_id: str, pause: message_pb2.Pause | None, answers: Answers) -> None:
    """Answers must answer the session's pause exactly: each call and each
    interrupt once, nothing else. A pause that expired or was cancelled
    takes only the withdrawal of its interrupts (what an AG-UI client
    insists on); the server gives its own answers then."""
    if pause is None:
        raise NotWaiting(
            f"session {public_id(session_id)!r} waits for no tool results or resume entries"
            " (no turn paused, or its pause was answered already)"
        )
    interrupts = [i.id for i in pause.interrupts]
    resumed = [e.interrupt_id for e in answers.resume]
    if expired(pause):
        withdrawn = _match(
            SESSION, "resume", "interrupt_id", resumed, interrupts, "interrupt", False
        )
        if withdraws(answers) and not withdrawn:
            return
        what = "was cancelled" if pause.cancelled else "expired"
        raise NotWaiting(
            f"session {public_id(session_id)!r}'s pause since {since(pause)} {what};"
            " the next turn tells the agent its calls went unanswered: send a message",
            metadata={"why": "cancelled" if pause.cancelled else "expired"},
        )
    found = _match(
        SESSION,
        "tool_results",
        "tool_call_id",
        [r.tool_call_id for r in answers.tool_results],
        [c.id for c in pause.tool_calls],
        "call",
    ) + _match(SESSION, "resume", "interrupt_id", resumed, interrupts, "interrupt")
    if found:
        raise InvalidArgument(found)


def check_resent(
    calls: Sequence[message_pb2.ToolCall],
    answers: Answers,
    interrupts: Sequence[event_pb2.Interrupt] = (),
) -> None:
    """Answers a stateless caller sends after the conversation it resends:
    they answer the calls and interrupts that conversation ends with,
    exactly (checked before any session is made for it: a refused request
    leaves none)."""
    found = _match(
        RESENT,
        "tool_results",
        "tool_call_id",
        [r.tool_call_id for r in answers.tool_results],
        [c.id for c in calls],
        "call",
    ) + _match(
        RESENT,
        "resume",
        "interrupt_id",
        [e.interrupt_id for e in answers.resume],
        [i.id for i in interrupts],
        "interrupt",
    )
    if found:
        raise InvalidArgument(found)


def _a(what: str) -> str:
    return f"an {what}" if what[0] in "aeiou" else f"a {what}"


# Who waits for the answers, in the errors' words.
SESSION = "the session waits for"
RESENT = "the conversation before them ends with"


def _match(
    waits: str,
    field_name: str,
    key: str,
    given: list[str],
    wanted: list[str],
    what: str,
    complete: bool = True,
) -> list[FieldViolation]:
    out: list[FieldViolation] = []
    seen: set[str] = set()
    expected = ", ".join(wanted) or "none"
    for n, value in enumerate(given):
        if value not in wanted:
            out.append(
                FieldViolation(
                    f"{field_name}[{n}].{key}",
                    f"not {_a(what)} {waits} (it waits for: {expected})"
                    if waits == SESSION
                    else f"not {_a(what)} {waits} ({what}s: {expected})",
                )
            )
        elif value in seen:
            out.append(
                FieldViolation(f"{field_name}[{n}].{key}", f"answers {what} {value!r} twice")
            )
        seen.add(value)
    missing = [w for w in wanted if w not in seen]
    if missing and complete:
        out.append(FieldViolation(field_name, f"no answer for {what} {', '.join(missing)}"))
    return out


def unanswered(pause: message_pb2.Pause, why: str) -> Answers:
    """The server's answers to a pause the client did not answer: an error
    result per call, "cancelled" per interrupt."""
    return Answers(
        [message_pb2.ToolResult(tool_call_id=c.id, error=why) for c in pause.tool_calls],
        [message_pb2.ResumeEntry(interrupt_id=i.id, status="cancelled") for i in pause.interrupts],
    )


def lead_messages(
    turn_id: str, answers: Answers, created: timestamp_pb2.Timestamp
) -> list[message_pb2.Message]:
    """The tool messages a turn's answers add to history, before its user
    message: the client's results (and the errors of unanswered calls)."""
    return [
        message_pb2.Message(
            role="tool",
            content=result.content,
            tool_call_id=result.tool_call_id,
            error=result.error,
            turn_id=turn_id,
            created_at=created,
        )
        for result in answers.tool_results
    ]


@dataclass(frozen=True)
class Names:
    """How a surface names a turn's request in its errors: the one table
    that renames the native fields (``tool_results[n].tool_call_id``,
    ``resume[n].interrupt_id``, ``message``) for every surface.

    ``results`` and ``resume`` name each answer where the caller sent it
    (``messages[4]``, ``input[2]``), in order; ``results_field`` and
    ``resume_field`` name them together (an answer left unnamed keeps its
    native name). ``keys`` renames the fields inside an answer by where it
    came from: the renames of the first prefix its name starts with
    (``{"input": {"tool_call_id": "call_id"}}``); an answer under no
    prefix keeps the native names."""

    results: Sequence[str] = ()
    resume: Sequence[str] = ()
    results_field: str = "tool_results"
    resume_field: str = "resume"
    message: str = "message"
    keys: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def field(self, native: str) -> str:
        """A native field of a TurnRequest in the caller's words."""
        head, dot, rest = native.partition(".")
        if head == "message":
            return self.message + dot + rest
        for collection, names, together in (
            ("tool_results", self.results, self.results_field),
            ("resume", self.resume, self.resume_field),
        ):
            if head == collection:
                return together + dot + rest
            index = head.removeprefix(f"{collection}[").removesuffix("]")
            if head.startswith(f"{collection}[") and index.isdigit():
                # An answer the caller named keeps the native index otherwise.
                where = names[int(index)] if int(index) < len(names) else head
                renames = next((k for p, k in self.keys.items() if where.startswith(p)), {})
                leaf, sep, deeper = rest.partition(".")
                inner = renames.get(leaf, leaf) + sep + deeper
                return f"{where}.{inner}" if inner else where
        return native

    def rename(self, error: InvalidArgument) -> InvalidArgument:
        """The error with each violation under the caller's name."""
        return InvalidArgument(
            [FieldViolation(self.field(v.field), v.description) for v in error.violations]
        )
