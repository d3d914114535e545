"""Turns an agent's emitter calls into ``turnmesh.v1.Event`` messages on a queue.

Events come out AG-UI-balanced: text deltas open an assistant text message that a
tool call, a tool result or the end of the turn closes. ``seq``, ``thread_id`` and
``run_id`` are left to the stream writer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from turnmesh.runtime.events import now_ms
from turnmesh.runtime.ids import new_id
from turnmesh.v1 import event_pb2

__all__ = ["QueueEmitter", "make_event"]

ET = event_pb2.EventType


def make_event(type_: event_pb2.EventType.ValueType, **fields: Any) -> event_pb2.Event:
    return event_pb2.Event(type=type_, timestamp=now_ms(), **fields)


class QueueEmitter:
    """An ``EventEmitter`` that queues events for the stream writer, or hands
    each to ``sink`` (a server's relay) as it is made.

    ``None`` on the queue marks the end of the agent's run (see ``finish``).
    """

    def __init__(
        self,
        sink: Callable[[event_pb2.Event], None] | None = None,
        room: Callable[[], Awaitable[object] | None] | None = None,
    ) -> None:
        self.queue: asyncio.Queue[event_pb2.Event | None] = asyncio.Queue()
        self._sink = sink
        # With a sink: what an emit waits on before it returns (the relay's
        # backpressure), or None when it need not wait.
        self._room = room
        self.sunk = 0  # events handed to the sink
        self._text_message_id: str | None = None  # the open text message
        self._assistant_message_id: str | None = None  # parent of the next tool call
        self._text_since_tool_result = False
        # Calls with no result yet, in order: id -> tool name.
        self._unanswered: dict[str, str] = {}

    @property
    def unanswered_calls(self) -> dict[str, str]:
        """The calls emitted with no result (id -> tool name), in order."""
        return self._unanswered

    @property
    def text_since_tool_result(self) -> bool:
        """Whether text was streamed after the last tool result (or at all, if none)."""
        return self._text_since_tool_result

    async def emit_delta(self, text: str) -> None:
        if not text:
            return
        if self._text_message_id is None:
            self._text_message_id = self._assistant_message_id = new_id()
            self._put(
                make_event(
                    ET.TEXT_MESSAGE_START, message_id=self._text_message_id, role="assistant"
                )
            )
        self._put(make_event(ET.TEXT_MESSAGE_CONTENT, message_id=self._text_message_id, delta=text))
        self._text_since_tool_result = True
        if self._room is not None and (wait := self._room()) is not None:
            await wait

    async def emit_tool_call(
        self,
        name: str,
        arguments: Mapping[str, Any] | str,
        *,
        call_id: str | None = None,
    ) -> str:
        call_id = call_id or f"call_{new_id()}"
        args = (
            arguments
            if isinstance(arguments, str)
            else json.dumps(dict(arguments), separators=(",", ":"), ensure_ascii=False)
        )
        self._close_text()
        self._unanswered[call_id] = name
        if self._assistant_message_id is None:
            # A call with no text before it still belongs to an assistant message.
            self._assistant_message_id = new_id()
        self._put(
            make_event(
                ET.TOOL_CALL_START,
                tool_call_id=call_id,
                tool_call_name=name,
                parent_message_id=self._assistant_message_id,
            )
        )
        if args:
            self._put(make_event(ET.TOOL_CALL_ARGS, tool_call_id=call_id, delta=args))
        self._put(make_event(ET.TOOL_CALL_END, tool_call_id=call_id))
        if self._room is not None and (wait := self._room()) is not None:
            await wait
        return call_id

    async def emit_tool_result(self, call_id: str, content: str) -> None:
        self._close_text()
        self._unanswered.pop(call_id, None)
        self._put(
            make_event(
                ET.TOOL_CALL_RESULT,
                message_id=new_id(),
                tool_call_id=call_id,
                content=content,
                role="tool",
            )
        )
        # What the agent says after a result is a new assistant message.
        self._assistant_message_id = None
        self._text_since_tool_result = False
        if self._room is not None and (wait := self._room()) is not None:
            await wait

    def finish(self) -> None:
        """Mark the end of the run; ``events()`` stops after what is queued."""
        self.queue.put_nowait(None)

    async def batches(self) -> AsyncIterator[tuple[list[event_pb2.Event], bool]]:
        """Every event queued so far, as soon as there is one, and whether the
        run has ended: a batch never waits for more events to arrive."""
        while True:
            item = await self.queue.get()
            batch: list[event_pb2.Event] = []
            ended = False
            while True:
                if item is None:
                    ended = True
                    break
                batch.append(item)
                if self.queue.empty():
                    break
                item = self.queue.get_nowait()
            yield batch, ended
            if ended:
                return

    async def events(self) -> AsyncIterator[event_pb2.Event]:
        """Queued events as they are produced, until ``finish``."""
        while (event := await self.queue.get()) is not None:
            yield event

    def closing_events(self, final_text: str) -> list[event_pb2.Event]:
        """Events that complete the turn's text once the agent has returned.

        An agent that streamed nothing after its last tool result has its final
        text sent as one message; an open text message is closed.
        """
        if self._text_message_id is not None:
            event = make_event(ET.TEXT_MESSAGE_END, message_id=self._text_message_id)
            self._text_message_id = None
            return [event]
        if self._text_since_tool_result or not final_text:
            return []
        message_id = new_id()
        self._text_since_tool_result = True
        return [
            make_event(ET.TEXT_MESSAGE_START, message_id=message_id, role="assistant"),
            make_event(ET.TEXT_MESSAGE_CONTENT, message_id=message_id, delta=final_text),
            make_event(ET.TEXT_MESSAGE_END, message_id=message_id),
        ]

    def _close_text(self) -> None:
        if self._text_message_id is not None:
            self._put(make_event(ET.TEXT_MESSAGE_END, message_id=self._text_message_id))
            self._text_message_id = None

    def _put(self, event: event_pb2.Event) -> None:
        if self._sink is not None:
            self._sink(event)
            self.sunk += 1
            return
        # Unbounded: the agent never blocks on a slow reader; a turn's output is finite.
        self.queue.put_nowait(event)
