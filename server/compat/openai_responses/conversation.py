"""The session a request continues, forks or starts, and the turn it
sends there (its user message, tools and answers)."""

from __future__ import annotations

from collections.abc import Sequence

from turnmesh.runtime.errors import (
    FieldViolation,
    InvalidArgument,
    ItemNotFound,
    NotFound,
    PreviousResponseNotFound,
)
from turnmesh.server.compat._common import Mesh, invalid
from turnmesh.server.compat._files import decode
from turnmesh.server.compat.openai_responses.approvals import Approvals, Asked, renamed
from turnmesh.server.compat.openai_responses.ids import (
    decoded,
    parse_approval_item_id,
    parse_response_id,
)
from turnmesh.server.compat.openai_responses.request import (
    ApprovalRequest,
    ApprovalResponse,
    FunctionCall,
    FunctionCallOutput,
    InputItem,
    InputMessage,
    ItemReference,
    ResponseRequest,
    TurnAnswers,
)
from turnmesh.server.compat.openai_responses.response import Response
from turnmesh.server.sessions import answers, pauses
from turnmesh.v1 import message_pb2

# The sessions one request's item references may read (each a history read).
MAX_REFERENCED_SESSIONS = 8
# And at most this much of their text (a seeded history may hold 64 MiB; a
# conversation's earlier answers are far less).
MAX_REFERENCED_CHARS = 8_000_000


async def open_response(mesh: Mesh, request: ResponseRequest) -> Response:
    """The session this request continues or starts, and the turn it sends
    there: its user message, tools and answers."""
    message = request.message()
    approvals = Approvals(mesh)
    answered = [
        i.approval_request_id for _, i in request.answer_items() if isinstance(i, ApprovalResponse)
    ]
    given = TurnAnswers(request, await approvals.interrupt_ids(answered))
    if request.previous_response_id:
        # Decoded first: a request refused for its files makes no fork.
        files = []
        if message is not None:
            where = request.field(len(request.items()) - 1)
            files = await decode(message.files(where))
        session_id, forked = await _continued(mesh, request.previous_response_id)
        response = Response(request, session_id)
        response.made = forked
        response.files = files
    else:
        resolved = await _resolved(mesh, request, approvals)
        history, origins = _history(request, resolved[: request.answers_at])
        _check_answers(request, resolved[: request.answers_at], history, given)
        # A new session: files anywhere in the input go with this turn (the
        # history it is seeded with holds text only).
        files = await decode(
            [
                file
                for index, item in enumerate(resolved)
                if isinstance(item, InputMessage) and item.role == "user"
                for file in item.files(request.field(index))
            ]
        )
        try:
            session_id = await mesh.create_session(None, request.model, history, param="model")
        except InvalidArgument as exc:
            raise _as_input(exc, origins) from None
        response = Response(request, session_id)
        response.made = True
        response.seeded = len(history)
        response.files = files
    response.message = message.text() if message is not None else ""
    response.answers = given
    return response


Origin = tuple[str, str]  # (the input item's name, what a message's content is called there)


# An input item once item references and approval requests are resolved.
Resolved = InputItem | Asked


def _history(
    request: ResponseRequest, items: Sequence[Resolved]
) -> tuple[list[message_pb2.Message], list[Origin]]:
    """The history a new session is seeded with, and where each message came
    from. Function calls become the assistant's ``tool_calls`` (the calls
    after an assistant message, or after each other, are one message's, as
    one response's output), their outputs ``tool`` messages; an approval
    request (resolved: ``approvals``) the call it gates and its interrupt,
    as the turn that asked it left them; other approval items add nothing
    (what the tool said after them is in the messages)."""
    history: list[message_pb2.Message] = []
    origins: list[Origin] = []
    if request.instructions:
        history.append(message_pb2.Message(role="system", content=request.instructions))
        origins.append(("instructions", ""))
    joins = False  # whether a function call joins the message before it
    for index, item in enumerate(items):
        where = request.field(index)
        if isinstance(item, InputMessage):
            role = "system" if item.role == "developer" else item.role
            history.append(message_pb2.Message(role=role, content=item.text()))
            origins.append((where, ".content"))
            joins = item.role == "assistant"
        elif isinstance(item, FunctionCall):
            if not joins:
                history.append(message_pb2.Message(role="assistant"))
                origins.append((where, ".content"))
            call = history[-1].tool_calls.add(id=item.call_id, type="function")
            call.function.name = item.name
            call.function.arguments = item.arguments
            joins = True
        elif isinstance(item, Asked):
            if not joins:
                history.append(message_pb2.Message(role="assistant"))
                origins.append((where, ".content"))
            history[-1].tool_calls.add().CopyFrom(item.call)
            history[-1].interrupts.add().CopyFrom(item.interrupt)
            joins = True
        elif isinstance(item, FunctionCallOutput):
            content = item.text(where)
            history.append(
                message_pb2.Message(role="tool", tool_call_id=item.call_id, content=content)
            )
            origins.append((where, ".output"))
            joins = False
        else:
            joins = False
    return history, origins


