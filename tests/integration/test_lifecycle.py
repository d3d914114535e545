"""Health, readiness and the drain on SIGTERM."""

from __future__ import annotations

import re
import signal
from typing import TYPE_CHECKING

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.mesh import Mesh, eventually, until
from turnmesh.client import AsyncClient, UnavailableError
from turnmesh.runtime.serving import insecure_channel
from turnmesh.v1 import event_pb2
from turnmesh.v1 import session_service_pb2 as spb
from turnmesh.v1.session_service_pb2_grpc import SessionServiceStub

if TYPE_CHECKING:
    from turnmesh.v1.session_service_pb2_grpc import SessionServiceAsyncStub


async def test_server_is_not_ready_until_a_worker_is_known(mesh_factory: Mesh) -> None:
    mesh = mesh_factory
    mesh.start_router()
    server = mesh.spawn_server("server")
    found: list[str] = []

    def listening() -> bool:
        found[:] = re.findall(r"listening on (\S+)", server.log())
        return bool(found)

    await until(listening, what="the server to bind")
    async with insecure_channel(found[0]) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        stub = SessionServiceStub(channel)
        reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetReadiness(spb.GetReadinessRequest())
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        starting = await stub.GetHealth(spb.GetHealthRequest())
        assert starting.status == spb.LIFECYCLE_STATE_INITIALIZING
        assert not starting.agent_ready

        worker = mesh.spawn_worker("demo", "demo")
        mesh.wait_ready(worker, server)
        reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert (await stub.GetReadiness(spb.GetReadinessRequest())).ready
        info_reply = await stub.GetHealth(spb.GetHealthRequest())
        assert info_reply.status == spb.LIFECYCLE_STATE_READY
        assert info_reply.agent_name == "demo"
        assert info_reply.agent_ready
        assert info_reply.server_id == server.member_id
        assert info_reply.uptime_seconds > 0


async def test_sigterm_drains_in_flight_turns(mesh_factory: Mesh) -> None:
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("echo", "echo")
    server = mesh.spawn_server("server")
    mesh.wait_ready(worker, server)
    async with AsyncClient(server.address) as client:
        sid = (await client.create_session(agent="echo")).session_id
        events: list[event_pb2.Event] = []
        async with client.stream_turn(
            sid, "one two three four five six", metadata={"delay_ms": 100}
        ) as stream:
            async for event in stream:
                events.append(event)
                if event.type == event_pb2.TEXT_MESSAGE_CONTENT and len(events) == 3:
                    server.proc.send_signal(signal.SIGTERM)
                    async with insecure_channel(server.address) as channel:
                        stub = SessionServiceStub(channel)

                        async def draining(stub: SessionServiceAsyncStub = stub) -> bool:
                            reply = await stub.GetHealth(spb.GetHealthRequest())
                            return reply.status == spb.LIFECYCLE_STATE_SHUTTING_DOWN

                        await eventually(draining, what="the server to start draining")
                        with pytest.raises(grpc.aio.AioRpcError) as info:
                            await stub.GetReadiness(spb.GetReadinessRequest())
                        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
                        # A new turn is refused while draining.
                        with pytest.raises(UnavailableError):
                            await client.send(sid, "too late")
        assert events[-1].type == event_pb2.RUN_FINISHED
        text = "".join(e.delta for e in events if e.type == event_pb2.TEXT_MESSAGE_CONTENT)
        assert text == "one two three four five six"
    assert server.proc.wait(timeout=30) == 0
