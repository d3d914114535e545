"""``echo``: streams the user's message back, word by word."""

from __future__ import annotations

from turnmesh.agent._contract import AgentRequest, AgentResponse, EventEmitter, TokenUsage
from turnmesh.agent.builtin._common import delay_seconds, stream_words, word_count

__all__ = ["EchoAgent"]


class EchoAgent:
    """Deterministic: the answer is the message. ``metadata["delay_ms"]`` slows it down."""

    name = "echo"

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        message = request.message
        await stream_words(emitter, message, delay_seconds(request.metadata))
        words = word_count(message)
        return AgentResponse(
            text=message, usage=TokenUsage(input_tokens=words, output_tokens=words)
        )