def _check_answers(
    request: ResponseRequest,
    items: Sequence[Resolved],
    history: list[message_pb2.Message],
    given: TurnAnswers,
) -> None:
    """A request with no previous response answers what its own input ends
    with, exactly: the function calls (``function_call_output``) and the
    approval requests (``mcp_approval_response``) the session seeded with it
    waits for (checked before any session is made)."""
    pause = pauses.seeded(history, 0) if history else None
    calls = pause.tool_calls if pause is not None else []
    asked = pause.interrupts if pause is not None else []
    resent = answers.Answers(given.tool_results, given.resume)
    try:
        answers.check_resent(calls, resent, asked)
    except InvalidArgument as exc:
        shown = {i.interrupt.id: i.item_id for i in items if isinstance(i, Asked)}
        raise renamed(given.names().rename(exc), shown) from None


async def _continued(mesh: Mesh, previous: str) -> tuple[str, bool]:
    """The session a turn after ``previous`` runs in: the response's own,
    or, if later turns followed it there, a fork at it (a branch: the
    conversation goes on from that response, and the later ones stay as
    they were); and whether it is a new fork."""
    session_id, turn_id = parse_response_id(previous, "previous_response_id")
    try:
        session = await mesh.get_session(session_id)
        history = await mesh.history(session_id)
    except (NotFound, InvalidArgument):
        raise PreviousResponseNotFound(
            f"previous response {previous!r} not found",
            metadata={"param": "previous_response_id"},
        ) from None
    last = max((i for i, m in enumerate(history) if m.turn_id == turn_id), default=None)
    if last is None:
        # A response that saved nothing (still running: this turn queues
        # behind it; cancelled, failed): the conversation goes on as it is.
        return session_id, False
    if last == len(history) - 1 and not session.turn_running:
        return session_id, False  # the newest response: continue it in place
    # Later turns followed it, or one is running now (another continuation
    # of the same response, racing this one): a branch.
    try:
        return await mesh.fork_session(session_id, turn_id), True
    except InvalidArgument as exc:
        raise invalid(
            "previous_response_id",
            f"the conversation up to that response cannot start a branch: {exc.detail}",
        ) from None


def _as_input(exc: InvalidArgument, origins: list[Origin]) -> InvalidArgument:
    """A seeded history's violations (``messages[k]...``) under the input
    item they came from (``input[j]...``; a tool message's content is its
    item's ``output``)."""
    renamed = []
    for violation in exc.violations:
        field = violation.field
        if field.startswith("messages["):
            index, _, rest = field.removeprefix("messages[").partition("]")
            if index.isascii() and index.isdigit() and int(index) < len(origins):
                where, content = origins[int(index)]
                if rest.startswith(".content") and content:
                    rest = content + rest.removeprefix(".content")
                field = where if where == "instructions" else where + rest
        elif field == "messages":
            field = "input"
        renamed.append(FieldViolation(field, violation.description))
    return InvalidArgument(renamed)


def _answers(history: list[message_pb2.Message]) -> dict[str, str]:
    """Each turn's output text: its assistant messages' content in order
    (the text before and after its tool calls), as its output item showed."""
    parts: dict[str, list[str]] = {}
    for message in history:
        if message.role == "assistant" and message.turn_id:
            parts.setdefault(message.turn_id, []).append(message.content)
    return {turn: "".join(texts) for turn, texts in parts.items()}


async def _resolved(mesh: Mesh, request: ResponseRequest, approvals: Approvals) -> list[Resolved]:
    """The input with each item reference replaced by the assistant message
    it names, and each approval request (resent, or an item reference to
    one) by the one its turn asked (read from its session's history: the
    caller's own only)."""
    # Per conversation read: each turn's assistant text, in order.
    answers: dict[str, dict[str, str]] = {}
    resolved_chars = 0
    items: list[Resolved] = []
    for index, item in enumerate(request.items()):
        where = f"{request.field(index)}.id"
        if isinstance(item, ApprovalRequest) and item.id and parse_approval_item_id(item.id):
            items.append(await approvals.find(item.id, where))
            continue
        if isinstance(item, ItemReference) and item.id.startswith("mcpr_"):
            items.append(await approvals.find(item.id, where))
            continue
        if not isinstance(item, ItemReference):
            items.append(item)
            continue
        not_found = ItemNotFound(f"item {item.id[:128]!r} not found", metadata={"param": where})
        if not item.id.startswith("msg_"):
            raise not_found
        try:
            session_id, turn_id = decoded(item.id.removeprefix("msg_"))
        except ValueError:
            raise not_found from None
        if session_id not in answers:
            if len(answers) == MAX_REFERENCED_SESSIONS:
                raise invalid(
                    where, f"items of at most {MAX_REFERENCED_SESSIONS} conversations per request"
                )
            try:
                answers[session_id] = _answers(await mesh.history(session_id))
            except (NotFound, InvalidArgument):
                raise not_found from None
        said = answers[session_id].get(turn_id)
        if said is None:
            raise not_found
        # Bounded: a small body must not reference its way to a huge history.
        resolved_chars += len(said)
        if resolved_chars > MAX_REFERENCED_CHARS:
            raise invalid(
                where, f"the items referenced hold more than {MAX_REFERENCED_CHARS:,} characters"
            )
        items.append(InputMessage(role="assistant", content=said))
    return items
