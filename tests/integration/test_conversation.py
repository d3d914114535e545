"""A multi-turn conversation with the demo agent through the typed client."""

from __future__ import annotations

import asyncio

import grpc

from tests.conftest import SharedMesh
from turnmesh.client import AsyncClient, Client
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb

QUESTIONS = ["What is 12*(3+4)?", "Tell me something nice.", "What did I ask first?"]


def _shape(messages: list[message_pb2.Message]) -> list[tuple[str, str, tuple[str, ...], str]]:
    return [
        (m.role, m.content, tuple(c.function.name for c in m.tool_calls), m.tool_call_id and "id")
        for m in messages
    ]


async def test_three_turns_with_tool_call_and_history(client: AsyncClient) -> None:
    session = await client.create_session()
    assert session.agent_name == "demo"
    sid = session.session_id

    first = await client.send(sid, QUESTIONS[0])
    types = [e.type for e in first.events]
    assert types[0] == event_pb2.RUN_STARTED
    assert types[-1] == event_pb2.RUN_FINISHED
    assert [e.seq for e in first.events] == list(range(1, len(first.events) + 1))
    assert all(e.thread_id == sid and e.run_id == first.turn_id for e in first.events)
    assert [c.tool_call_name for c in first.tool_calls] == ["calculator"]
    assert "84" in first.text
    assert sum(1 for e in first.events if e.type == event_pb2.TEXT_MESSAGE_CONTENT) > 1

    history = await client.history(sid)
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
    assert history[0].content == QUESTIONS[0]
    assert history[1].tool_calls[0].function.name == "calculator"
    assert history[2].tool_call_id == history[1].tool_calls[0].id
    assert history[2].content == "84"
    assert history[3].content == first.text

    second = await client.send(sid, QUESTIONS[1])
    history = await client.history(sid)
    assert len(history) == 6
    assert history[4].content == QUESTIONS[1]
    assert history[5].content == second.text

    third = await client.send(sid, QUESTIONS[2])
    assert QUESTIONS[0] in third.text
    history = await client.history(sid)
    assert [m.role for m in history][-2:] == ["user", "assistant"]
    assert len(history) == 8

    summary = await client.get_session(sid)
    assert summary.message_count == 8
    assert not summary.turn_running


async def test_alternating_servers_give_the_same_history(
    client: AsyncClient, client2: AsyncClient
) -> None:
    one = (await client.create_session()).session_id
    for question in QUESTIONS:
        await client.send(one, question)

    two = (await client2.create_session()).session_id
    for i, question in enumerate(QUESTIONS):
        await (client if i % 2 == 0 else client2).send(two, question)

    reference = _shape(await client.history(one))
    assert _shape(await client.history(two)) == reference
    assert _shape(await client2.history(two)) == reference
    assert len(reference) == 8


def _blocking_conversation(edge: str) -> tuple[list[str], int, str, int, list[int]]:
    """The blocking client's calls, on a channel of the caller's own."""
    channel = grpc.insecure_channel(edge)
    try:
        with Client("", channel=channel, metadata=(("x-request-note", "sync"),)) as client:
            healthy = client.health().status
            seeded = client.create_session(
                agent="echo",
                metadata={"team": "a"},
                messages=[message_pb2.Message(role="user", content="earlier")],
            )
            result = client.send(seeded.session_id, "hello there", policy="enqueue")
            history = client.history(seeded.session_id)
            seqs = [e.seq for e in client.subscribe(seeded.session_id, result.turn_id)]
            client.delete_session(seeded.session_id)
        # The channel is still the caller's: the client did not close it.
        grpc.channel_ready_future(channel).result(timeout=30)
        return [m.content for m in history], healthy, result.text, result.usage.total_tokens, seqs
    finally:
        channel.close()


async def test_the_blocking_client_does_what_the_async_one_does(shared_mesh: SharedMesh) -> None:
    contents, healthy, text, tokens, seqs = await asyncio.to_thread(
        _blocking_conversation, shared_mesh.edge
    )
    assert healthy in (spb.LIFECYCLE_STATE_READY, spb.LIFECYCLE_STATE_RUNNING)
    assert contents == ["earlier", "hello there", "hello there"]
    assert text == "hello there"
    assert tokens > 0
    assert seqs == list(range(1, len(seqs) + 1))
