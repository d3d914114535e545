"""``demo``: a small rule-based agent that uses tools and remembers the conversation.

Deterministic and offline. Rules, first match wins:

0. Files attached: quotes the line of their text (OCR, PDF text, Markdown of an office
   document) that shares the most words with the question, and names any file it could
   not read.
1. "what did I ask first" / "first question": quotes the first user message of the history;
   "what did I ask last / before / previously": quotes the most recent one.
2. An arithmetic expression ("What is 12*(3+4)?"): calls the ``calculator`` tool.
3. Time or date ("time", "clock", "date", "what day"): calls the ``clock`` tool.
4. A question about a file attached earlier: the best-matching line of its text (the
   newest files' text, up to a million characters).
5. Anything else: repeats the message and counts the conversation's user messages.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from turnmesh.agent._contract import AgentRequest, AgentResponse, EventEmitter, TokenUsage
from turnmesh.agent.builtin._calculator import calculate, find_expression
from turnmesh.agent.builtin._common import delay_seconds, stream_words, word_count
from turnmesh.agent.builtin._files import (
    answer_from_files,
    best_line,
    files_in_history,
    off_loop,
)

__all__ = ["DemoAgent"]

_ASKED_FIRST = re.compile(
    r"\bwhat did i (ask|say) first\b|\bfirst (question|message)\b", re.IGNORECASE
)
_ASKED_LAST = re.compile(
    r"\bwhat did i (ask|say) (last|before|previously)\b|\b(last|previous) (question|message)\b",
    re.IGNORECASE,
)
_CLOCK = re.compile(r"\b(time|clock|date|what day)\b", re.IGNORECASE)


def _utc_now() -> datetime:
    return datetime.now(UTC)


class DemoAgent:
    """Rule-based demo agent; ``metadata["delay_ms"]`` slows its streaming down."""

    name = "demo"

    def __init__(self, clock: Callable[[], datetime] = _utc_now) -> None:
        self._clock = clock

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        message = request.message
        asked = [m.get("content", "") for m in request.history if m.get("role") == "user"]

        rule: str
        earlier = files_in_history(request.history)
        if request.files:
            answer = await off_loop(request.files, answer_from_files, message, request.files)
            rule = "files"
        elif _ASKED_FIRST.search(message):
            rule, answer = "history", _recall(asked, first=True)
        elif _ASKED_LAST.search(message):
            rule, answer = "history", _recall(asked, first=False)
        elif (expression := find_expression(message)) is not None:
            rule, answer = "calculator", await self._calculator(expression, emitter)
        elif _CLOCK.search(message):
            rule, answer = "clock", await self._clock_tool(emitter)
        elif (found := await off_loop(earlier, best_line, message, earlier)) is not None:
            rule, answer = "files", f'From {found[0]} (attached earlier): "{found[1]}".'
        else:
            rule = "echo"
            answer = f'You said: "{message}". This is message {len(asked) + 1} of our conversation.'

        await stream_words(emitter, answer, delay_seconds(request.metadata))
        metadata: dict[str, Any] = {"rule": rule}
        usage = TokenUsage(input_tokens=word_count(message), output_tokens=word_count(answer))
        return AgentResponse(text=answer, metadata=metadata, usage=usage)

    async def _calculator(self, expression: str, emitter: EventEmitter) -> str:
        call_id = await emitter.emit_tool_call("calculator", {"expression": expression})
        result = calculate(expression)
        await emitter.emit_tool_result(call_id, result)
        if result.startswith("error: "):
            return f"I could not calculate {expression}: {result.removeprefix('error: ')}."
        return f"{expression} = {result}."

    async def _clock_tool(self, emitter: EventEmitter) -> str:
        call_id = await emitter.emit_tool_call("clock", {"timezone": "UTC"})
        now = self._clock().astimezone(UTC)
        await emitter.emit_tool_result(call_id, now.isoformat(timespec="seconds"))
        return f"It is {now.strftime('%Y-%m-%d %H:%M:%S')} UTC."


def _recall(asked: list[str], *, first: bool) -> str:
    if not asked:
        return "You have not asked me anything before this message."
    if first:
        return f'You first asked: "{asked[0]}".'
    return f'You last asked: "{asked[-1]}".'
