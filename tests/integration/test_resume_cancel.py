"""Disconnect is not cancel; SubscribeTurn resumes exactly; CancelTurn stops a turn
all the way into the agent."""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path

import httpx
import pytest

from tests.conftest import SharedMesh
from tests.support.mesh import Mesh, eventually, until
from turnmesh.client import AsyncClient, NotFoundError
from turnmesh.v1 import event_pb2
from turnmesh.v1 import session_service_pb2 as spb


async def test_disconnect_continues_and_resume_returns_exactly_the_missing_events(
    client: AsyncClient, client2: AsyncClient
) -> None:
    sid = (await client.create_session(agent="probe")).session_id
    seen: list[event_pb2.Event] = []
    async with client.stream_turn(sid, "go", metadata={"deltas": 12, "delay_ms": 40}) as stream:
        async for event in stream:
            seen.append(event)
            if len(seen) == 4:
                break  # the client drops its stream mid-turn
    turn_id = seen[0].run_id
    last_seq = seen[-1].seq

    # Resume on the other server (forwarded to the owner).
    rest = [e async for e in client2.subscribe(sid, turn_id, after_seq=last_seq)]
    assert [e.seq for e in rest] == list(range(last_seq + 1, last_seq + 1 + len(rest)))
    assert rest[-1].type == event_pb2.RUN_FINISHED
    assert sum(1 for e in seen + rest if e.type == event_pb2.TEXT_MESSAGE_CONTENT) == 12

    everything = [e async for e in client.subscribe(sid, turn_id)]
    assert everything == seen + rest

    history = await client.history(sid)
    assert [m.role for m in history] == ["user", "assistant"]
    assert history[1].content == "".join(f"part{i} " for i in range(12))


async def test_cancel_turn_stops_a_slow_turn_inside_the_agent(
    client: AsyncClient, client2: AsyncClient, shared_mesh: SharedMesh
) -> None:
    sid = (await client.create_session(agent="probe")).session_id
    events: list[event_pb2.Event] = []
    async with client.stream_turn(sid, "slow", metadata={"deltas": 1000, "delay_ms": 50}) as stream:
        async for event in stream:
            events.append(event)
            if event.type == event_pb2.TEXT_MESSAGE_CONTENT and len(events) == 3:
                state = await client2.cancel_turn(sid, event.run_id)
                assert state == spb.TURN_STATE_CANCELLED
    assert events[-1].type == event_pb2.RUN_ERROR
    assert events[-1].code == "cancelled"
    assert events[-1].problem.status == 499
    marker = Path(shared_mesh.mesh.probe_dir) / f"{events[0].run_id}.cancelled"
    await until(marker.exists, what="the agent to see CancelledError")
    assert await client.history(sid) == []
    # Cancelling a finished turn reports its final state.
    assert await client.cancel_turn(sid, events[0].run_id) == spb.TURN_STATE_CANCELLED
    # The session still works.
    result = await client.send(sid, "again", metadata={"deltas": 2, "delay_ms": 1})
    assert result.text == "part0 part1 "


async def test_disconnect_with_cancel_policy_cancels(
    client: AsyncClient, shared_mesh: SharedMesh
) -> None:
    sid = (await client.create_session(agent="probe")).session_id
    turn_id = ""
    async with client.stream_turn(
        sid, "slow", cancel_on_disconnect=True, metadata={"deltas": 1000, "delay_ms": 50}
    ) as stream:
        async for event in stream:
            turn_id = event.run_id
            if event.type == event_pb2.TEXT_MESSAGE_CONTENT:
                break
    marker = Path(shared_mesh.mesh.probe_dir) / f"{turn_id}.cancelled"
    await until(marker.exists, what="the agent to see CancelledError")
    rest = [e async for e in client.subscribe(sid, turn_id)]
    assert rest[-1].type == event_pb2.RUN_ERROR
    assert rest[-1].code == "disconnected"
    assert await client.history(sid) == []


async def test_subscribe_unknown_turn_is_not_found(client: AsyncClient) -> None:
    sid = (await client.create_session(agent="echo")).session_id
    with pytest.raises(NotFoundError):
        [e async for e in client.subscribe(sid, "01J00000000000000000000000")]


async def test_finished_turns_events_are_kept_within_the_servers_budget(
    mesh_factory: Mesh,
) -> None:
    """Past --max-event-log-bytes the oldest finished turns' events go first
    (a resume of them is 404 and says the history has the turn); past
    --event-log-ttl they all go, in sessions nobody touches again too."""
    budget = 12_000
    mesh_factory.start_router()
    worker = mesh_factory.spawn_worker("worker", "echo")
    server = mesh_factory.spawn_server(
        "server", "--max-event-log-bytes", str(budget), "--event-log-ttl", "2",
        "--metrics-port", "0",
    )  # fmt: skip
    mesh_factory.wait_ready(worker, server)
    metrics = f"http://{server.info['metrics_address']}/metrics"
    words = " ".join(f"word{i}" for i in range(20))

    async def kept_bytes() -> float:
        async with httpx.AsyncClient(timeout=60) as http:
            for line in (await http.get(metrics)).text.splitlines():
                if line.startswith("turnmesh_event_log_bytes "):
                    return float(line.split()[1])
        return -1.0

    async with AsyncClient(server.address) as client:
        turns = []
        for _ in range(20):  # each about 2.5 KB packed: 50 KB in all
            sid = (await client.create_session(agent="echo")).session_id
            turns.append((sid, (await client.send(sid, words)).turn_id))
        oldest, newest = turns[0], turns[-1]
        with pytest.raises(NotFoundError, match="history"):
            [e async for e in client.subscribe(*oldest)]
        assert [m.content for m in await client.history(oldest[0])] == [words, words]
        replayed = [e async for e in client.subscribe(*newest)]
        assert replayed[-1].type == event_pb2.RUN_FINISHED and len(replayed) == 24
        await eventually(lambda: _between(kept_bytes(), 1, budget), what="the gauge")
        # The window passes: every log goes, though no call touches them.
        await eventually(lambda: _between(kept_bytes(), 0, 0), timeout=60, what="none kept")
        with pytest.raises(NotFoundError):
            [e async for e in client.subscribe(*newest)]


async def _between(value: Awaitable[float], low: float, high: float) -> bool:
    return low <= await value <= high
