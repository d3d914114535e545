"""What both clients share: the options of a turn, and its result."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, TypedDict

from google.protobuf import json_format

from turnmesh.client.errors import TurnFailedError
from turnmesh.runtime.events import Answer
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb

# How a turn joins a session that has one running (see the README's "Turn
# policies"): by name, or the proto enum's value.
PolicyName: TypeAlias = Literal["reject", "enqueue", "collect", "interrupt"]
Policy: TypeAlias = PolicyName | spb.TurnPolicy.ValueType

POLICIES: dict[str, spb.TurnPolicy.ValueType] = {
    "reject": spb.TURN_POLICY_REJECT,
    "enqueue": spb.TURN_POLICY_ENQUEUE,
    "collect": spb.TURN_POLICY_COLLECT,
    "interrupt": spb.TURN_POLICY_INTERRUPT,
}


class TurnOptions(TypedDict, total=False):
    """How a turn runs: the keyword options of ``stream_turn`` and ``send``."""

    # How the turn joins a session that has one running (default "collect").
    policy: Policy
    # Leaving the stream cancels the turn (default: the turn goes on).
    cancel_on_disconnect: bool
    # Attachments the agent can read (text, PDF, office files, images).
    files: Sequence[message_pb2.File]
    # Free-form, stored with the user message and given to the agent.
    metadata: Mapping[str, Any]
    # A retry with the same key follows the original turn instead of running it again.
    idempotency_key: str
    # The caller's own tools for this turn; a call of one ends the turn
    # waiting for its result (``TurnResult.outcome``; build them with ``tool``).
    tools: Sequence[message_pb2.ToolDefinition]
    # Answers to the session's pause: one result per call it waits for, one
    # resume entry per interrupt (the message may then be ""); build them with
    # ``tool_result``, ``approve`` and ``resume``.
    tool_results: Sequence[message_pb2.ToolResult]
    resume: Sequence[message_pb2.ResumeEntry]
    # Where the server POSTs a signed notice when the turn ends (a URL its
    # --webhook-allow admits).
    webhook_url: str


@dataclass
class TurnResult:
    """A finished turn: its id, the final text, and every event it streamed."""

    turn_id: str
    text: str
    events: list[event_pb2.Event] = field(default_factory=list)
    # Token usage of the whole turn (every model call the agent made).
    usage: event_pb2.TokenUsage = field(default_factory=event_pb2.TokenUsage)

    @property
    def tool_calls(self) -> list[event_pb2.Event]:
        return [e for e in self.events if e.type == event_pb2.TOOL_CALL_START]

    @property
    def outcome(self) -> event_pb2.RunOutcome | None:
        """Set when the turn ended waiting for the client: the calls of your
        tools to run (``pending_tool_call_ids``) or the interrupts to answer."""
        for event in reversed(self.events):
            if event.type == event_pb2.RUN_FINISHED:
                return event.outcome if event.HasField("outcome") else None
        return None


def build_turn_request(session_id: str, message: str, options: TurnOptions) -> spb.TurnRequest:
    policy = options.get("policy", "collect")
    metadata = options.get("metadata")
    request = spb.TurnRequest(
        session_id=session_id,
        message=message,
        policy=POLICIES[policy] if isinstance(policy, str) else policy,
        on_disconnect=(
            spb.DISCONNECT_POLICY_CANCEL
            if options.get("cancel_on_disconnect")
            else spb.DISCONNECT_POLICY_CONTINUE
        ),
        files=options.get("files") or (),
        idempotency_key=options.get("idempotency_key") or "",
        tools=options.get("tools") or (),
        tool_results=options.get("tool_results") or (),
        resume=options.get("resume") or (),
        webhook_url=options.get("webhook_url") or "",
    )
    if metadata:
        json_format.ParseDict(dict(metadata), request.metadata)
    return request


def build_create_request(
    session_id: str | None,
    agent: str | None,
    metadata: Mapping[str, Any] | None,
    messages: Sequence[message_pb2.Message],
) -> spb.CreateSessionRequest:
    request = spb.CreateSessionRequest(
        session_id=session_id or "", agent_name=agent or "", messages=messages
    )
    if metadata:
        json_format.ParseDict(dict(metadata), request.metadata)
    return request


def build_fork_request(
    session_id: str,
    at_turn_id: str,
    new_session_id: str | None,
    metadata: Mapping[str, Any] | None,
) -> spb.ForkSessionRequest:
    request = spb.ForkSessionRequest(
        session_id=session_id, at_turn_id=at_turn_id, new_session_id=new_session_id or ""
    )
    if metadata is not None:  # {} sets empty metadata; None copies the source's
        request.metadata.SetInParent()
        json_format.ParseDict(dict(metadata), request.metadata)
    return request


def build_list_request(
    page_size: int, page_token: str, agent: str, metadata: Mapping[str, str] | None, principal: str
) -> spb.ListSessionsRequest:
    return spb.ListSessionsRequest(
        page_size=page_size,
        page_token=page_token,
        agent_name=agent,
        metadata=[f"{k}={v}" for k, v in (metadata or {}).items()],
        principal=principal,
    )


def collect_result(events: list[event_pb2.Event]) -> TurnResult:
    """The final answer of a turn: the text after its last tool result."""
    turn_id = events[0].run_id if events else ""
    last = events[-1] if events else None
    if last is None or last.type != event_pb2.RUN_FINISHED:
        raise TurnFailedError(last or event_pb2.Event(message="the turn ended without an event"))
    answer = Answer()
    for event in events:
        answer.feed(event)
    return TurnResult(turn_id=turn_id, text=answer.text, events=events, usage=answer.usage)
