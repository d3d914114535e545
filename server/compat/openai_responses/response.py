"""The response object as it grows from a turn's events."""

from __future__ import annotations

import time
from typing import Any

from google.protobuf import json_format

from turnmesh.runtime.events import Answer
from turnmesh.server.compat.openai_responses.ids import (
    approval_item_id,
    call_item_id,
    item_id,
    response_id,
)
from turnmesh.server.compat.openai_responses.request import ResponseRequest, TurnAnswers
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb

APPROVAL = "tool_approval"


class Response:
    """The response object, as it grows."""

    def __init__(self, request: ResponseRequest, session_id: str) -> None:
        self.request = request
        self.session_id = session_id
        self.id = ""
        self.turn_id = ""
        self.item_id = ""
        self.created_at = int(time.time())
        self.answer = Answer()
        # Streamed: every delta sent (a content part's text is its deltas).
        self.streamed: list[str] | None = None
        self.status = "in_progress"
        self.error: dict[str, str] | None = None
        self.files: list[message_pb2.File] = []
        self.on_disconnect: spb.DisconnectPolicy.ValueType = spb.DISCONNECT_POLICY_CANCEL
        # The turn's request beyond its files.
        self.message = ""
        self.answers: TurnAnswers | None = None
        # This request made the session (seeded or forked): a refused turn
        # deletes it again. How many messages it was seeded with, if known.
        self.made = False
        self.seeded: int | None = None
        # The turn's tool calls (id: [name, arguments]) and what it waits for.
        self.calls: dict[str, list[str]] = {}
        self.pending: list[str] = []
        self.interrupts: list[event_pb2.Interrupt] = []

    def started(self, turn_id: str) -> None:
        self.turn_id = turn_id
        self.id = response_id(self.session_id, turn_id)
        self.item_id = item_id(self.session_id, turn_id)

    @property
    def text(self) -> str:
        return "".join(self.streamed) if self.streamed is not None else self.answer.text

    @property
    def usage(self) -> dict[str, int]:
        usage = self.answer.usage
        return {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "total_tokens": usage.total_tokens,
        }

    def part(self) -> dict[str, Any]:
        return {"type": "output_text", "text": self.text, "annotations": []}

    def item(self, status: str) -> dict[str, Any]:
        content = [self.part()] if status == "completed" else []
        return {
            "id": self.item_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def has_message(self) -> bool:
        """Whether the output has a message item: the agent said something,
        or there is nothing else to show."""
        said = bool(self.streamed) if self.streamed is not None else bool(self.text)
        return said or not (self.pending or self.approvals())

    def function_call(self, index: int, status: str = "completed") -> dict[str, Any]:
        call_id = self.pending[index]
        name, arguments = self.calls.get(call_id, ["", ""])
        return {
            "id": call_item_id(self.session_id, self.turn_id, index),
            "type": "function_call",
            "status": status,
            "call_id": call_id,
            "name": name,
            "arguments": arguments if status == "completed" else "",
        }

    def approvals(self) -> list[dict[str, Any]]:
        """Approval interrupts as OpenAI's approval requests: the gated call's
        name and arguments, the agent as the server that asks."""
        items = []
        for index, interrupt in enumerate(self.interrupts):
            if is_approval(interrupt):
                name, arguments = self.calls.get(interrupt.tool_call_id, ["", ""])
                items.append(
                    {
                        # Names its session: it resolves anywhere (``approvals``).
                        "id": approval_item_id(self.session_id, self.turn_id, index),
                        "type": "mcp_approval_request",
                        "name": name,
                        "arguments": arguments,
                        "server_label": self.request.model,
                    }
                )
        return items

    def output(self) -> list[dict[str, Any]]:
        if self.status not in ("completed", "incomplete"):
            return []
        items = [self.item("completed")] if self.has_message() else []
        items += [self.function_call(index) for index in range(len(self.pending))]
        return items + self.approvals()

    def body(self) -> dict[str, Any]:
        body = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "model": self.request.model,
            "output": self.output(),
            "usage": {
                **self.usage,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
            "instructions": self.request.instructions,
            "metadata": self.request.metadata or {},
            "previous_response_id": self.request.previous_response_id,
            "error": self.error,
            "incomplete_details": (
                {"reason": "interrupt"} if self.status == "incomplete" else None
            ),
            "parallel_tool_calls": self.request.parallel_tool_calls is not False,
            "tool_choice": self.request.tool_choice or "auto",
            "tools": self.request.shown_tools(),
            "temperature": None,
            "top_p": None,
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "store": True,
            "background": self.request.background,
        }
        if self.interrupts:
            body["interrupts"] = [
                json_format.MessageToDict(i, preserving_proto_field_name=True)
                for i in self.interrupts
            ]
        return body

    def feed(self, event: event_pb2.Event) -> None:
        self.answer.feed(event)
        if event.type == event_pb2.RUN_STARTED:
            self.started(event.run_id)
        elif event.type == event_pb2.TOOL_CALL_START:
            self.calls[event.tool_call_id] = [event.tool_call_name, ""]
        elif event.type == event_pb2.TOOL_CALL_ARGS:
            if event.tool_call_id in self.calls:
                self.calls[event.tool_call_id][1] += event.delta
        elif event.type == event_pb2.RUN_FINISHED:
            self.pending = list(event.outcome.pending_tool_call_ids)
            self.interrupts = list(event.outcome.interrupts)
            # A question has no shape in this API: the response must not
            # look done.
            asks = any(not is_approval(i) for i in self.interrupts)
            self.status = "incomplete" if asks else "completed"


def is_approval(interrupt: event_pb2.Interrupt) -> bool:
    return interrupt.reason == APPROVAL and bool(interrupt.tool_call_id)


# A turn's state as a response's status (FINISHED: what it answered says).
STATUSES = {
    spb.TURN_STATE_QUEUED: "queued",
    spb.TURN_STATE_RUNNING: "in_progress",
    spb.TURN_STATE_FAILED: "failed",
    spb.TURN_STATE_CANCELLED: "cancelled",
}
