"""RouterService over a real in-process grpc.aio server with the real interceptors."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from turnmesh.router.app import SERVICE_NAME, RouterConfig, build_process, serve
from turnmesh.router.state import RouterState
from turnmesh.runtime.interceptors import MESH_KEY_METADATA
from turnmesh.runtime.serving import insecure_channel
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1.router_service_pb2_grpc import RouterServiceStub

if TYPE_CHECKING:
    from turnmesh.v1.router_service_pb2_grpc import RouterServiceAsyncStub

MESH_KEY = "s3cret"
KEY = ((MESH_KEY_METADATA, MESH_KEY),)


class FakeClock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Router:
    stub: RouterServiceAsyncStub
    state: RouterState
    clock: FakeClock


@asynccontextmanager
async def _start(mesh_key: str | None) -> AsyncIterator[Router]:
    config = RouterConfig(mesh_key=mesh_key, heartbeat_interval=0.5, heartbeat_timeout=2.0)
    clock = FakeClock()
    state = RouterState(config.heartbeat_timeout, clock=clock)
    process = build_process(config, state)
    await process.start()
    await process.set_serving(True)
    channel = insecure_channel(process.address)
    try:
        yield Router(RouterServiceStub(channel), state, clock)
    finally:
        await channel.close()
        await process.stop(0)


@pytest.fixture
async def router() -> AsyncIterator[Router]:
    async with _start(None) as r:
        yield r


@pytest.fixture
async def keyed_router() -> AsyncIterator[Router]:
    async with _start(MESH_KEY) as r:
        yield r


def server_member(member_id: str, port: int = 7001) -> rpb.Member:
    return rpb.Member(
        member_id=member_id,
        role=rpb.MEMBER_ROLE_SERVER,
        address=f"127.0.0.1:{port}",
        accepting=True,
        shared_store=True,
    )


def worker_member(member_id: str, agent: str) -> rpb.Member:
    return rpb.Member(
        member_id=member_id,
        role=rpb.MEMBER_ROLE_WORKER,
        address="127.0.0.1:7100",
        agent_name=agent,
        accepting=True,
    )


def field_violations(err: grpc.aio.AioRpcError) -> list[tuple[str, str]]:
    """The google.rpc.BadRequest violations from the status details trailer."""
    raw = dict(err.trailing_metadata() or ())["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(raw)
    assert status.code == err.code().value[0]
    for detail in status.details:
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            return [(v.field, v.description) for v in bad.field_violations]
    raise AssertionError("no BadRequest detail")


async def test_register_heartbeat_route_list(router: Router) -> None:
    stub = router.stub
    response = await stub.Register(rpb.RegisterRequest(member=server_member("s-a", 7001)))
    assert response.member.member_id == "s-a"
    assert response.member.registered_at.seconds > 0
    assert response.heartbeat_interval.ToTimedelta().total_seconds() == 0.5
    assert response.heartbeat_timeout.ToTimedelta().total_seconds() == 2.0
    await stub.Register(rpb.RegisterRequest(member=server_member("s-b", 7002)))
    await stub.Register(rpb.RegisterRequest(member=worker_member("w-1", "demo")))

    await stub.Heartbeat(rpb.HeartbeatRequest(member_id="w-1", inflight_turns=3, accepting=True))

    first = await stub.Route(rpb.RouteRequest(session_id="sess-1"))
    assert (first.owner.member_id, first.owner.address, first.assigned) == (
        "s-a",
        "127.0.0.1:7001",
        True,
    )
    again = await stub.Route(rpb.RouteRequest(session_id="sess-1"))
    assert (again.owner.member_id, again.assigned) == ("s-a", False)
    second = await stub.Route(rpb.RouteRequest(session_id="sess-2"))
    assert second.owner.member_id == "s-b"

    moved = await stub.Route(rpb.RouteRequest(session_id="sess-1", unreachable_member_ids=["s-a"]))
    assert (moved.owner.member_id, moved.assigned) == ("s-b", True)

    listed = await stub.ListMembers(rpb.ListMembersRequest())
    assert [m.member_id for m in listed.members] == ["s-b", "w-1"]
    workers = await stub.ListMembers(
        rpb.ListMembersRequest(role=rpb.MEMBER_ROLE_WORKER, agent_name="demo")
    )
    assert [(m.member_id, m.inflight_turns) for m in workers.members] == [("w-1", 3)]
    assert (await stub.ListMembers(rpb.ListMembersRequest(agent_name="other"))).members == []

    await stub.RemoveSession(rpb.RemoveSessionRequest(session_id="sess-2"))
    await stub.Unregister(rpb.UnregisterRequest(member_id="w-1"))
    await stub.Unregister(rpb.UnregisterRequest(member_id="w-1"))  # idempotent
    servers = await stub.ListMembers(rpb.ListMembersRequest(role=rpb.MEMBER_ROLE_SERVER))
    assert [m.member_id for m in servers.members] == ["s-b"]


async def test_heartbeat_of_unknown_member_is_not_found(router: Router) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await router.stub.Heartbeat(rpb.HeartbeatRequest(member_id="ghost"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert info.value.details() == "unknown member; register again"


async def test_heartbeat_after_expiry_is_not_found(router: Router) -> None:
    await router.stub.Register(rpb.RegisterRequest(member=server_member("s-a")))
    router.clock.now += 2.5
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await router.stub.Heartbeat(rpb.HeartbeatRequest(member_id="s-a", accepting=True))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_bad_register_is_invalid_argument_with_field_violations(router: Router) -> None:
    bad = rpb.Member(member_id="s-a", role=rpb.MEMBER_ROLE_SERVER)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await router.stub.Register(rpb.RegisterRequest(member=bad))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field_violations(info.value) == [("member.address", "required")]

    with pytest.raises(grpc.aio.AioRpcError) as info:
        await router.stub.Register(rpb.RegisterRequest(member=rpb.Member(address="nohost")))
    assert field_violations(info.value) == [
        ("member.member_id", "required"),
        ("member.role", "must be SERVER or WORKER"),
        ("member.address", "must be host:port"),
    ]

    lazy_worker = rpb.Member(member_id="w", role=rpb.MEMBER_ROLE_WORKER, address="h:1")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await router.stub.Register(rpb.RegisterRequest(member=lazy_worker))
    assert field_violations(info.value) == [("member.agent_name", "required for workers")]


async def test_invalid_argument_readable_with_grpc_status(router: Router) -> None:
    call = router.stub.Route(rpb.RouteRequest(session_id="has spaces"))
    with pytest.raises(grpc.aio.AioRpcError):
        await call
    status = await rpc_status.aio.from_call(call)
    assert status is not None
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    assert bad.field_violations[0].field == "session_id"


async def test_route_without_servers_is_unavailable(router: Router) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await router.stub.Route(rpb.RouteRequest(session_id="sess"))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert info.value.details() == "no live session server"


async def test_mesh_key_guards_every_method(keyed_router: Router) -> None:
    stub = keyed_router.stub
    request = rpb.RegisterRequest(member=server_member("s-a"))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Register(request)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Register(request, metadata=((MESH_KEY_METADATA, "wrong"),))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED

    await stub.Register(request, metadata=KEY)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Route(rpb.RouteRequest(session_id="sess"))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert (await stub.Route(rpb.RouteRequest(session_id="sess"), metadata=KEY)).assigned

    # Who is where is for the mesh only, as is reporting sessions.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ListMembers(rpb.ListMembersRequest())
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ReportSessions(rpb.ReportSessionsRequest(member_id="s-a", session_ids=["x"]))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    listed = await stub.ListMembers(rpb.ListMembersRequest(), metadata=KEY)
    assert [m.member_id for m in listed.members] == ["s-a"]


async def test_report_sessions_in_pages(router: Router) -> None:
    stub = router.stub
    await stub.Register(rpb.RegisterRequest(member=server_member("s-a", 7001)))
    await stub.Register(rpb.RegisterRequest(member=server_member("s-b", 7002)))
    await stub.ReportSessions(
        rpb.ReportSessionsRequest(member_id="s-b", session_ids=[f"s{i}" for i in range(10_000)])
    )
    for session_id in ("s0", "s9999"):
        route = await stub.Route(rpb.RouteRequest(session_id=session_id, lookup_only=True))
        assert route.owner.member_id == "s-b"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ReportSessions(
            rpb.ReportSessionsRequest(member_id="s-b", session_ids=["x"] * 10_001)
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ReportSessions(rpb.ReportSessionsRequest(member_id="s-b", session_ids=["a b"]))
    assert field_violations(info.value) == [
        ("session_ids[0]", "must be a session id, scoped (PRINCIPAL/ID) or not")
    ]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ReportSessions(rpb.ReportSessionsRequest(member_id="ghost", session_ids=["x"]))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_serve_announces_address_and_stops_on_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "router.json"
    config = RouterConfig(mesh_key=MESH_KEY, ready_file=str(ready), grace_seconds=0)
    task = asyncio.create_task(serve(config))
    async with asyncio.timeout(10):
        while not ready.exists():
            assert not task.done(), task
            await asyncio.sleep(0.02)
    address = json.loads(ready.read_text())["address"]
    channel = insecure_channel(address)
    try:
        health = health_pb2_grpc.HealthStub(channel)
        check = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
        assert check.status == health_pb2.HealthCheckResponse.SERVING
        stub = RouterServiceStub(channel)
        await stub.Register(rpb.RegisterRequest(member=server_member("s-a")), metadata=KEY)
    finally:
        await channel.close()
    # serve() installed its handler before the ready file could be observed.
    os.kill(os.getpid(), signal.SIGTERM)
    async with asyncio.timeout(10):
        await task
