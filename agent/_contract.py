"""The types an agent sees: its request, its response, and the emitter it streams to."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "MAX_CHECKPOINT_BYTES",
    "AgentError",
    "AgentFile",
    "AgentRequest",
    "AgentResponse",
    "AgentRunnable",
    "ClientTool",
    "EventEmitter",
    "Interrupt",
    "Resume",
    "TokenUsage",
    "ToolResult",
]

# How several queued user messages become one turn's text (COLLECT policy).
MESSAGE_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class AgentFile:
    """A file attached to the turn.

    ``text`` is what the worker read from it: the text of a text file or a
    PDF, an office document as Markdown, an image's OCR. It is None when the
    file could not be read, and ``error`` says why. ``truncated`` marks text
    that stops at the limit (200,000 characters). ``content`` holds the raw
    bytes for agents that want them.
    """

    filename: str
    mime_type: str
    content: bytes
    text: str | None = None
    sha256: str = ""
    error: str | None = None
    truncated: bool = False


@dataclass(frozen=True)
class TokenUsage:
    """Tokens the agent consumed and produced on one turn."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class ClientTool:
    """A tool the caller offers for this turn; the client runs it.

    An agent that calls it (``emitter.emit_tool_call(tool.name, args)``) and
    emits no result for the call ends the turn waiting for the client: the
    caller runs the tool and answers with the result, which the next turn
    carries in ``AgentRequest.tool_results``.
    """

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)  # JSON Schema


@dataclass(frozen=True)
class ToolResult:
    """The outcome of a call the turn before left waiting: the client's
    result, or an error (``error`` set) when the call failed, was never
    answered (its pause expired or was cancelled) or was denied."""

    tool_call_id: str
    content: str = ""
    error: str | None = None
    name: str = ""  # the tool's name


@dataclass(frozen=True)
class Interrupt:
    """A request for the client's input, returned in
    ``AgentResponse.interrupts``: the turn ends waiting for the answer, which
    the next turn carries in ``AgentRequest.resume``.

    An approval names the call it gates (``tool_call_id``: a call emitted on
    this turn with no result yet); a question may give a JSON Schema for its
    answer. ``id`` is minted when empty.
    """

    # "tool_approval", "question", or your own word; empty: "tool_approval" when
    # it gates a call (tool_call_id), else "question".
    reason: str = ""
    message: str = ""
    tool_call_id: str | None = None
    response_schema: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    id: str = ""


@dataclass(frozen=True)
class Resume:
    """The client's answer to one of the interrupts the turn before asked:
    ``status`` "resolved" with its ``payload``, or "cancelled" (abandoned,
    or unanswered before the pause expired). ``tool_call`` is the call an
    approval gates, as in history: ``{"id", "type", "function": {"name",
    "arguments"}}``."""

    interrupt: Interrupt
    status: str
    payload: Any = None
    tool_call: dict[str, Any] | None = None

    @property
    def approved(self) -> bool:
        """An approval granted: resolved with ``true`` or ``{"approved": true}``."""
        if self.status != "resolved":
            return False
        if isinstance(self.payload, dict):
            return self.payload.get("approved") is True
        return self.payload is True


