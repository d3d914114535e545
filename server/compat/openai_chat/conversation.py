"""The session a request continues or seeds, the turn it sends there, and
the turn's refusals in this API's words and names."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from turnmesh.runtime.errors import (
    AwaitingClient,
    InvalidArgument,
    NotFound,
    NotWaiting,
    TurnmeshError,
)
from turnmesh.server.compat._common import (
    Mesh,
    check_message,
    invalid,
)
from turnmesh.server.compat._files import decode
from turnmesh.server.compat.openai_chat.request import (
    ChatCompletionRequest,
    ChatMessage,
    client_tools,
    resume_entries,
    to_history,
)
from turnmesh.server.compat.openai_chat.turn import ClientCalls, Turn
from turnmesh.server.sessions import answers
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb


def _answer_span(messages: list[ChatMessage]) -> range:
    """Where the trailing tool messages are: the last ones, or those just
    before a last user message."""
    end = len(messages) - 1 if messages[-1].role == "user" else len(messages)
    start = end
    while start > 0 and messages[start - 1].role == "tool":
        start -= 1
    return range(start, end)


def _tool_results(messages: list[ChatMessage], span: range) -> list[message_pb2.ToolResult]:
    results = []
    for index in span:
        message = messages[index]
        if not message.tool_call_id:
            raise invalid(f"messages[{index}].tool_call_id", "required")
        content = message.text_only(f"messages[{index}]")
        results.append(message_pb2.ToolResult(tool_call_id=message.tool_call_id, content=content))
    return results


async def open_turn(
    mesh: Mesh,
    request: ChatCompletionRequest,
    session_header: str | None,
    on_disconnect: spb.DisconnectPolicy.ValueType,
) -> tuple[Turn, str]:
    """The session for this request, and the new user message ("" for a
    turn that only answers the session's pause)."""
    turn, message = await _open(mesh, request, session_header)
    turn.metadata = dict(request.metadata or {})
    turn.on_disconnect = on_disconnect
    return turn, message


async def _existing(mesh: Mesh, session_id: str | None) -> spb.Session | None:
    if not session_id:
        return None
    try:
        return await mesh.get_session(session_id)
    except (NotFound, InvalidArgument):
        return None  # an invalid id cannot exist either


async def _open(
    mesh: Mesh, request: ChatCompletionRequest, session_header: str | None
) -> tuple[Turn, str]:
    messages = request.messages
    last = len(messages) - 1
    user = messages[last] if messages[last].role == "user" else None
    # Only a request that answers a pause may end without the user's message.
    if user is None and messages[last].role != "tool" and not request.resume:
        raise invalid(
            f"messages[{last}].role",
            "the last message must be the user's, or tool messages answering the tool_calls"
            " of the assistant message before them",
        )
    message = user.text() if user is not None else ""
    if user is not None:
        check_message(message, f"messages[{last}].content")
    tools = client_tools(request)
    resume = resume_entries(request.resume or [])
    span = _answer_span(messages)
    session = await _existing(mesh, session_header)
    if session is not None and session_header:
        turn = Turn(session_header, throwaway=False)
        if user is not None:
            turn.files = await decode(user.files(f"messages[{last}]"))
            if not session.pause.tool_calls:
                # Tool messages before the user's answered an earlier pause
                # (the client resends the conversation): a plain message.
                span = range(0)
        results = _tool_results(messages, span)
    else:
        if request.resume:
            raise invalid(
                "resume",
                "answers the interrupts of a session that waits for them: send it with that"
                " session's X-Session-Id",
            )
        seed_end = _seed_end(messages, span)
        if seed_end is None:
            if user is None:
                raise invalid(
                    f"messages[{span.start}].role",
                    "a tool message must follow the assistant message whose tool_calls it answers",
                )
            span, seed_end = range(0), last
            before = messages[last - 1] if last else None
            if before is not None and before.role == "assistant" and before.tool_calls:
                # OpenAI's own rule; a session seeded so would wait for them.
                raise invalid(
                    f"messages[{last - 1}].tool_calls",
                    "each call needs a tool message answering it before the user's next message",
                )
        history = to_history(messages[:seed_end])
        results = _tool_results(messages, span)
        if results:
            _check_seeded(history[-1], results, span, last)
        # A new session: files anywhere in the conversation go with this
        # turn (the history it is seeded with holds text only).
        files = await decode(
            [
                file
                for index, m in enumerate(messages)
                if m.role == "user"
                for file in m.files(f"messages[{index}]")
            ]
        )
        session_id = await mesh.create_session(
            session_header or None, request.model, history, param="model"
        )
        turn = Turn(session_id, throwaway=not session_header)
        turn.made = True
        turn.seeded = len(history)
        turn.files = files
    turn.tools = tools
    turn.calls = ClientCalls({t.name for t in tools})
    turn.tool_results = results
    turn.results_at = span
    turn.resume = resume
    turn.last = last
    return turn, message


def _seed_end(messages: list[ChatMessage], span: range) -> int | None:
    """For a new session whose trailing tool messages answer the assistant
    message just before them: where its seeded history ends (after that
    message, so the session waits for its calls)."""
    if not span or span.start == 0:
        return None
    before = messages[span.start - 1]
    return span.start if before.role == "assistant" and before.tool_calls else None


def _check_seeded(
    calls: message_pb2.Message, results: list[message_pb2.ToolResult], span: range, last: int
) -> None:
    """The tool messages must answer the seeded calls exactly: checked before
    any session is made (a refused request leaves none behind)."""
    try:
        answers.check_resent(calls.tool_calls, answers.Answers(results))
    except InvalidArgument as exc:
        raise _names(span, last).rename(exc) from None


def _names(span: range, last: int) -> answers.Names:
    """The request's names for a TurnRequest's fields: a tool result is its
    tool message, the message is the last message's content."""
    return answers.Names(
        results=[f"messages[{index}]" for index in span],
        results_field="messages",
        message=f"messages[{last}].content",
    )


def _awaiting(turn: Turn, exc: AwaitingClient) -> AwaitingClient:
    """The mesh's 409 for a plain message to a waiting session, saying how
    this API answers it."""
    calls = exc.metadata.get("tool_call_ids", "")
    interrupts = exc.metadata.get("interrupt_ids", "")
    todo = []
    if calls:
        todo.append(f'end messages with a role "tool" message for each of tool calls {calls}')
    if interrupts:
        todo.append(
            f"answer interrupts {interrupts} with the body's resume entries"
            ' ([{"interrupt_id", "status": "resolved" or "cancelled", "payload"}])'
        )
    since = exc.metadata.get("turn_id") or ""
    detail = f"session {turn.session_id!r} waits for the client: {' and '.join(todo)}"
    if since:  # a seeded pause has no turn to cancel
        detail += f"; or cancel its turn (POST /v1/sessions/{turn.session_id}/turns/{since}:cancel)"
    return AwaitingClient(detail, metadata={**exc.metadata, "param": f"messages[{turn.last}]"})


def _not_waiting(turn: Turn, exc: NotWaiting) -> NotWaiting:
    """The mesh's 409 for answers to a session that waits for none, naming
    the request's answers."""
    param = f"messages[{turn.results_at.start}]" if turn.tool_results else "resume"
    return NotWaiting(
        f"{exc.detail}; a request that ends with tool messages (or has resume) answers a"
        " session's pause: end it with a user message instead",
        metadata={**exc.metadata, "param": param},
    )


async def events(mesh: Mesh, turn: Turn, message: str) -> AsyncIterator[event_pb2.Event]:
    """The turn's events, each folded into ``turn.answer`` first."""
    started = ended = False
    refusal: TurnmeshError | None = None
    try:
        async with mesh.turn(
            turn.session_id,
            message,
            files=turn.files,
            metadata=turn.metadata,
            on_disconnect=turn.on_disconnect,
            tools=turn.tools,
            tool_results=turn.tool_results,
            resume=turn.resume,
        ) as stream:
            async for event in stream:
                if not turn.id:
                    turn.id = f"chatcmpl-{event.run_id}"
                turn.answer.feed(event)
                started = True
                ended = event.type in (event_pb2.RUN_FINISHED, event_pb2.RUN_ERROR)
                if event.type == event_pb2.RUN_FINISHED:
                    turn.outcome.CopyFrom(event.outcome)
                yield event
    except TurnmeshError as exc:
        refusal = None if started else exc
        if isinstance(exc, InvalidArgument):
            raise _names(turn.results_at, turn.last).rename(exc) from None
        if isinstance(exc, AwaitingClient):
            raise _awaiting(turn, exc) from None
        if isinstance(exc, NotWaiting):
            raise _not_waiting(turn, exc) from None
        raise
    finally:
        # A client that left asking to continue may come back for the turn
        # (SubscribeTurn, GetHistory): its session stays until the TTL. So
        # does one that waits on an interrupt, which only it can answer (a
        # pause for tool calls is seeded again from the next conversation).
        left_to_run = started and not ended and turn.on_disconnect == spb.DISCONNECT_POLICY_CONTINUE
        waits = bool(turn.outcome.interrupts)
        if turn.throwaway and not left_to_run and not waits:
            with contextlib.suppress(TurnmeshError):  # it would expire anyway
                await mesh.delete_session(turn.session_id)
        elif turn.made and refusal is not None:
            await mesh.drop_session(turn.session_id, refusal, turn.seeded)
