"""What every reader of a turn's events shares: their timestamps, and the
fold of a turn's events into its answer (used by the typed client, the server
and every compatibility surface, so they agree on what "the answer" is)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from turnmesh.v1 import event_pb2

TERMINAL_TYPES = frozenset({event_pb2.RUN_FINISHED, event_pb2.RUN_ERROR})


def now_ms() -> float:
    """Whole milliseconds since the epoch. A double in the proto (an int64
    prints as a JSON string), but integral: the AG-UI client rejects a
    timestamp with a fraction (it checks for a safe integer)."""
    return float(time.time_ns() // 1_000_000)


def sum_usage(usage: Iterable[event_pb2.TokenUsage]) -> event_pb2.TokenUsage:
    """Token usage added up (an agent may report one entry per model call)."""
    total = event_pb2.TokenUsage()
    for u in usage:
        total.input_tokens += u.input_tokens
        total.output_tokens += u.output_tokens
        total.total_tokens += u.total_tokens
    return total


class Answer:
    """A turn's events folded into its answer: the text after its last tool
    result (text before a tool call is the agent thinking aloud) and the usage
    of RUN_FINISHED summed.

    ::

        answer = Answer()
        for event in events:
            answer.feed(event)
        answer.text, answer.usage.total_tokens
    """

    def __init__(self) -> None:
        self._parts: list[str] = []
        # Where the text after the last tool result starts in ``_parts``.
        self._answer_from = 0
        self.usage = event_pb2.TokenUsage()

    def feed(self, event: event_pb2.Event) -> None:
        kind = event.type
        if kind == event_pb2.TEXT_MESSAGE_CONTENT:
            self._parts.append(event.delta)
        elif kind == event_pb2.TOOL_CALL_RESULT:
            self._answer_from = len(self._parts)
        elif kind == event_pb2.RUN_FINISHED:
            self.usage = sum_usage(event.usage)

    @property
    def text(self) -> str:
        return "".join(self._parts[self._answer_from :])

    @property
    def streamed(self) -> str:
        """All the text the turn streamed, before its tool calls too (what a
        streamed chat completion's deltas add up to)."""
        return "".join(self._parts)