@dataclass(frozen=True)
class AgentRequest:
    """One turn of a session, as the agent sees it.

    ``message`` is the new user text; when the turn coalesces several queued
    messages it is ``messages`` joined with a blank line. ``history`` holds the
    session's prior messages in the OpenAI chat shape: ``{"role", "content"}``
    plus ``"tool_calls"`` on assistant messages that call tools and
    ``"tool_call_id"`` on tool messages; a turn's final assistant message has
    ``"metadata"``: what its agent returned in ``AgentResponse.metadata``
    (notes an agent keeps for its next turns, as ``kind: a2a`` does).

    ``session_id`` is unique in the whole mesh: ``PRINCIPAL/ID`` when the
    session's principal is named (two tenants may both call a session
    ``my-thread``), the bare id for the anonymous principal. Key any state
    an agent keeps per session by it. ``principal`` names who owns it.

    ``tools`` are the caller's own tools for this turn (see ``ClientTool``).
    A turn that answers the one before's pause carries ``tool_results`` and
    ``resume`` and may have no user message (``messages`` empty, ``message``
    ""); they are not in ``history``, which ends with the paused turn.
    ``checkpoint`` is what the agent saved when that turn paused
    (``AgentResponse.checkpoint``), b"" otherwise.
    """

    message: str
    messages: list[str]
    session_id: str
    turn_id: str
    history: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    files: list[AgentFile] = field(default_factory=list)
    principal: str = "anonymous"
    tools: list[ClientTool] = field(default_factory=list)
    tool_results: list[ToolResult] = field(default_factory=list)
    resume: list[Resume] = field(default_factory=list)
    checkpoint: bytes = b""

    def __post_init__(self) -> None:
        if not self.messages and not self.tool_results and not self.resume:
            raise ValueError(
                "an AgentRequest needs at least one user message, tool result or resume entry"
            )

    @classmethod
    def from_messages(
        cls,
        messages: Sequence[str],
        *,
        session_id: str,
        turn_id: str,
        history: list[dict[str, Any]] | None = None,
        metadata: dict[str, Any] | None = None,
        files: list[AgentFile] | None = None,
        principal: str = "anonymous",
        tools: list[ClientTool] | None = None,
        tool_results: list[ToolResult] | None = None,
        resume: list[Resume] | None = None,
        checkpoint: bytes = b"",
    ) -> AgentRequest:
        """Build a request whose ``message`` is ``messages`` coalesced."""
        return cls(
            message=MESSAGE_SEPARATOR.join(messages),
            messages=list(messages),
            session_id=session_id,
            turn_id=turn_id,
            history=history if history is not None else [],
            metadata=metadata if metadata is not None else {},
            files=files if files is not None else [],
            principal=principal,
            tools=tools if tools is not None else [],
            tool_results=tool_results if tool_results is not None else [],
            resume=resume if resume is not None else [],
            checkpoint=checkpoint,
        )


# The largest checkpoint an agent may leave with a pause.
MAX_CHECKPOINT_BYTES = 16 * 1024 * 1024


@dataclass
class AgentResponse:
    """What a turn produced: the final text, metadata, and token usage.

    If the agent streamed no text after its last tool result, the worker sends
    ``text`` as the turn's answer; otherwise the streamed text is the answer.

    ``interrupts`` end the turn waiting for the client's answers (see
    ``Interrupt``), as do calls of the caller's tools left without a result.
    ``checkpoint``: opaque bytes the agent needs to resume such a turn (at
    most ``MAX_CHECKPOINT_BYTES``), kept durably with the pause in the session
    store and given back in the answering turn's ``AgentRequest.checkpoint``,
    on whichever worker runs it. Ignored when the turn does not pause.
    """

    text: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    usage: TokenUsage | None = None
    interrupts: list[Interrupt] = field(default_factory=list)
    checkpoint: bytes = b""


class AgentError(Exception):
    """Raise from ``run`` to end the turn with a ``RUN_ERROR`` that says what
    went wrong in words fit for the caller (never a secret or a traceback).

    Any other exception ends the turn with a generic "agent error".
    """

    def __init__(
        self, title: str, detail: str = "", *, code: str = "agent_error", status: int = 502
    ) -> None:
        super().__init__(title)
        self.title = title
        self.detail = detail
        self.code = code
        self.status = status


class EventEmitter(Protocol):
    """Streams what the agent does while it runs, in the order it happens."""

    async def emit_delta(self, text: str) -> None:
        """Send a piece of the assistant's answer; empty text is ignored."""
        ...

    async def emit_tool_call(
        self,
        name: str,
        arguments: Mapping[str, Any] | str,
        *,
        call_id: str | None = None,
    ) -> str:
        """Announce a tool call (arguments as a mapping or JSON text); returns its id."""
        ...

    async def emit_tool_result(self, call_id: str, content: str) -> None:
        """Report the output of the tool call ``call_id``."""
        ...


@runtime_checkable
class AgentRunnable(Protocol):
    """An agent: any object with this ``run`` method.

    ``run`` executes one turn. Cancellation of the turn arrives as
    ``asyncio.CancelledError`` inside ``run``; let it propagate after cleaning up.

    Optional hooks, called when present (not part of the protocol check):

    - ``async def close_session(self, session_id: str) -> None``: the session ended.
    - ``async def close(self) -> None``: the worker is shutting down.
    """

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse: ...
