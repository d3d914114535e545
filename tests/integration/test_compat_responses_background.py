"""Background responses (``"background": true``) through Envoy with the real
openai SDK: answered at once, queued or in progress; retrieved when done;
cancelled while running; a failure shown as ``failed``; and what the API
refuses (streaming one here, cancelling a response that was not one)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from tests.conftest import SharedMesh
from turnmesh.client import AsyncClient
from turnmesh.server.compat.openai_responses import parse_response_id
from turnmesh.v1 import event_pb2

WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"input": {"type": "string"}}},
}


@pytest.fixture
async def sdk(shared_mesh: SharedMesh) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(
        base_url=f"http://{shared_mesh.edge}/v1", api_key="not-needed", max_retries=0
    )
    yield client
    await client.close()


async def _ended(client: AsyncClient, response_id: str) -> event_pb2.Event:
    """Waits for the response's turn to end (its events, followed natively):
    its last event."""
    session_id, turn_id = parse_response_id(response_id, "id")
    async with client.subscribe(session_id, turn_id) as stream:
        events = [event async for event in stream]
    return events[-1]


async def test_a_background_response_is_answered_at_once_and_retrieved_when_done(
    sdk: openai.AsyncOpenAI, client: AsyncClient
) -> None:
    started = await sdk.responses.create(model="demo", input="hello there", background=True)
    assert started.background is True
    assert started.status in ("queued", "in_progress") and started.output == []
    assert (await _ended(client, started.id)).type == event_pb2.RUN_FINISHED
    done = await sdk.responses.retrieve(started.id)
    assert (done.id, done.status, done.background) == (started.id, "completed", True)
    assert done.output_text
    # It continues as any response does.
    follow = await sdk.responses.create(
        model="demo", previous_response_id=done.id, input="what did I say?"
    )
    assert "message 2 of our conversation" in follow.output_text


async def test_a_background_tool_loop(sdk: openai.AsyncOpenAI, client: AsyncClient) -> None:
    started = await sdk.responses.create(
        model="demo", input="use get_weather", tools=[WEATHER], background=True
    )
    await _ended(client, started.id)
    waiting = await sdk.responses.retrieve(started.id)
    (call,) = [item for item in waiting.output if item.type == "function_call"]
    answered = await sdk.responses.create(
        model="demo",
        previous_response_id=waiting.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "rain"}],
        background=True,
    )
    await _ended(client, answered.id)
    assert 'returned: "rain"' in (await sdk.responses.retrieve(answered.id)).output_text


async def test_a_running_background_response_is_cancelled(
    sdk: openai.AsyncOpenAI, client: AsyncClient, shared_mesh: SharedMesh
) -> None:
    gate = uuid.uuid4().hex  # the probe agent runs until this file exists: never
    started = await sdk.responses.create(
        model="probe", input="go", metadata={"gate": gate, "deltas": "3"}, background=True
    )
    session_id, turn_id = parse_response_id(started.id, "id")
    async with client.subscribe(session_id, turn_id) as stream:
        async for event in stream:
            if event.type == event_pb2.TEXT_MESSAGE_CONTENT:
                break  # running
    assert (await sdk.responses.cancel(started.id)).status == "cancelled"
    assert (await _ended(client, started.id)).type == event_pb2.RUN_ERROR
    cancelled = await sdk.responses.retrieve(started.id)
    assert (cancelled.status, cancelled.output) == ("cancelled", [])
    # Cancelling it again answers it as it ended.
    assert (await sdk.responses.cancel(started.id)).status == "cancelled"
    (shared_mesh.mesh.probe_dir / f"gate-{gate}").write_text("")


async def test_a_failed_background_response_says_why(
    sdk: openai.AsyncOpenAI, client: AsyncClient
) -> None:
    started = await sdk.responses.create(
        model="probe", input="go", metadata={"fail_once": uuid.uuid4().hex}, background=True
    )
    assert (await _ended(client, started.id)).type == event_pb2.RUN_ERROR
    failed = await sdk.responses.retrieve(started.id)
    assert failed.status == "failed"
    assert failed.error is not None
    assert failed.model_dump()["error"]["code"] == "agent_error"  # the turn's code


async def test_what_background_responses_refuse(sdk: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as streamed:
        await sdk.responses.create(model="demo", input="hi", background=True, stream=True)
    assert streamed.value.param == "stream"
    plain = await sdk.responses.create(model="demo", input="hi")
    with pytest.raises(openai.BadRequestError) as not_background:
        await sdk.responses.cancel(plain.id)
    assert not_background.value.param == "response_id"
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(plain.id.replace("resp_", "resp_0"))
