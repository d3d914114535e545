"""``echo``: streams the user's message back, word by word."""

from __future__ import annotations

from turnmesh.agent._contract import AgentRequest, AgentResponse, EventEmitter, TokenUsage
from turnmesh.agent.builtin._common import delay_seconds, stream_words, word_count

__all__ = ["EchoAgent"]


MAX_REPEAT = 100


class EchoAgent:
    """Deterministic: the answer is the message. ``metadata["delay_ms"]`` slows
    it down; ``metadata["repeat"]`` (1-100) says it that many times, joined by
    a space (long answers for benchmarks)."""

    name = "echo"

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        message = " ".join([request.message] * repeat_count(request.metadata))
        await stream_words(emitter, message, delay_seconds(request.metadata))
        words = word_count(message)
        return AgentResponse(
            text=message, usage=TokenUsage(input_tokens=words, output_tokens=words)
        )


def repeat_count(metadata: dict[str, object]) -> int:
    value = metadata.get("repeat", 1)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 1
    return int(min(max(value, 1), MAX_REPEAT))
