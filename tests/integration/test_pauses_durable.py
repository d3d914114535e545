"""A pause outlives its server and its client: a session waiting for the
client survives a SQLite server's crash and its Redis owner's death (the
answer is taken by another server), and one nobody answers expires into error
results the agent sees."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from tests.support.mesh import Mesh, session_owned_by
from turnmesh.client import AsyncClient, NotWaitingError
from turnmesh.v1 import message_pb2

WEATHER = message_pb2.ToolDefinition(name="get_weather", description="the weather in a city")


async def test_a_pause_survives_a_sqlite_server_crash(mesh_factory: Mesh, tmp_path: Path) -> None:
    mesh = mesh_factory
    store = f"sqlite:{tmp_path / 'sessions.db'}"
    mesh.start_router()
    worker = mesh.spawn_worker("demo", "demo")
    first = mesh.spawn_server("server-a", "--store", store)
    mesh.wait_ready(worker, first)
    async with AsyncClient(first.address) as client:
        sid = (await client.create_session()).session_id
        paused = await client.send(sid, "use get_weather for Rome", tools=[WEATHER])
        assert paused.outcome is not None
        (call_id,) = paused.outcome.pending_tool_call_ids
        approval = await client.create_session()
        asked = await client.send(approval.session_id, "what is 6*7 with approval")
        assert asked.outcome is not None and asked.outcome.type == "interrupt"
        (interrupt,) = asked.outcome.interrupts
    mesh.kill(first, signal.SIGKILL)

    second = mesh.spawn_server("server-b", "--store", store)
    mesh.wait_ready(second)
    async with AsyncClient(second.address) as client:
        waiting = (await client.get_session(sid)).pause
        assert (waiting.turn_id, [c.id for c in waiting.tool_calls]) == (paused.turn_id, [call_id])
        result = [message_pb2.ToolResult(tool_call_id=call_id, content="warm")]
        answer = await client.send(sid, "", tool_results=result)
        assert 'Your get_weather returned: "warm"' in answer.text
        assert [i.id for i in (await client.get_session(approval.session_id)).pause.interrupts] == [
            interrupt.id
        ]
        approve = message_pb2.ResumeEntry(interrupt_id=interrupt.id, status="resolved")
        approve.payload.bool_value = True
        approved = await client.send(approval.session_id, "", resume=[approve])
        assert "Approved: calculator returned 42." in approved.text


async def test_a_pause_survives_the_death_of_its_owner(
    mesh_factory: Mesh, shared_store: str
) -> None:
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("demo", "demo")
    # Short leases: a killed owner's sessions move within 2 s, not 6.
    servers = [
        mesh.spawn_server(f"s{i}", "--store", shared_store, "--lease-seconds", "2") for i in (1, 2)
    ]
    mesh.wait_ready(worker, *servers)
    victim, survivor = servers
    async with AsyncClient(survivor.address) as client:
        sid = await session_owned_by(client, mesh, victim, "demo")
        paused = await client.send(sid, "ask get_weather about Lima", tools=[WEATHER])
        assert paused.outcome is not None
        (call_id,) = paused.outcome.pending_tool_call_ids
        mesh.kill(victim, signal.SIGKILL)

        assert [c.id for c in (await client.get_session(sid)).pause.tool_calls] == [call_id]
        with pytest.raises(Exception, match="waits for the client"):
            await client.send(sid, "something else")
        result = [message_pb2.ToolResult(tool_call_id=call_id, content="fog")]
        answer = await client.send(sid, "", tool_results=result)
        assert 'Your get_weather returned: "fog"' in answer.text
        history = await client.history(sid)
        assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
        assert not (await client.get_session(sid)).HasField("pause")


async def _past(instant: float) -> None:
    """Until the wall clock is past ``instant`` (a pause's expiry is a wall-clock time)."""
    await asyncio.sleep(max(0.0, instant - time.time()) + 0.005)
    assert time.time() > instant


async def test_a_pause_nobody_answers_expires_into_errors_the_agent_sees(
    mesh_factory: Mesh,
) -> None:
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("demo", "demo")
    # A millisecond: the pause has expired by the time the client hears the turn ended.
    server = mesh.spawn_server("server", "--pause-timeout", "0.001")
    mesh.wait_ready(worker, server)
    async with AsyncClient(server.address) as client:
        sid = (await client.create_session()).session_id
        paused = await client.send(sid, "call get_weather", tools=[WEATHER])
        assert paused.outcome is not None
        (call_id,) = paused.outcome.pending_tool_call_ids
        # The turn's commit (and the pause's expiry, a millisecond later) came
        # before its last event reached us.
        await _past(time.time() + 0.001)
        assert not (await client.get_session(sid)).HasField("pause")
        with pytest.raises(NotWaitingError) as late:
            await client.send(
                sid, "", tool_results=[message_pb2.ToolResult(tool_call_id=call_id, content="x")]
            )
        assert late.value.metadata["why"] == "expired"
        after = await client.send(sid, "never mind")
        assert "Your get_weather failed: the client did not answer" in after.text
        history = await client.history(sid)
        assert [m.role for m in history] == ["user", "assistant", "tool", "user", "assistant"]
        assert history[2].tool_call_id == call_id and "did not answer" in history[2].error

        # An unanswered question is answered "cancelled" for the agent.
        asked = await client.send(sid, "ask me")
        assert asked.outcome is not None and asked.outcome.type == "interrupt"
        await _past(time.time() + 0.001)
        again = await client.send(sid, "hello")
        assert "You did not answer my question." in again.text
