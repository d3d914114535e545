"""Processes die: a worker mid-turn, a server; idle sessions expire."""

from __future__ import annotations

import signal
from pathlib import Path

import grpc
import pytest

from tests.support.mesh import Mesh, eventually, until
from turnmesh.client import AsyncClient, NotFoundError, UnavailableError
from turnmesh.runtime.serving import insecure_channel
from turnmesh.v1 import event_pb2
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1.router_service_pb2_grpc import RouterServiceStub


def _pid_of(probe_dir: Path, turn_id: str) -> int:
    return int((probe_dir / f"{turn_id}.started").read_text())


async def test_worker_killed_mid_turn(mesh_factory: Mesh) -> None:
    mesh = mesh_factory
    mesh.start_router()
    workers = [mesh.spawn_worker(f"probe-{i}", "probe_agent:ProbeAgent") for i in (1, 2)]
    server = mesh.spawn_server("server")
    mesh.wait_ready(*workers, server)
    by_pid = {w.pid: w for w in workers}

    async with AsyncClient(server.address) as client:
        sid = (await client.create_session(agent="probe")).session_id
        await client.send(sid, "warm up", metadata={"deltas": 1, "delay_ms": 1})
        before = await client.history(sid)

        # Killed after streaming: RUN_ERROR, history unchanged.
        events: list[event_pb2.Event] = []
        async with client.stream_turn(
            sid, "doomed", metadata={"deltas": 1000, "delay_ms": 20}
        ) as stream:
            async for event in stream:
                events.append(event)
                if event.type == event_pb2.TEXT_MESSAGE_CONTENT and len(events) == 3:
                    mesh.kill(by_pid[_pid_of(mesh.probe_dir, event.run_id)])
        assert events[-1].type == event_pb2.RUN_ERROR
        assert events[-1].code == "worker_failed"
        assert "Traceback" not in events[-1].message
        assert await client.history(sid) == before

        # The next turn works, on the surviving worker.
        result = await client.send(sid, "next", metadata={"deltas": 2, "delay_ms": 1})
        assert result.text == "part0 part1 "
        assert len(await client.history(sid)) == len(before) + 2


async def test_worker_killed_before_its_first_event_is_retried(mesh_factory: Mesh) -> None:
    mesh = mesh_factory
    mesh.start_router()
    workers = [mesh.spawn_worker(f"probe-{i}", "probe_agent:ProbeAgent") for i in (1, 2)]
    server = mesh.spawn_server("server")
    mesh.wait_ready(*workers, server)
    by_pid = {w.pid: w for w in workers}

    async with AsyncClient(server.address) as client:
        sid = (await client.create_session(agent="probe")).session_id
        async with client.stream_turn(
            sid, "stall", metadata={"deltas": 3, "delay_ms": 1, "stall_first_attempt": True}
        ) as stream:
            events = []
            async for event in stream:
                events.append(event)
                if event.type == event_pb2.RUN_STARTED:
                    marker = mesh.probe_dir / f"{event.run_id}.started"
                    await until(marker.exists, what="the first worker to start the turn")
                    mesh.kill(by_pid[_pid_of(mesh.probe_dir, event.run_id)])
        assert events[-1].type == event_pb2.RUN_FINISHED
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert len(list(mesh.probe_dir.glob(f"{events[0].run_id}.*.started"))) == 2
        history = await client.history(sid)
        assert [m.content for m in history] == ["stall", "part0 part1 part2 "]


async def test_router_drops_a_killed_server_and_reassigns_its_sessions(
    mesh_factory: Mesh,
) -> None:
    mesh = mesh_factory
    mesh.start_router("--orphan-seconds", "2")
    assert mesh.router is not None
    worker = mesh.spawn_worker("echo", "echo")
    servers = [mesh.spawn_server(f"server-{i}") for i in (1, 2)]
    mesh.wait_ready(worker, *servers)
    survivor, victim = servers

    router = RouterServiceStub(insecure_channel(mesh.router.address))
    async with AsyncClient(survivor.address) as client:
        # Sessions are assigned round-robin: find one owned by the victim.
        owned: dict[str, str] = {}
        for _ in range(4):
            sid = (await client.create_session(agent="echo")).session_id
            route = await router.Route(rpb.RouteRequest(session_id=sid))
            owned[sid] = route.owner.member_id
        lost = [s for s, owner in owned.items() if owner == victim.member_id]
        kept = [s for s, owner in owned.items() if owner == survivor.member_id]
        assert lost
        assert kept

        mesh.kill(victim, signal.SIGKILL)

        async def dropped() -> bool:
            members = await router.ListMembers(rpb.ListMembersRequest())
            return victim.member_id not in {m.member_id for m in members.members}

        await eventually(dropped, what="the router to drop the killed server")

        # A memory store is its server's alone: while the server might come
        # back (it may be stalled, not dead) its sessions answer UNAVAILABLE
        # (retry) and are never given to another server...
        with pytest.raises(UnavailableError):
            await client.get_session(lost[0])
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await router.Route(rpb.RouteRequest(session_id=lost[0]))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE

        # ...until the router gives up on it (--orphan-seconds): then they
        # are gone (NOT_FOUND, never a hang) and their ids free.
        async def forgotten() -> bool:
            try:
                await client.get_session(lost[0])
            except NotFoundError:
                return True
            except UnavailableError:
                return False
            raise AssertionError("a lost session was found")

        await eventually(forgotten, what="the router to forget the dead server's sessions")
        route = await router.Route(rpb.RouteRequest(session_id=lost[0]))
        assert route.owner.member_id == survivor.member_id
        # Sessions of the survivor are untouched; new sessions work.
        result = await client.send(kept[0], "still here")
        assert result.text == "still here"
        fresh = (await client.create_session(agent="echo")).session_id
        assert (await client.send(fresh, "hello")).text == "hello"


async def test_idle_sessions_expire_and_the_router_forgets_them(mesh_factory: Mesh) -> None:
    mesh = mesh_factory
    mesh.start_router()
    assert mesh.router is not None
    worker = mesh.spawn_worker("echo", "echo")
    server = mesh.spawn_server("server", "--session-ttl", "1")
    mesh.wait_ready(worker, server)
    router = RouterServiceStub(insecure_channel(mesh.router.address))

    async with AsyncClient(server.address) as client:
        sid = (await client.create_session(agent="echo")).session_id
        await client.send(sid, "hello")

        async def gone() -> bool:
            try:
                await client.get_session(sid)
            except NotFoundError:
                return True
            return False

        await eventually(gone, what="the idle session to expire")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await router.Route(rpb.RouteRequest(session_id=sid, lookup_only=True))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_grpc_status_codes_for_unknown_session(mesh_factory: Mesh) -> None:
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("echo", "echo")
    server = mesh.spawn_server("server")
    mesh.wait_ready(worker, server)
    async with AsyncClient(server.address) as client:
        with pytest.raises(NotFoundError):
            await client.send("no-such-session", "hi")
        assert await client.delete_session("no-such-session") is False
        with pytest.raises(NotFoundError):
            await client.create_session(agent="nobody-serves-this")
