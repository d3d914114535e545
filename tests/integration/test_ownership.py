"""One owner per session, whatever fails: the router killed during turns, a
server stalled past its heartbeats and its lease, refused creates by the
thousand and then a router restart. Real processes, real Redis."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import grpc
import pytest

from tests.support.mesh import (
    Mesh,
    RedisServer,
    eventually,
    route_owner,
    session_owned_by,
    until,
)
from tests.support.postgres import PostgresServer
from tests.support.redis_cluster import RedisCluster
from turnmesh.client import (
    AsyncClient,
    NotFoundError,
    ResourceExhaustedError,
    SessionBusyError,
    UnavailableError,
)
from turnmesh.runtime.serving import insecure_channel
from turnmesh.v1 import event_pb2
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1.router_service_pb2_grpc import RouterServiceStub


async def _members(mesh: Mesh) -> set[str]:
    assert mesh.router is not None
    try:
        async with insecure_channel(mesh.router.address) as channel:
            listed = await RouterServiceStub(channel).ListMembers(rpb.ListMembersRequest())
    except grpc.aio.AioRpcError:
        return set()
    return {m.member_id for m in listed.members}


def _open_gate(mesh: Mesh, gate: str) -> None:
    (mesh.probe_dir / f"gate-{gate}").write_text("open")


async def test_with_the_router_down_a_session_keeps_its_one_owner(
    mesh_factory: Mesh, shared_store: str
) -> None:
    """The router dies while a turn runs on server A. Calls reaching server B
    for A's session are forwarded to A (the store's lease names it), never run
    on B: a REJECT turn is refused as busy, and A's running turn is neither
    abandoned nor lost."""
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("probe", "probe_agent:ProbeAgent")
    a, b = (mesh.spawn_server(name, "--store", shared_store) for name in ("a", "b"))
    mesh.wait_ready(worker, a, b)
    async with AsyncClient(a.address) as on_a, AsyncClient(b.address) as on_b:
        sid = await session_owned_by(on_b, mesh, a, "probe")
        other = await session_owned_by(on_b, mesh, a, "probe")
        await on_b.send(other, "before", metadata={"deltas": 1, "delay_ms": 1})
        async with on_a.stream_turn(
            sid, "long", metadata={"deltas": 3, "delay_ms": 1, "gate": "router-down"}
        ) as stream:
            async for event in stream:
                if event.type == event_pb2.TEXT_MESSAGE_CONTENT:
                    running = event.run_id
                    break
            assert mesh.router is not None
            mesh.kill(mesh.router, signal.SIGKILL)  # waits for it to be gone

            # B cannot ask the router; the lease says A owns both sessions.
            with pytest.raises(SessionBusyError):
                await on_b.send(sid, "rejected", policy="reject")
            assert (await on_b.send(other, "during", metadata={"deltas": 1})).text == "part0 "
            assert [m.content for m in await on_b.history(other)][-2:] == ["during", "part0 "]
            # A new session needs the router: refused, retryable, nothing made.
            with pytest.raises(UnavailableError):
                await on_b.create_session(agent="probe")

            async def disconnected() -> bool:
                return not (await on_b.health()).router_connected

            await eventually(disconnected, what="B to notice the router is gone")

            _open_gate(mesh, "router-down")
            events = [event async for event in stream]
        assert events[-1].type == event_pb2.RUN_FINISHED
        assert events[-1].run_id == running
        history = [m.content for m in await on_b.history(sid)]
        assert history == ["long", "part0 part1 part2 "]

        mesh.restart_router()

        async def rejoined() -> bool:
            return {a.member_id, b.member_id} <= await _members(mesh)

        await eventually(rejoined, what="servers to re-register")
        assert await route_owner(mesh, sid) == a.member_id  # reported by A, from its lease
        after = await on_b.send(sid, "after", metadata={"deltas": 1, "delay_ms": 1})
        assert after.text == "part0 "
    for server in (a, b):
        assert "taken over" not in server.log()
        assert "owner_lost" not in server.log()


@pytest.mark.parametrize("store", ["memory", "redis", "postgres"])
async def test_a_stalled_server_keeps_its_sessions_or_hands_them_over_whole(
    mesh_factory: Mesh, request: pytest.FixtureRequest, store: str
) -> None:
    """SIGSTOP a server past its heartbeats (and lease), then SIGCONT.
    Memory store: its sessions are nobody else's, so they answer UNAVAILABLE
    while it is away and are its own again when it returns, never 404.
    Redis and PostgreSQL: another server takes them over once the lease
    lapses, and the returning server serves them from there (forwarding),
    never twice."""
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("echo", "echo")
    flags: tuple[str, ...] = ()
    if store == "redis":
        redis: RedisServer = request.getfixturevalue("redis_server")
        flags = ("--store", redis.url, "--lease-seconds", "2")
    elif store == "postgres":
        postgres: PostgresServer = request.getfixturevalue("postgres_server")
        url = postgres.database(f"stall_{uuid.uuid4().hex[:12]}")
        flags = ("--store", url, "--lease-seconds", "2")
    a, b = (mesh.spawn_server(name, *flags) for name in ("a", "b"))
    mesh.wait_ready(worker, a, b)
    async with AsyncClient(a.address) as on_a, AsyncClient(b.address) as on_b:
        sid = await session_owned_by(on_b, mesh, a, "echo")
        await on_b.send(sid, "before")
        os.kill(a.pid, signal.SIGSTOP)
        try:

            async def dropped() -> bool:
                return a.member_id not in await _members(mesh)

            await eventually(dropped, timeout=60, what="the router to drop the stalled server")
            if store == "memory":
                for _ in range(3):
                    with pytest.raises(UnavailableError):
                        await on_b.history(sid)
            else:
                # Served from B once A's lease lapsed: the call waits it out.
                assert [m.content for m in await on_b.history(sid)] == ["before", "before"]
                assert (await on_b.send(sid, "during")).text == "during"
                assert await route_owner(mesh, sid) == b.member_id
        finally:
            os.kill(a.pid, signal.SIGCONT)

        async def back() -> bool:
            return a.member_id in await _members(mesh)

        await eventually(back, timeout=60, what="the stalled server to re-register")
        expected = ["before", "before"]
        if store != "memory":
            expected += ["during", "during"]
        for client in (on_a, on_b):
            assert [m.content for m in await client.history(sid)] == expected
        assert (await on_a.send(sid, "after")).text == "after"
        assert [m.content for m in await on_b.history(sid)][-2:] == ["after", "after"]
        owner = await route_owner(mesh, sid)
        assert owner == (a.member_id if store == "memory" else b.member_id)


async def test_refused_creates_leave_nothing_and_a_router_restart_recovers(
    mesh_factory: Mesh, tmp_path: Path
) -> None:
    """A full server refuses a thousand creates: the router keeps no route
    for them and the server no id. After a router restart the server reports
    what it owns in pages that fit the router's (here tiny) message limit,
    and goes on serving and creating."""
    mesh = mesh_factory
    mesh.start_router("--max-request-bytes", "16384")
    worker = mesh.spawn_worker("echo", "echo")
    server = mesh.spawn_server("s", "--max-sessions", "300", "--report-page-size", "100")
    mesh.wait_ready(worker, server)
    async with AsyncClient(server.address) as client:
        sessions = [(await client.create_session(agent="echo")).session_id for _ in range(300)]
        refused = 0
        for index in range(1000):
            with pytest.raises(ResourceExhaustedError):
                await client.create_session(agent="echo", session_id=f"refused-{index}")
            refused += 1
        assert refused == 1000
        # Full, and says so apart from its health: it still serves its sessions.
        health = await client.health()
        assert (health.sessions_available, health.active_sessions) == (0, 300)
        assert health.router_connected
        for probe in ("refused-0", "refused-999"):
            with pytest.raises(NotFoundError):
                await client.get_session(probe)
            assert mesh.router is not None
            async with insecure_channel(mesh.router.address) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await RouterServiceStub(channel).Route(
                        rpb.RouteRequest(session_id=probe, lookup_only=True)
                    )
            assert info.value.code() == grpc.StatusCode.NOT_FOUND

        mesh.restart_router()
        await until(lambda: "reported 300 owned sessions" in server.log(), timeout=60)
        for sid in (sessions[0], sessions[150], sessions[-1]):
            assert await route_owner(mesh, sid) == server.member_id
            assert (await client.send(sid, "still here")).text == "still here"
        await client.delete_session(sessions[0])
        fresh = (await client.create_session(agent="echo")).session_id
        assert (await client.send(fresh, "new")).text == "new"


async def test_a_second_server_on_one_sqlite_file_refuses_to_start(
    mesh_factory: Mesh, tmp_path: Path
) -> None:
    mesh = mesh_factory
    mesh.start_router()
    store = f"sqlite:{tmp_path / 'one.db'}"
    first = mesh.spawn_server("first", "--store", store)
    worker = mesh.spawn_worker("echo", "echo")
    mesh.wait_ready(worker, first)
    second = mesh.spawn_server("second", "--store", store)
    assert second.proc.wait(timeout=60) != 0
    assert "in use by another server" in second.log()
    async with AsyncClient(first.address) as client:
        sid = (await client.create_session(agent="echo")).session_id
        assert (await client.send(sid, "one owner")).text == "one owner"


async def test_a_mesh_on_a_redis_cluster_fails_over_whole(
    mesh_factory: Mesh, redis_cluster: RedisCluster
) -> None:
    """Two servers on a three-node Redis Cluster: sessions spread over the
    nodes, and a SIGKILLed owner's sessions go on, whole, on the other server
    once its lease lapses (the call waits for that instead of failing)."""
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("echo", "echo")
    victim, survivor = (
        mesh.spawn_server(name, "--store", redis_cluster.url, "--lease-seconds", "2")
        for name in ("victim", "survivor")
    )
    mesh.wait_ready(worker, victim, survivor)
    async with AsyncClient(survivor.address) as client:
        sids = [await session_owned_by(client, mesh, victim, "echo") for _ in range(3)]
        for sid in sids:
            assert (await client.send(sid, "before")).text == "before"
        mesh.kill(victim, signal.SIGKILL)
        for sid in sids:
            assert (await client.send(sid, "after")).text == "after"
            assert [m.content for m in await client.history(sid)] == [
                "before",
                "before",
                "after",
                "after",
            ]
            assert await route_owner(mesh, sid) == survivor.member_id
