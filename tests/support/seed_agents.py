"""Agents written exactly against the seed's contract (AReaL's ``AgentRunnable``,
``/work/shared/SEED-CONTRACTS.md``), run by turnmesh with ``kind: areal``.

They import the seed's shapes from ``turnmesh.agent.areal`` (the one change a
seed agent needs), except ``SummaryAgent``, which returns a look-alike
dataclass of its own, as the seed allows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from turnmesh.agent.areal import AgentRequest, AgentResponse, EventEmitter

# What ToolAgent answers, and the results it sends (by tool name, in order).
TOOL_SUMMARY = "Oslo has snow, Lima has sun; it is noon."
WEATHER = {"Oslo": "Oslo: -3C, snow", "Lima": "Lima: 24C, sun"}
CLOCK = "12:00"
GHOST = "a result for a tool nobody called"


@dataclass
class LookAlikeResponse:
    """An agent's own AgentResponse (it never imports the service's)."""

    summary: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


class SummaryAgent:
    """Streams nothing: its answer is the summary; its metadata is what it saw."""

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> LookAlikeResponse:
        return LookAlikeResponse(
            summary=f"You said: {request.message}",
            metadata={
                "session_key": request.session_key,
                "run_id": request.run_id,
                "queue_mode": request.queue_mode.value,
                "history": [[m["role"], m["content"]] for m in request.history],
                "metadata": request.metadata,
            },
        )


class StreamingAgent:
    """Streams its answer, then returns the same text as its summary."""

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        words = ["Streaming", " back:", f" {request.message}"]
        for word in words:
            await emitter.emit_delta(word)
        return AgentResponse(summary="".join(words), metadata={"words": len(words)})


class ToolAgent:
    """Two calls of one tool and one of another open at once, their results by
    name (the first weather result is Oslo's), then a result naming no call."""

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        await emitter.emit_delta("Let me look that up.")
        await emitter.emit_tool_call("weather", json.dumps({"city": "Oslo"}))
        await emitter.emit_tool_call("weather", json.dumps({"city": "Lima"}))
        await emitter.emit_tool_call("clock", "{}")
        await emitter.emit_tool_result("weather", WEATHER["Oslo"])
        await emitter.emit_tool_result("clock", CLOCK)
        await emitter.emit_tool_result("weather", WEATHER["Lima"])
        await emitter.emit_tool_result("ghost", GHOST)
        return AgentResponse(summary=TOOL_SUMMARY)


class RaisingAgent:
    """Starts answering, then fails with a secret in its exception."""

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        await emitter.emit_delta("Working on it... ")
        raise RuntimeError("the database password is hunter2")
