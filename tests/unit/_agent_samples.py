"""Agent classes for the loader tests, imported as ``_agent_samples:<Class>``."""

from __future__ import annotations

from turnmesh.agent import AgentRequest, AgentResponse, EventEmitter


class NamedAgent:
    name = "named"

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        return AgentResponse(text=request.message)


class PlainAgent:
    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        return AgentResponse(text=request.message)


class NoRun:
    pass


class SyncRun:
    def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        return AgentResponse(text=request.message)


class NeedsArguments:
    def __init__(self, model: str) -> None:
        self.model = model

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        return AgentResponse(text=self.model)


instance_agent = NamedAgent()


class ClosingAgent:
    """Records that the worker called its optional ``close`` hook."""

    closed = 0

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        return AgentResponse(text=request.message)

    async def close(self) -> None:
        ClosingAgent.closed += 1
