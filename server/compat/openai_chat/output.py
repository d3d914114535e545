"""A turn's answer as a chat completion, whole or as chunks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from google.api import httpbody_pb2

from turnmesh.runtime.turn_errors import turn_error
from turnmesh.server.compat._common import (
    Mesh,
    json_body,
    sse_body,
)
from turnmesh.server.compat.openai_chat.conversation import events
from turnmesh.server.compat.openai_chat.request import ChatCompletionRequest
from turnmesh.server.compat.openai_chat.turn import (
    Turn,
    asked_text,
    interrupt_items,
    interrupts_call,
)
from turnmesh.v1 import event_pb2


def error_payload(event: event_pb2.Event) -> dict[str, Any]:
    """A RUN_ERROR as the stream's error frame: its type is the one the
    error table gives the same turn answered in one piece (``turn_error``)."""
    return {
        "error": {
            "message": event.message or "the turn failed",
            "type": type(turn_error(event)).openai_type,
            "param": None,
            "code": event.code or None,
        }
    }


async def complete(
    mesh: Mesh, request: ChatCompletionRequest, turn: Turn, message: str
) -> httpbody_pb2.HttpBody:
    async for event in events(mesh, turn, message):
        turn.calls.feed(event)
        if event.type == event_pb2.RUN_ERROR:
            raise turn_error(event)
    answer, finish = turn.message()
    return json_body(
        {
            "id": turn.id,
            "object": "chat.completion",
            "created": turn.created,
            "model": request.model,
            "choices": [{"index": 0, "message": answer, "logprobs": None, "finish_reason": finish}],
            "usage": turn.usage,
            "system_fingerprint": None,
        }
    )


async def stream(
    mesh: Mesh, request: ChatCompletionRequest, turn: Turn, message: str
) -> AsyncIterator[httpbody_pb2.HttpBody]:
    include_usage = bool(request.stream_options and request.stream_options.include_usage)

    def chunk(delta: dict[str, Any], finish: str | None = None) -> httpbody_pb2.HttpBody:
        payload: dict[str, Any] = {
            "id": turn.id,
            "object": "chat.completion.chunk",
            "created": turn.created,
            "model": request.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            payload["usage"] = None
        return sse_body(payload)

    said = False
    async for event in events(mesh, turn, message):
        if event.type == event_pb2.RUN_STARTED:
            yield chunk({"role": "assistant", "content": "", "refusal": None})
        elif event.type == event_pb2.TEXT_MESSAGE_CONTENT:
            said = True
            yield chunk({"content": event.delta})
        elif turn.calls.feed(event) is not None:
            # Kept until the end: an agent's own tool may share a declared
            # tool's name, and only RUN_FINISHED says which calls the client
            # must run (the agent ran the others itself).
            pass
        elif event.type == event_pb2.RUN_FINISHED:
            _, finish = turn.message()
            for index, call in enumerate(turn.calls.pending(turn.outcome)):
                # As OpenAI streams a call: `type`, id and name first (the SDK's
                # stream helper needs `function` in every delta), then arguments.
                head = {**call, "index": index, "function": {**call["function"], "arguments": ""}}
                yield chunk({"tool_calls": [head]})
                arguments = call["function"]["arguments"]
                yield chunk(
                    {"tool_calls": [{"index": index, "function": {"arguments": arguments}}]}
                )
            last: dict[str, Any] = {}
            if turn.outcome.interrupts:
                asked = asked_text(turn.outcome)
                if asked and not said:
                    yield chunk({"content": asked})
                last["interrupts"] = interrupt_items(turn.outcome)
                last["function_call"] = interrupts_call(turn.outcome)
            yield chunk(last, finish)
            if include_usage:
                usage_chunk = {
                    "id": turn.id,
                    "object": "chat.completion.chunk",
                    "created": turn.created,
                    "model": request.model,
                    "system_fingerprint": None,
                    "choices": [],
                    "usage": turn.usage,
                }
                yield sse_body(usage_chunk)
        elif event.type == event_pb2.RUN_ERROR:
            # After the first chunk an HTTP status can no longer change: the
            # SDK raises an APIError for an `error` frame.
            yield sse_body(error_payload(event))
            break
    yield sse_body("[DONE]")
