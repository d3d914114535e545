"""Lose nothing: SQLite survives a restart, Redis survives the loss of an
owner, streams resume on any server, retries never run twice, and a router
restart reshuffles no session."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import grpc
import pytest

from tests.support.mesh import (
    Component,
    Mesh,
    RedisServer,
    eventually,
    route_owner,
    session_owned_by,
    until,
)
from turnmesh.client import AsyncClient, TurnFailedError, TurnOptions
from turnmesh.runtime.serving import insecure_channel
from turnmesh.server.stores import open_store
from turnmesh.server.stores.base import SessionStore
from turnmesh.v1 import event_pb2
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1.router_service_pb2_grpc import RouterServiceStub


async def test_sqlite_sessions_survive_a_server_restart(mesh_factory: Mesh, tmp_path: Path) -> None:
    mesh = mesh_factory
    store = f"sqlite:{tmp_path / 'sessions.db'}"
    mesh.start_router()
    worker = mesh.spawn_worker("demo", "demo")
    first = mesh.spawn_server("server-a", "--store", store)
    mesh.wait_ready(worker, first)
    async with AsyncClient(first.address) as client:
        sid = (await client.create_session()).session_id
        done = await client.send(sid, "What is 12*(3+4)?")
    mesh.kill(first, signal.SIGTERM)

    second = mesh.spawn_server("server-b", "--store", store)
    mesh.wait_ready(second)
    async with AsyncClient(second.address) as client:
        assert [m.role for m in await client.history(sid)] == [
            "user",
            "assistant",
            "tool",
            "assistant",
        ]
        replay = [e async for e in client.subscribe(sid, done.turn_id)]
        assert replay == done.events
        again = await client.send(sid, "What did I ask first?")
        assert "What is 12*(3+4)?" in again.text


async def test_shared_sessions_survive_the_loss_of_their_owner(
    mesh_factory: Mesh, shared_store: str
) -> None:
    mesh = mesh_factory
    mesh.start_router()
    workers = [
        mesh.spawn_worker("probe", "probe_agent:ProbeAgent"),
        mesh.spawn_worker("demo", "demo"),
    ]
    # Short leases: a killed owner's sessions move within 2 s, not 6.
    servers = [
        mesh.spawn_server(f"s{i}", "--store", shared_store, "--lease-seconds", "2") for i in (1, 2)
    ]
    mesh.wait_ready(*workers, *servers)
    victim, survivor = servers
    async with AsyncClient(survivor.address) as client:
        sid = await session_owned_by(client, mesh, victim, "probe")
        finished = await client.send(sid, "one", metadata={"deltas": 2, "delay_ms": 1})
        # A turn in flight on the owner when it dies.
        async with client.stream_turn(sid, "two", metadata={"deltas": 500, "delay_ms": 20}) as s:
            async for event in s:
                if event.type == event_pb2.TEXT_MESSAGE_CONTENT:
                    lost_turn = event.run_id
                    break
        # Its events are written behind the stream: the store has its start
        # before the owner dies (else the turn is one the store never heard of).
        store = open_store(shared_store, event_ttl_seconds=600)
        await store.open()
        try:
            await eventually(
                lambda: _stored(store, sid, lost_turn), 30, "the turn's start to be stored"
            )
        finally:
            await store.close()
        mesh.kill(victim, signal.SIGKILL)

        # Full history on the survivor; the finished turn replays; the lost
        # turn ends cleanly; the conversation goes on.
        history = await client.history(sid)
        assert [m.content for m in history] == ["one", "part0 part1 "]
        assert [e async for e in client.subscribe(sid, finished.turn_id)] == finished.events
        tail = [e async for e in client.subscribe(sid, lost_turn, after_seq=1)]
        assert tail[-1].type == event_pb2.RUN_ERROR
        assert tail[-1].code == "owner_lost"
        assert await route_owner(mesh, sid) == survivor.member_id
        result = await client.send(sid, "three", metadata={"deltas": 1, "delay_ms": 1})
        assert result.text == "part0 "
        assert [m.content for m in await client.history(sid)][-2:] == ["three", "part0 "]


async def _stored(store: SessionStore, session_id: str, turn_id: str) -> bool:
    return bool(await store.read_events(session_id, turn_id))


async def test_a_retried_turn_never_runs_twice(mesh_factory: Mesh, shared_store: str) -> None:
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("echo", "echo")
    # Short leases: a killed owner's sessions move within 2 s, not 6.
    servers = [
        mesh.spawn_server(f"s{i}", "--store", shared_store, "--lease-seconds", "2") for i in (1, 2)
    ]
    mesh.wait_ready(worker, *servers)
    victim, survivor = servers
    async with AsyncClient(survivor.address) as client:
        sid = await session_owned_by(client, mesh, victim, "echo")
        first = await client.send(sid, "only once", idempotency_key="key-1")
        retry = await client.send(sid, "only once", idempotency_key="key-1")
        assert retry.events == first.events
        # Even after the owner is gone, the key still names the same turn.
        mesh.kill(victim, signal.SIGKILL)
        after = await client.send(sid, "only once", idempotency_key="key-1")
        assert after.events == first.events
        assert [m.content for m in await client.history(sid)] == ["only once", "only once"]
        fresh = await client.send(sid, "a new one", idempotency_key="key-2")
        assert fresh.turn_id != first.turn_id


async def test_a_router_restart_reshuffles_no_session(mesh_factory: Mesh) -> None:
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("echo", "echo")
    servers = [mesh.spawn_server(f"s{i}") for i in (1, 2)]
    mesh.wait_ready(worker, *servers)
    async with AsyncClient(servers[0].address) as client:
        sessions = [(await client.create_session(agent="echo")).session_id for _ in range(6)]
        for sid in sessions:
            await client.send(sid, "before")
        owners = {sid: await route_owner(mesh, sid) for sid in sessions}
        assert len(set(owners.values())) == 2

        mesh.restart_router()
        assert mesh.router is not None

        async def rejoined() -> bool:
            async with insecure_channel(mesh.router.address) as channel:  # type: ignore[union-attr]
                members = await RouterServiceStub(channel).ListMembers(rpb.ListMembersRequest())
            return len(members.members) == 3

        await eventually(rejoined, what="members to re-register")
        assert {sid: await route_owner(mesh, sid) for sid in sessions} == owners
        for sid in sessions:
            assert (await client.send(sid, "after")).text == "after"
            assert [m.content for m in await client.history(sid)] == [
                "before",
                "before",
                "after",
                "after",
            ]


async def test_a_turn_that_outlives_the_drain_ends_cleanly(
    mesh_factory: Mesh, redis_server: RedisServer
) -> None:
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("probe", "probe_agent:ProbeAgent")
    servers = [
        mesh.spawn_server(f"s{i}", "--store", redis_server.url, "--grace-seconds", "0.5")
        for i in (1, 2)
    ]
    mesh.wait_ready(worker, *servers)
    victim, survivor = servers
    async with AsyncClient(victim.address) as direct, AsyncClient(survivor.address) as other:
        sid = await session_owned_by(other, mesh, victim, "probe")
        await direct.send(sid, "kept", metadata={"deltas": 1, "delay_ms": 1})
        events = []
        async with direct.stream_turn(
            sid, "too slow", metadata={"deltas": 1000, "delay_ms": 20}
        ) as s:
            async for event in s:
                events.append(event)
                if event.type == event_pb2.TEXT_MESSAGE_CONTENT and len(events) == 3:
                    victim.proc.send_signal(signal.SIGTERM)
        assert events[-1].type == event_pb2.RUN_ERROR
        assert events[-1].code == "shutdown"
        assert victim.proc.wait(timeout=30) == 0
        assert [m.content for m in await other.history(sid)] == ["kept", "part0 "]


async def test_a_retry_of_a_failed_turn_runs_it_again(client: AsyncClient) -> None:
    """A failed turn changed nothing, so its idempotency key does not pin the
    failure: the retry runs, once, and a second retry replays that run."""
    sid = (await client.create_session(agent="probe")).session_id
    options: TurnOptions = {
        "idempotency_key": "retry-me",
        "metadata": {"fail_once": sid, "deltas": 2},
    }
    with pytest.raises(TurnFailedError) as failed:
        await client.send(sid, "try", **options)
    assert failed.value.event.problem.title == "Probe failure"
    assert await client.history(sid) == []
    second = await client.send(sid, "try", **options)
    assert second.turn_id != failed.value.event.run_id
    third = await client.send(sid, "try", **options)
    assert third.events == second.events
    assert [m.content for m in await client.history(sid) if m.role == "user"] == ["try"]


async def test_a_cut_off_owner_cannot_commit_a_turn_retried_elsewhere(
    mesh_factory: Mesh, shared_store: str
) -> None:
    """The owner freezes mid-turn (SIGSTOP: a partition, as its peers see it);
    the caller retries with its key on another server, which gives the turn up
    for lost and runs it again. When the owner wakes and finishes the old run,
    its commit is refused: the history has the turn once."""
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("probe", "probe_agent:ProbeAgent")
    # Short leases: a killed owner's sessions move within 2 s, not 6.
    servers = [
        mesh.spawn_server(f"s{i}", "--store", shared_store, "--lease-seconds", "2") for i in (1, 2)
    ]
    mesh.wait_ready(worker, *servers)
    victim, survivor = servers
    options: TurnOptions = {
        "idempotency_key": "only-once",
        "metadata": {"deltas": 30, "delay_ms": 50},
    }
    async with AsyncClient(survivor.address) as client:
        sid = await session_owned_by(client, mesh, victim, "probe")
        async with client.stream_turn(sid, "two", **options) as stream:
            async for event in stream:
                if event.type == event_pb2.TEXT_MESSAGE_CONTENT:
                    first_run = event.run_id
                    break
        os.kill(victim.pid, signal.SIGSTOP)
        try:
            # A unary call forwarded to the frozen owner moves on as soon as
            # the router does, rather than wait for TCP.
            started = time.monotonic()
            assert await client.history(sid) == []
            assert time.monotonic() - started < 20
            await eventually(
                lambda: _owner_is(mesh, sid, survivor), timeout=30, what="the session moving"
            )
            started = time.monotonic()
            retried = await client.send(sid, "two", **options)
            # The frozen owner was given up within heartbeats, not a TCP timeout.
            assert time.monotonic() - started < 20
            assert retried.turn_id != first_run
        finally:
            os.kill(victim.pid, signal.SIGCONT)
        # The old run finishes on the woken owner, and is refused.
        await until(
            lambda: "was taken over elsewhere" in victim.log(), timeout=30, what="the refusal"
        )
        history = await client.history(sid)
        assert [m.content for m in history if m.role == "user"] == ["two"]
        again = await client.send(sid, "two", **options)
        assert again.events == retried.events


async def _owner_is(mesh: Mesh, session_id: str, server: Component) -> bool:
    try:
        return await route_owner(mesh, session_id) == server.member_id
    except grpc.aio.AioRpcError:
        return False
