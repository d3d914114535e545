"""A response's turn run: answered whole, streamed as server-sent events,
or started in the background."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from google.api import httpbody_pb2

from turnmesh.runtime.errors import AwaitingClient, TurnmeshError
from turnmesh.runtime.turn_errors import turn_error
from turnmesh.server.compat._common import (
    Mesh,
    TurnArgs,
    json_body,
    sse_body,
)
from turnmesh.server.compat.openai_responses.conversation import open_response
from turnmesh.server.compat.openai_responses.refusals import awaiting, refused
from turnmesh.server.compat.openai_responses.request import ResponseRequest
from turnmesh.server.compat.openai_responses.response import STATUSES, Response
from turnmesh.v1 import event_pb2
from turnmesh.v1 import session_service_pb2 as spb


async def _events(mesh: Mesh, response: Response) -> AsyncIterator[event_pb2.Event]:
    started = False
    try:
        async with mesh.turn(response.session_id, response.message, **_turn_args(response)) as (
            stream
        ):
            async for event in stream:
                started = True
                response.feed(event)
                yield event
    except TurnmeshError as exc:
        if started:
            raise
        raise await refused(mesh, response, exc) from None


async def _start_background(mesh: Mesh, response: Response) -> Response:
    """The response's turn started in the background (StartTurn): the
    response as it was accepted, queued or in progress."""
    try:
        turn = await mesh.start_turn(response.session_id, response.message, **_turn_args(response))
    except TurnmeshError as exc:
        raise await refused(mesh, response, exc) from None
    response.started(turn.turn_id)
    response.status = STATUSES.get(turn.state, "in_progress")
    return response


def _turn_args(response: Response) -> TurnArgs:
    metadata: dict[str, Any] = dict(response.request.metadata or {})
    if response.request.instructions and response.request.previous_response_id:
        metadata["instructions"] = response.request.instructions
    answers = response.answers
    return {
        "metadata": metadata,
        "files": response.files,
        "on_disconnect": response.on_disconnect,
        # One response per request: never coalesced with another's turn.
        "policy": spb.TURN_POLICY_ENQUEUE,
        "tools": response.request.turn_tools(),
        "tool_results": answers.tool_results if answers else (),
        "resume": answers.resume if answers else (),
    }


async def create(
    mesh: Mesh, request: ResponseRequest, on_disconnect: spb.DisconnectPolicy.ValueType
) -> httpbody_pb2.HttpBody:
    response = await open_response(mesh, request)
    response.on_disconnect = on_disconnect
    if request.background:
        return json_body((await _start_background(mesh, response)).body())
    async for event in _events(mesh, response):
        if event.type == event_pb2.RUN_ERROR:
            error = turn_error(event)
            if isinstance(error, AwaitingClient):  # queued behind a turn that then paused
                error = await awaiting(mesh, response, error)
            raise error
    return json_body(response.body())


async def stream(
    mesh: Mesh, request: ResponseRequest, on_disconnect: spb.DisconnectPolicy.ValueType
) -> AsyncIterator[httpbody_pb2.HttpBody]:
    response = await open_response(mesh, request)
    response.on_disconnect = on_disconnect
    response.streamed = []
    sequence = 0

    def emit(kind: str, **fields: Any) -> httpbody_pb2.HttpBody:
        nonlocal sequence
        frame = sse_body({"type": kind, "sequence_number": sequence, **fields}, event=kind)
        sequence += 1
        return frame

    where = {"output_index": 0, "content_index": 0}
    opened = False

    def open_message() -> list[httpbody_pb2.HttpBody]:
        nonlocal opened
        opened = True
        return [
            emit("response.output_item.added", output_index=0, item=response.item("in_progress")),
            emit(
                "response.content_part.added",
                item_id=response.item_id,
                part={"type": "output_text", "text": "", "annotations": []},
                **where,
            ),
        ]

    async for event in _events(mesh, response):
        if event.type == event_pb2.RUN_STARTED:
            yield emit("response.created", response=response.body())
            yield emit("response.in_progress", response=response.body())
        elif event.type == event_pb2.TEXT_MESSAGE_CONTENT:
            # The message item opens with its first text: a turn that only
            # calls the caller's tools has none.
            if not opened:
                for frame in open_message():
                    yield frame
            response.streamed.append(event.delta)
            yield emit(
                "response.output_text.delta",
                item_id=response.item_id,
                delta=event.delta,
                logprobs=[],
                **where,
            )
        elif event.type == event_pb2.RUN_FINISHED:
            for frame in _finished(response, emit, opened, open_message):
                yield frame
        elif event.type == event_pb2.RUN_ERROR:
            response.status = "failed"
            response.error = {"code": event.code or "server_error", "message": event.message}
            yield emit("response.failed", response=response.body())


Emit = Callable[..., httpbody_pb2.HttpBody]


def _finished(
    response: Response,
    emit: Emit,
    opened: bool,
    open_message: Callable[[], list[httpbody_pb2.HttpBody]],
) -> list[httpbody_pb2.HttpBody]:
    """The frames that close a streamed response: its message item, then an
    item per function call (its arguments in one delta) and per approval
    request, then the response."""
    frames: list[httpbody_pb2.HttpBody] = []
    where = {"output_index": 0, "content_index": 0}
    index = 0
    if response.has_message():
        if not opened:
            frames += open_message()
        frames.append(
            emit(
                "response.output_text.done",
                item_id=response.item_id,
                text=response.text,
                logprobs=[],
                **where,
            )
        )
        frames.append(
            emit(
                "response.content_part.done",
                item_id=response.item_id,
                part=response.part(),
                **where,
            )
        )
        frames.append(
            emit("response.output_item.done", output_index=0, item=response.item("completed"))
        )
        index = 1
    for n in range(len(response.pending)):
        item = response.function_call(n)
        frames.append(
            emit(
                "response.output_item.added",
                output_index=index,
                item=response.function_call(n, "in_progress"),
            )
        )
        frames.append(
            emit(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=index,
                delta=item["arguments"],
            )
        )
        frames.append(
            emit(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=item["arguments"],
            )
        )
        frames.append(emit("response.output_item.done", output_index=index, item=item))
        index += 1
    for item in response.approvals():
        frames.append(emit("response.output_item.added", output_index=index, item=item))
        frames.append(emit("response.output_item.done", output_index=index, item=item))
        index += 1
    kind = "response.incomplete" if response.status == "incomplete" else "response.completed"
    frames.append(emit(kind, response=response.body()))
    return frames
