"""Run an agent written for AReaL's agent service (the seed's ``AgentRunnable``)
unmodified: ``kind: areal`` with ``class: package.module:Class`` in an agent file.

Such an agent changes only its imports, from AReaL's service package
(``areal.experimental.agent_service.types`` and ``.protocol``) to this module::

    from turnmesh.agent.areal import AgentRequest, AgentResponse, EventEmitter, QueueMode

or keeps look-alike dataclasses of its own: the response is read by duck typing.

What the agent sees: ``session_key`` is the turnmesh session id, ``run_id`` the
turn id, ``history`` the session's messages (role, content, and the OpenAI
``tool_calls`` / ``tool_call_id`` that the seed's own service also puts there),
``queue_mode`` COLLECT, ``metadata`` the turn's metadata, and ``message`` the
user's text followed by the text of any attached files. Its emitter streams
turnmesh events: deltas as text, each tool call with a fresh call id, and each
``emit_tool_result(name, result)`` as the result of the oldest still-open call
of that name. A result naming no open call is sent as a call of its own with its
result (and logged), so that no event ever names a call that does not exist.
``AgentResponse.summary`` is the turn's answer when nothing was streamed after
the last tool result; ``metadata`` goes to ``RUN_FINISHED.result``. An exception
is a generic agent error, as for any agent.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, cast, runtime_checkable

import turnmesh.agent._contract as native
from turnmesh.agent._prompt import file_context
from turnmesh.agent._spec import import_agent

__all__ = [
    "AReaLAgent",
    "AgentRequest",
    "AgentResponse",
    "AgentRunnable",
    "EventEmitter",
    "QueueMode",
    "seed_request",
]

log = logging.getLogger(__name__)


# --- the seed's contract, field for field ------------------------------------


class QueueMode(str, Enum):  # noqa: UP042 - the seed's own base: str() and format() as there
    """How a session's queued messages become turns (the seed's names)."""

    COLLECT = "collect"
    FOLLOWUP = "followup"


@dataclass
class AgentRequest:
    message: str
    session_key: str
    run_id: str
    # The seed annotates list[dict[str, str]], but its service fills in OpenAI
    # tool_calls lists too, and so does this adapter.
    history: list[dict[str, Any]] = field(default_factory=list)
    queue_mode: QueueMode = QueueMode.COLLECT
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class AgentResponse:
    summary: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


class EventEmitter(Protocol):
    async def emit_delta(self, text: str) -> None: ...
    async def emit_tool_call(self, name: str, args: str) -> None: ...
    async def emit_tool_result(self, name: str, result: str) -> None: ...


@runtime_checkable
class AgentRunnable(Protocol):
    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse: ...


# --- the adapter -------------------------------------------------------------


def _new_call_id() -> str:
    return f"call_{uuid.uuid4().hex}"


class _SeedEmitter:
    """The seed's emitter over turnmesh's: the seed names a result's call only
    by its tool, so calls are matched first in, first out per tool name."""

    def __init__(self, emitter: native.EventEmitter, agent_name: str) -> None:
        self._emitter = emitter
        self._agent_name = agent_name
        self._open: dict[str, deque[str]] = {}

    async def emit_delta(self, text: str) -> None:
        await self._emitter.emit_delta(text)

    async def emit_tool_call(self, name: str, args: str | Mapping[str, Any]) -> None:
        call_id = _new_call_id()
        # Opened before the emit can wait, so a result from another task finds it.
        self._open.setdefault(name, deque()).append(call_id)
        await self._emitter.emit_tool_call(name, args, call_id=call_id)

    async def emit_tool_result(self, name: str, result: str) -> None:
        waiting = self._open.get(name)
        if waiting:
            call_id = waiting.popleft()
        else:
            # Dropping it would lose the agent's output; a bare result would name
            # a call that no client, nor the history, has seen.
            log.warning(
                "areal agent %s sent a result for %r with no open call of that name: "
                "sent as a call of its own",
                self._agent_name,
                name,
            )
            call_id = _new_call_id()
            await self._emitter.emit_tool_call(name, "{}", call_id=call_id)
        await self._emitter.emit_tool_result(call_id, result)


def _seed_message(message: dict[str, Any]) -> dict[str, Any]:
    """A history message in the seed's shape: turnmesh's extra keys (``files``) dropped."""
    out: dict[str, Any] = {"role": message.get("role", ""), "content": message.get("content") or ""}
    for key in ("tool_calls", "tool_call_id"):
        if key in message:
            out[key] = message[key]
    return out


def seed_request(request: native.AgentRequest) -> AgentRequest:
    """The seed's request for a turnmesh turn."""
    message = request.message
    if request.files and (context := file_context(request.files)):
        message = f"{message}\n\n{context}"
    return AgentRequest(
        message=message,
        session_key=request.session_id,
        run_id=request.turn_id,
        history=[_seed_message(m) for m in request.history],
        # A worker is not told the session's policy; COLLECT is the default of both.
        queue_mode=QueueMode.COLLECT,
        metadata=dict(request.metadata),
    )


def _turnmesh_response(response: object) -> native.AgentResponse:
    summary = getattr(response, "summary", None)
    metadata = getattr(response, "metadata", None) or {}
    if not isinstance(summary, str) or not isinstance(metadata, Mapping):
        # Raised into the worker, which logs it and ends the turn with an agent error.
        raise TypeError(
            "an areal agent must return an AgentResponse (summary: str, metadata: dict), "
            f"not {type(response).__name__}"
        )
    return native.AgentResponse(text=summary, metadata=dict(metadata))


class AReaLAgent:
    """A turnmesh agent running an agent written for the seed's ``AgentRunnable``.

    ``agent``: the agent itself, or ``package.module:Class`` (instantiated with
    no arguments, as the loader does for any agent class).
    """

    def __init__(self, agent: str | AgentRunnable, *, name: str | None = None) -> None:
        if isinstance(agent, str):
            loaded_name, loaded = import_agent(agent)  # its errors name the spec
            self.agent = cast(AgentRunnable, loaded)
            name = name or loaded_name
        else:
            self.agent = agent
        self.name = name or type(self.agent).__name__.lower()

    async def run(
        self, request: native.AgentRequest, *, emitter: native.EventEmitter
    ) -> native.AgentResponse:
        response = await self.agent.run(
            seed_request(request), emitter=_SeedEmitter(emitter, self.name)
        )
        return _turnmesh_response(response)

    # The seed's optional hooks, under turnmesh's names.
    async def close_session(self, session_id: str) -> None:
        hook = getattr(self.agent, "close_session", None)
        if hook is not None:
            await hook(session_id)

    async def close(self) -> None:
        hook = getattr(self.agent, "close_all_sessions", None)
        if hook is not None:
            await hook()
