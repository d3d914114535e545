"""The agent contract: what an agent implements to run in a turnmesh worker.

An agent is any class with an async ``run``; start a worker with the agent
``mypkg.agents:Shouter`` (or a built-in name, ``echo`` or ``demo``)::

    from turnmesh.agent import AgentRequest, AgentResponse, EventEmitter, TokenUsage

    class Shouter:
        name = "shouter"  # optional; defaults to the class name in lower case

        async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
            answer = request.message.upper()
            await emitter.emit_delta(answer)  # stream as you go: deltas, tool calls, results
            words = len(answer.split())
            return AgentResponse(text=answer, usage=TokenUsage(words, words))

The worker runs one ``run`` per turn; a cancelled turn raises
``asyncio.CancelledError`` inside ``run``.
"""

from turnmesh.agent._contract import (
    MAX_CHECKPOINT_BYTES,
    AgentError,
    AgentFile,
    AgentRequest,
    AgentResponse,
    AgentRunnable,
    ClientTool,
    EventEmitter,
    Interrupt,
    Resume,
    TokenUsage,
    ToolResult,
)
from turnmesh.agent._loader import load_agent
from turnmesh.agent._spec import BUILTIN_AGENTS, AgentLoadError

__all__ = [
    "BUILTIN_AGENTS",
    "MAX_CHECKPOINT_BYTES",
    "AgentError",
    "AgentFile",
    "AgentLoadError",
    "AgentRequest",
    "AgentResponse",
    "AgentRunnable",
    "ClientTool",
    "EventEmitter",
    "Interrupt",
    "Resume",
    "TokenUsage",
    "ToolResult",
    "load_agent",
]

# Reprs and tracebacks name the public module, not the private one.
for _obj in (
    AgentError,
    AgentFile,
    AgentLoadError,
    AgentRequest,
    AgentResponse,
    AgentRunnable,
    ClientTool,
    EventEmitter,
    Interrupt,
    Resume,
    TokenUsage,
    ToolResult,
    load_agent,
):
    _obj.__module__ = __name__
del _obj
