"""A chat completion's turn as it grows: its session, what it sends, and
the calls and interrupts its answer shows."""

from __future__ import annotations

import json
import time
from typing import Any

from google.protobuf import json_format

from turnmesh.runtime.events import Answer
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb


class ClientCalls:
    """The turn's calls of the caller's tools, in the order they started
    (their ``index`` in a streamed answer's ``tool_calls``)."""

    def __init__(self, names: set[str]) -> None:
        self._names = names
        self._calls: dict[str, tuple[int, str, list[str]]] = {}

    def feed(self, event: event_pb2.Event) -> dict[str, Any] | None:
        """The streamed ``tool_calls`` entry for this event, if it is part of
        such a call: the first names it, the next carry its arguments."""
        if event.type == event_pb2.TOOL_CALL_START and event.tool_call_name in self._names:
            if event.tool_call_id in self._calls:
                return None
            index = len(self._calls)
            self._calls[event.tool_call_id] = (index, event.tool_call_name, [])
            # The SDK's stream helper needs `type` first and `function` always.
            function = {"name": event.tool_call_name, "arguments": ""}
            return {
                "index": index,
                "id": event.tool_call_id,
                "type": "function",
                "function": function,
            }
        if event.type == event_pb2.TOOL_CALL_ARGS and event.tool_call_id in self._calls:
            index, _, arguments = self._calls[event.tool_call_id]
            arguments.append(event.delta)
            return {"index": index, "function": {"arguments": event.delta}}
        return None

    def pending(self, outcome: event_pb2.RunOutcome) -> list[dict[str, Any]]:
        """The calls the client must run: the message's ``tool_calls``."""
        waiting = set(outcome.pending_tool_call_ids)
        return [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": "".join(arguments)},
            }
            for call_id, (_, name, arguments) in self._calls.items()
            if call_id in waiting
        ]


class Turn:
    """One chat completion's turn: which session, what it answers, and how it ends."""

    def __init__(self, session_id: str, throwaway: bool) -> None:
        self.session_id = session_id
        self.throwaway = throwaway
        # This request made the session: a turn refused before it started
        # deletes it again, as it does a throwaway one.
        self.made = False
        self.seeded = 0
        self.metadata: dict[str, str] = {}
        self.on_disconnect: spb.DisconnectPolicy.ValueType = spb.DISCONNECT_POLICY_CANCEL
        self.id = ""
        self.created = int(time.time())
        self.answer = Answer()
        self.files: list[message_pb2.File] = []
        self.tools: list[message_pb2.ToolDefinition] = []
        self.tool_results: list[message_pb2.ToolResult] = []
        self.resume: list[message_pb2.ResumeEntry] = []
        # The request's messages that are the tool results, and its last one
        # (errors name them, not TurnRequest's fields).
        self.results_at = range(0)
        self.last = 0
        self.calls = ClientCalls(set())
        # RUN_FINISHED's: what the turn left the client to do (empty: nothing).
        self.outcome = event_pb2.RunOutcome()

    @property
    def usage(self) -> dict[str, int]:
        usage = self.answer.usage
        return {
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.total_tokens,
        }

    def message(self) -> tuple[dict[str, Any], str]:
        """The answer's assistant message and its finish reason. Its content
        is all the text the turn wrote, as the streamed deltas add up to."""
        text = self.answer.streamed
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        calls = self.calls.pending(self.outcome)
        if calls:
            message["content"] = text or None  # OpenAI's, for a message of calls only
            message["tool_calls"] = calls
        if self.outcome.interrupts:
            message["content"] = text or asked_text(self.outcome) or None
            message["interrupts"] = interrupt_items(self.outcome)
            message["function_call"] = interrupts_call(self.outcome)
        return message, "tool_calls" if calls else "stop"


def asked_text(outcome: event_pb2.RunOutcome) -> str:
    return "\n".join(i.message for i in outcome.interrupts if i.message)


def interrupt_items(outcome: event_pb2.RunOutcome) -> list[dict[str, Any]]:
    """The approvals and questions the turn waits for (each answered by a
    ``resume`` entry with its ``id``), with TurnRequest's field names."""
    return [
        json_format.MessageToDict(interrupt, preserving_proto_field_name=True)
        for interrupt in outcome.interrupts
    ]


# The name of the ``function_call`` that carries a turn's interrupts.
INTERRUPTS_CALL = "interrupts"


def interrupts_call(outcome: event_pb2.RunOutcome) -> dict[str, str]:
    """The interrupts again, as the message's ``function_call`` (``name``
    "interrupts", ``arguments`` the ``interrupts`` list as JSON): the one
    field past ``content`` and ``tool_calls`` that the common clients keep
    (langchain's ``additional_kwargs["function_call"]``, litellm's
    ``message.function_call``), where the ``interrupts`` extension is
    dropped. Not a call to run: it is OpenAI's deprecated single function
    call, which no agent loop runs (they run ``tool_calls``), and no request
    declares this function."""
    return {"name": INTERRUPTS_CALL, "arguments": json.dumps(interrupt_items(outcome))}
