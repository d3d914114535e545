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

Pauses (the turn ends waiting for the client), to try client tools, approvals and
questions on every surface:

- Tools declared by the caller: a message that names one of them calls the first so
  named, with arguments ``{"input": <the message>}``, and waits for its result.
- "with approval" beside an expression or a time question: the ``calculator`` or
  ``clock`` call waits for the client's approval (an interrupt, reason
  ``tool_approval``) and runs only if approved.
- "ask me": a question (an interrupt, reason ``question``) with a JSON Schema for the
  answer: ``{"type": "object", "properties": {"color": {"type": "string"}}}``.
- The turn that answers says what came back: the tool's result or error, the approved
  tool's result or the denial, the answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from turnmesh.agent._contract import (
    AgentRequest,
    AgentResponse,
    EventEmitter,
    Interrupt,
    Resume,
    TokenUsage,
    ToolResult,
)
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
_WITH_APPROVAL = re.compile(r"\bwith approval\b", re.IGNORECASE)
_ASK_ME = re.compile(r"\bask me\b", re.IGNORECASE)
QUESTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"color": {"type": "string"}},
    "required": ["color"],
}


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
        if request.tool_results or request.resume:
            answer = await self._answered(request, emitter)
            await stream_words(emitter, answer, delay_seconds(request.metadata))
            return AgentResponse(
                text=answer,
                metadata={"rule": "answered"},
                usage=TokenUsage(
                    input_tokens=word_count(message), output_tokens=word_count(answer)
                ),
            )
        named = [t.name for t in request.tools if re.search(rf"\b{re.escape(t.name)}\b", message)]
        if named:
            await emitter.emit_tool_call(named[0], {"input": message})
            return AgentResponse(metadata={"rule": "client_tool"})
        if _ASK_ME.search(message):
            await emitter.emit_delta("Which color do you like?")
            question = Interrupt(
                reason="question",
                message="Which color do you like?",
                response_schema=QUESTION_SCHEMA,
            )
            return AgentResponse(metadata={"rule": "question"}, interrupts=[question])
        if _WITH_APPROVAL.search(message):
            expression = find_expression(message)
            if expression is not None or _CLOCK.search(message):
                name, args = (
                    ("calculator", {"expression": expression})
                    if expression is not None
                    else ("clock", {"timezone": "UTC"})
                )
                call_id = await emitter.emit_tool_call(name, args)
                approval = Interrupt(
                    reason="tool_approval",
                    message=f"May I run {name} with {args}?",
                    tool_call_id=call_id,
                )
                return AgentResponse(metadata={"rule": "approval"}, interrupts=[approval])

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

    async def _answered(self, request: AgentRequest, emitter: EventEmitter) -> str:
        """What came back for the turn before's pause, in words."""
        parts = [_result_words(result) for result in request.tool_results]
        for entry in request.resume:
            parts.append(await self._resumed(entry, emitter))
        if request.message:
            parts.append(f'You also said: "{request.message}".')
        return " ".join(parts)

    async def _resumed(self, entry: Resume, emitter: EventEmitter) -> str:
        call = entry.tool_call
        if call is not None:
            name = call["function"]["name"]
            if not entry.approved:
                await emitter.emit_tool_result(call["id"], "error: not approved")
                return f"You did not approve {name}, so I did not run it."
            arguments = call["function"]["arguments"]
            if name == "calculator":
                expression = str(_json_field(arguments, "expression"))
                result = calculate(expression)
            else:
                result = self._clock().astimezone(UTC).isoformat(timespec="seconds")
            await emitter.emit_tool_result(call["id"], result)
            return f"Approved: {name} returned {result}."
        if entry.status != "resolved":
            return "You did not answer my question."
        payload = entry.payload
        answer = payload.get("color", payload) if isinstance(payload, dict) else payload
        return f'You answered: "{answer}".'

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


def _result_words(result: ToolResult) -> str:
    name = result.name or "the tool"
    if result.error is not None:
        return f"Your {name} failed: {result.error}."
    return f'Your {name} returned: "{result.content}".'


def _json_field(text: str, key: str) -> object:
    try:
        value = json.loads(text)
    except ValueError:
        return ""
    return value.get(key, "") if isinstance(value, dict) else ""


def _recall(asked: list[str], *, first: bool) -> str:
    if not asked:
        return "You have not asked me anything before this message."
    if first:
        return f'You first asked: "{asked[0]}".'
    return f'You last asked: "{asked[-1]}".'
