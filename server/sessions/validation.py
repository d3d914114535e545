"""Request validation for the public API: every rule, every bad field named.

A request that fails validation raises ``InvalidArgument`` with one
``google.rpc.BadRequest`` field violation per problem, before anything changes.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

from turnmesh.files import (
    ALLOWED_MIME_TYPES,
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_TOTAL_FILE_BYTES,
    sniff_problem,
)
from turnmesh.files.extract import MAX_TEXT_CHARS as MAX_FILE_TEXT_CHARS
from turnmesh.runtime.errors import FieldViolation, InvalidArgument
from turnmesh.runtime.ids import SESSION_ID_PATTERN
from turnmesh.server.sessions import answers
from turnmesh.v1 import message_pb2
from turnmesh.v1 import session_service_pb2 as spb

MAX_MESSAGE_CHARS = 10_000
MAX_FILENAME_CHARS = 255
MAX_IDEMPOTENCY_KEY_CHARS = 256
# Characters no identifier of a client's carries (C0 controls and DEL).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAX_METADATA_BYTES = 64 * 1024
MAX_SEED_MESSAGES = 10_000
MAX_SEED_MESSAGE_CHARS = 100_000
SEED_ROLES = frozenset({"user", "assistant", "system", "tool"})
MAX_SEED_TOOL_CALLS = 128
# As many and as big as an agent's own (worker/pause.py).
MAX_SEED_INTERRUPTS = 16
MAX_SEED_INTERRUPT_BYTES = 64 * 1024
MAX_SEED_BYTES = 64 * 2**20
# The caller's tools for one turn.
MAX_TOOLS = 128


def _raise_if(violations: list[FieldViolation]) -> None:
    if violations:
        raise InvalidArgument(violations)


def session_id_violations(session_id: str, field: str = "session_id") -> list[FieldViolation]:
    if not session_id:
        return [FieldViolation(field, "required")]
    if not SESSION_ID_PATTERN.fullmatch(session_id):
        return [FieldViolation(field, "must be 1-128 characters of A-Z a-z 0-9 . _ : -")]
    return []


def validate_session_id(session_id: str) -> None:
    _raise_if(session_id_violations(session_id))


def _turn_id_violations(turn_id: str) -> list[FieldViolation]:
    if not turn_id:
        return [FieldViolation("turn_id", "required")]
    if len(turn_id) > 128:
        return [FieldViolation("turn_id", "must be at most 128 characters")]
    return []


def validate_turn_ref(session_id: str, turn_id: str) -> None:
    _raise_if(session_id_violations(session_id) + _turn_id_violations(turn_id))


def validate_fork_session(request: spb.ForkSessionRequest) -> None:
    violations = session_id_violations(request.session_id)
    if request.at_turn_id:
        violations += [
            FieldViolation("at_turn_id", v.description)
            for v in _turn_id_violations(request.at_turn_id)
        ]
    if request.new_session_id:
        violations += session_id_violations(request.new_session_id, "new_session_id")
    if request.metadata.ByteSize() > MAX_METADATA_BYTES:
        violations.append(FieldViolation("metadata", f"must be at most {MAX_METADATA_BYTES} bytes"))
    _raise_if(violations)


def validate_create_session(request: spb.CreateSessionRequest) -> None:
    violations: list[FieldViolation] = []
    if request.session_id:
        violations += session_id_violations(request.session_id)
    if len(request.agent_name) > 128:
        violations.append(FieldViolation("agent_name", "must be at most 128 characters"))
    if request.metadata.ByteSize() > MAX_METADATA_BYTES:
        violations.append(FieldViolation("metadata", f"must be at most {MAX_METADATA_BYTES} bytes"))
    if len(request.messages) > MAX_SEED_MESSAGES:
        violations.append(FieldViolation("messages", f"at most {MAX_SEED_MESSAGES} messages"))
    called: set[str] = set()
    for index, message in enumerate(request.messages[:MAX_SEED_MESSAGES]):
        if message.role == "assistant":
            called.update(call.id for call in message.tool_calls)
        elif message.role == "tool" and message.tool_call_id not in called:
            # A chat model refuses a reply to no call; on REST the calls are
            # `tool_calls` (a `toolCalls` there is dropped unread).
            violations.append(
                FieldViolation(
                    f"messages[{index}].tool_call_id",
                    "answers no call of an earlier assistant message's tool_calls",
                )
            )
        if message.role not in SEED_ROLES:
            violations.append(
                FieldViolation(
                    f"messages[{index}].role", "must be one of assistant, system, tool, user"
                )
            )
        if len(message.content) > MAX_SEED_MESSAGE_CHARS:
            violations.append(
                FieldViolation(
                    f"messages[{index}].content",
                    f"must be at most {MAX_SEED_MESSAGE_CHARS} characters",
                )
            )
        violations += _seed_parts_violations(f"messages[{index}]", message)
    # A message at a time (each a call of its own; the whole is one long one).
    if sum(m.ByteSize() for m in request.messages[: MAX_SEED_MESSAGES + 1]) > MAX_SEED_BYTES:
        violations.append(
            FieldViolation("messages", f"at most {MAX_SEED_BYTES // 2**20} MiB in all")
        )
    _raise_if(violations)


def _seed_parts_violations(at: str, message: message_pb2.Message) -> list[FieldViolation]:
    """A seeded message holds no more than a turn could have put there: file
    texts as the worker cuts them, a turn's file count, bounded tool calls
    and metadata (every later turn carries the history to its worker)."""
    violations = []
    if len(message.files) > MAX_FILES:
        violations.append(FieldViolation(f"{at}.files", f"at most {MAX_FILES} files"))
    for n, ref in enumerate(message.files[:MAX_FILES]):
        if len(ref.text) > MAX_FILE_TEXT_CHARS:
            violations.append(
                FieldViolation(
                    f"{at}.files[{n}].text", f"must be at most {MAX_FILE_TEXT_CHARS} characters"
                )
            )
        if len(ref.filename) > MAX_FILENAME_CHARS or len(ref.error) > MAX_MESSAGE_CHARS:
            violations.append(FieldViolation(f"{at}.files[{n}]", "filename or error too long"))
    if len(message.tool_calls) > MAX_SEED_TOOL_CALLS:
        violations.append(
            FieldViolation(f"{at}.tool_calls", f"at most {MAX_SEED_TOOL_CALLS} tool calls")
        )
    if any(
        len(call.function.arguments) > MAX_SEED_MESSAGE_CHARS
        for call in message.tool_calls[:MAX_SEED_TOOL_CALLS]
    ):
        violations.append(
            FieldViolation(
                f"{at}.tool_calls",
                f"arguments must be at most {MAX_SEED_MESSAGE_CHARS} characters",
            )
        )
    violations += _seed_call_id_violations(at, message)
    violations += _seed_interrupt_violations(at, message)
    if message.metadata.ByteSize() > MAX_METADATA_BYTES:
        violations.append(
            FieldViolation(f"{at}.metadata", f"must be at most {MAX_METADATA_BYTES} bytes")
        )
    return violations


def _seed_call_id_violations(at: str, message: message_pb2.Message) -> list[FieldViolation]:
    """Each call has an id a tool message (or a pause's answer) can name:
    one that is missing, repeated or too long would leave a session waiting
    for an answer nobody can give."""
    out: list[FieldViolation] = []
    seen: set[str] = set()
    for n, call in enumerate(message.tool_calls[:MAX_SEED_TOOL_CALLS]):
        where = f"{at}.tool_calls[{n}].id"
        if not call.id:
            out.append(FieldViolation(where, "required"))
        elif len(call.id) > answers.MAX_ID_CHARS:
            out.append(FieldViolation(where, f"must be at most {answers.MAX_ID_CHARS} characters"))
        elif call.id in seen:
            out.append(FieldViolation(where, f"repeats call id {call.id!r}"))
        seen.add(call.id)
    return out


def _seed_interrupt_violations(at: str, message: message_pb2.Message) -> list[FieldViolation]:
    """What a paused turn asked, as a turn could have recorded it."""
    if not message.interrupts:
        return []
    if message.role != "assistant":
        return [FieldViolation(f"{at}.interrupts", "only an assistant message asks")]
    if len(message.interrupts) > MAX_SEED_INTERRUPTS:
        return [FieldViolation(f"{at}.interrupts", f"at most {MAX_SEED_INTERRUPTS} interrupts")]
    out: list[FieldViolation] = []
    calls = {call.id for call in message.tool_calls}
    seen: set[str] = set()
    for n, interrupt in enumerate(message.interrupts):
        where = f"{at}.interrupts[{n}]"
        if not interrupt.id:
            out.append(FieldViolation(f"{where}.id", "required"))
        elif len(interrupt.id) > answers.MAX_ID_CHARS:
            out.append(
                FieldViolation(f"{where}.id", f"must be at most {answers.MAX_ID_CHARS} characters")
            )
        elif interrupt.id in seen:
            out.append(FieldViolation(f"{where}.id", f"repeats interrupt id {interrupt.id!r}"))
        seen.add(interrupt.id)
        if interrupt.tool_call_id and interrupt.tool_call_id not in calls:
            out.append(FieldViolation(f"{where}.tool_call_id", "not a call of this message"))
        if len(interrupt.reason) > 64 or len(interrupt.message) > MAX_MESSAGE_CHARS:
            out.append(FieldViolation(where, "reason or message too long"))
        if interrupt.ByteSize() > MAX_SEED_INTERRUPT_BYTES:
            out.append(FieldViolation(where, f"must be at most {MAX_SEED_INTERRUPT_BYTES} bytes"))
    return out


def validate_subscribe(request: spb.SubscribeTurnRequest) -> None:
    violations = session_id_violations(request.session_id)
    violations += _turn_id_violations(request.turn_id)
    if request.after_seq < 0:
        violations.append(FieldViolation("after_seq", "must be 0 or more"))
    _raise_if(violations)


def message_violations(message: str, field: str = "message") -> list[FieldViolation]:
    """A turn's user message: what the other APIs check first, under their
    own name for the field."""
    if not message:
        return [FieldViolation(field, "required")]
    if not message.strip():
        return [FieldViolation(field, "must not be blank")]
    if len(message) > MAX_MESSAGE_CHARS:
        return [FieldViolation(field, f"must be at most {MAX_MESSAGE_CHARS} characters")]
    return []


def validate_turn(request: spb.TurnRequest) -> None:
    violations = session_id_violations(request.session_id)
    given = answers.Answers(request.tool_results, request.resume)
    # A turn that answers a pause needs no message of its own.
    if request.message or not given:
        violations += message_violations(request.message)
    violations += answers.violations(given)
    violations += tool_violations(request.tools)
    violations += _file_violations(request)
    if request.policy not in spb.TurnPolicy.values():
        violations.append(FieldViolation("policy", "unknown policy"))
    if request.on_disconnect not in spb.DisconnectPolicy.values():
        violations.append(FieldViolation("on_disconnect", "unknown disconnect policy"))
    if len(request.idempotency_key) > MAX_IDEMPOTENCY_KEY_CHARS:
        violations.append(
            FieldViolation(
                "idempotency_key", f"must be at most {MAX_IDEMPOTENCY_KEY_CHARS} characters"
            )
        )
    elif _CONTROL.search(request.idempotency_key):
        # A key is an identifier; NUL is one no PostgreSQL text column holds.
        violations.append(FieldViolation("idempotency_key", "must not contain control characters"))
    if request.metadata.ByteSize() > MAX_METADATA_BYTES:
        violations.append(FieldViolation("metadata", f"must be at most {MAX_METADATA_BYTES} bytes"))
    _raise_if(violations)


async def validate_create_session_async(request: spb.CreateSessionRequest) -> None:
    """``validate_create_session``; with a seeded history, in a thread: up to
    64 MiB of it is read (and sized) a message at a time."""
    if request.messages:
        await asyncio.to_thread(validate_create_session, request)
    else:
        validate_create_session(request)


async def validate_turn_async(request: spb.TurnRequest) -> None:
    """``validate_turn``; with files, in a thread: reading a file's bytes
    copies them (tens of milliseconds for 50 MB), and there the event loop
    runs between one file's copy and the next."""
    if request.files:
        await asyncio.to_thread(validate_turn, request)
    else:
        validate_turn(request)


TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TOOL_DESCRIPTION_CHARS = 10_000
MAX_TOOLS_BYTES = 1 << 20


def tool_violations(
    tools: Sequence[message_pb2.ToolDefinition], field: str = "tools"
) -> list[FieldViolation]:
    """The caller's tools: named as OpenAI names functions, each once, in
    at most 1 MiB together."""
    out: list[FieldViolation] = []
    if len(tools) > MAX_TOOLS:
        return [FieldViolation(field, f"at most {MAX_TOOLS} tools")]
    names: set[str] = set()
    for n, tool in enumerate(tools):
        if not TOOL_NAME.fullmatch(tool.name):
            out.append(
                FieldViolation(f"{field}[{n}].name", "1-64 characters of A-Z, a-z, 0-9, _ and -")
            )
        elif tool.name in names:
            out.append(
                FieldViolation(f"{field}[{n}].name", f"tool {tool.name!r} is declared twice")
            )
        names.add(tool.name)
        if len(tool.description) > MAX_TOOL_DESCRIPTION_CHARS:
            out.append(
                FieldViolation(
                    f"{field}[{n}].description",
                    f"at most {MAX_TOOL_DESCRIPTION_CHARS} characters",
                )
            )
    if sum(t.ByteSize() for t in tools) > MAX_TOOLS_BYTES:
        out.append(FieldViolation(field, f"at most {MAX_TOOLS_BYTES // 2**20} MiB in all"))
    return out


def _file_violations(request: spb.TurnRequest) -> list[FieldViolation]:
    violations: list[FieldViolation] = []
    if len(request.files) > MAX_FILES:
        violations.append(FieldViolation("files", f"at most {MAX_FILES} files"))
    total = 0
    for index, file in enumerate(request.files):
        name = f" ({file.filename})" if file.filename else ""
        field = f"files[{index}]"
        content = file.content  # a copy on each read: read once
        size = len(content)
        total += size
        if not file.mime_type:
            violations.append(FieldViolation(f"{field}.mime_type", f"required{name}"))
        elif file.mime_type not in ALLOWED_MIME_TYPES:
            violations.append(
                FieldViolation(
                    f"{field}.mime_type", f"type {file.mime_type!r} is not allowed{name}"
                )
            )
        if size == 0:
            violations.append(FieldViolation(f"{field}.content", f"must not be empty{name}"))
        elif size > MAX_FILE_BYTES:
            violations.append(FieldViolation(f"{field}.content", f"must be at most 50 MB{name}"))
        elif file.mime_type in ALLOWED_MIME_TYPES:
            # The magic numbers must match the declared type.
            problem = sniff_problem(content, file.mime_type)
            if problem is not None:
                violations.append(FieldViolation(f"{field}.content", f"{problem}{name}"))
        if len(file.filename) > MAX_FILENAME_CHARS:
            violations.append(
                FieldViolation(
                    f"{field}.filename", f"must be at most {MAX_FILENAME_CHARS} characters"
                )
            )
    if total > MAX_TOTAL_FILE_BYTES:
        violations.append(FieldViolation("files", "must be at most 100 MB in all"))
    return violations
