"""Turn a turn's events into history messages in the OpenAI chat shape.

Text before a tool call becomes the content of the assistant message that
makes the call; each tool result becomes a ``tool`` message; the text after
the last tool result becomes the final ``assistant`` message.
"""

from __future__ import annotations

from google.protobuf import struct_pb2, timestamp_pb2

from turnmesh.runtime.errors import TurnNotFound
from turnmesh.v1 import event_pb2, message_pb2


def up_to_turn(
    history: list[message_pb2.Message], turn_id: str, *, param: str = "at_turn_id"
) -> list[message_pb2.Message]:
    """The history up to and including a turn's messages (all of it for no
    turn): what a fork at that turn starts from."""
    if not turn_id:
        return history
    for index in range(len(history) - 1, -1, -1):
        if history[index].turn_id == turn_id:
            return history[: index + 1]
    raise TurnNotFound(
        f"turn {turn_id!r} is not in the session's history (a running, cancelled or "
        "failed turn saved nothing)",
        metadata={"param": param},
    )


class HistoryBuilder:
    def __init__(self, turn_id: str) -> None:
        self._turn_id = turn_id
        self._messages: list[message_pb2.Message] = []
        self._text: list[str] = []
        self._calls: dict[str, message_pb2.ToolCall] = {}
        self._call_order: list[str] = []
        self._args: dict[str, list[str]] = {}

    def feed(self, event: event_pb2.Event) -> None:
        t = event.type
        if t == event_pb2.TEXT_MESSAGE_CONTENT:
            self._text.append(event.delta)
        elif t == event_pb2.TOOL_CALL_START:
            call = message_pb2.ToolCall(
                id=event.tool_call_id,
                type="function",
                function=message_pb2.FunctionCall(name=event.tool_call_name),
            )
            self._calls[event.tool_call_id] = call
            self._call_order.append(event.tool_call_id)
            self._args[event.tool_call_id] = []
        elif t == event_pb2.TOOL_CALL_ARGS:
            self._args.setdefault(event.tool_call_id, []).append(event.delta)
        elif t == event_pb2.TOOL_CALL_RESULT:
            self._flush_assistant()
            self._messages.append(
                message_pb2.Message(
                    role="tool",
                    content=event.content,
                    tool_call_id=event.tool_call_id,
                    turn_id=self._turn_id,
                )
            )

    @property
    def calls(self) -> dict[str, message_pb2.ToolCall]:
        """The turn's tool calls by id (complete once ``finish`` ran)."""
        return self._calls

    def _flush_assistant(self) -> None:
        if not self._call_order and not self._text:
            return
        message = message_pb2.Message(
            role="assistant", content="".join(self._text), turn_id=self._turn_id
        )
        for call_id in self._call_order:
            call = self._calls[call_id]
            call.function.arguments = "".join(self._args.get(call_id, []))
            message.tool_calls.append(call)
        self._messages.append(message)
        self._text.clear()
        self._call_order.clear()

    def finish(
        self,
        created_at: timestamp_pb2.Timestamp,
        metadata: struct_pb2.Struct | None,
        *,
        paused: bool = False,
    ) -> list[message_pb2.Message]:
        """The turn's assistant and tool messages, ending with the final
        answer; a turn that waits for the client ends where it stopped (its
        calls' results come next)."""
        self._flush_assistant()
        if not (paused and self._messages) and (
            not self._messages
            or self._messages[-1].role != "assistant"
            or (self._messages[-1].tool_calls)
        ):
            # Always end on a plain assistant message, even an empty one, so a
            # history replayed to a chat model is well-formed.
            self._messages.append(
                message_pb2.Message(role="assistant", content="", turn_id=self._turn_id)
            )
        for message in self._messages:
            message.created_at.CopyFrom(created_at)
        if metadata is not None and metadata.fields:
            self._messages[-1].metadata.CopyFrom(metadata)
        return self._messages
