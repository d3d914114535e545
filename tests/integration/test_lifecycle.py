"""Health, readiness and the drain on SIGTERM."""

from __future__ import annotations

import re
import signal
from typing import TYPE_CHECKING

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.support.mesh import Mesh, eventually, until
from turnmesh.client import AsyncClient, UnavailableError
from turnmesh.runtime.serving import insecure_channel
from turnmesh.server.workers.readiness import AGENT_HEALTH_SERVICE
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


def _relayed_events(worker_metrics: str) -> float:
    text = httpx.get(f"http://{worker_metrics}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "turnmesh_worker_relayed_events_total"
    )


async def test_a_worker_drains_relayed_turns_then_ends_its_relays(mesh_factory: Mesh) -> None:
    """A server's relay never ends by itself: a stopping worker ends it once
    its turns have, instead of waiting out its grace (600 s here). With the
    router gone, the server cannot learn that the worker left (which would
    close its channel): only the worker can end the relay."""
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn(
        "worker",
        "worker",
        "--router",
        mesh.router.address if mesh.router else "",
        "--agent",
        "echo",
        "--metrics-port",
        "0",
        "--grace-seconds",
        "600",
    )
    server = mesh.spawn_server("server")
    mesh.wait_ready(worker, server)
    metrics_address = str(worker.info["metrics_address"])
    async with AsyncClient(server.address) as client:
        sid = (await client.create_session(agent="echo")).session_id

        async def relayed() -> bool:
            # The server opens its relay with its first turn there; a turn
            # streams on its own call until the relay is open.
            await client.send(sid, "warm up")
            return _relayed_events(metrics_address) > 0

        await eventually(relayed, what="turns to go through the server's relay")
        assert mesh.router is not None
        mesh.router.proc.kill()
        mesh.router.proc.wait(timeout=30)
        before = _relayed_events(metrics_address)
        events: list[event_pb2.Event] = []
        async with client.stream_turn(
            sid, "one two three four five six", metadata={"delay_ms": 100}
        ) as stream:
            async for event in stream:
                events.append(event)
                if event.type == event_pb2.TEXT_MESSAGE_CONTENT and len(events) == 3:
                    # This turn's events so far came through the relay.
                    assert _relayed_events(metrics_address) - before >= 2
                    worker.proc.send_signal(signal.SIGTERM)
    assert events[-1].type == event_pb2.RUN_FINISHED
    text = "".join(e.delta for e in events if e.type == event_pb2.TEXT_MESSAGE_CONTENT)
    assert text == "one two three four five six"
    # Far less than the 600 s grace: the relay ended when the turn did.
    assert worker.proc.wait(timeout=60) == 0


async def test_readiness_follows_the_default_agents_workers(mesh_factory: Mesh) -> None:
    """With the only worker of the default agent gone, the edge's /ready and
    /v1/chat/health say so and every surface answers 503 NO_LIVE_WORKER with
    Retry-After; the server itself stays SERVING for Envoy (reads go on), and
    readiness comes back with a worker."""
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("demo", "demo")
    server = mesh.spawn_server("server")
    mesh.wait_ready(worker, server)
    envoy = mesh.start_envoy([server])
    async with (
        httpx.AsyncClient(base_url=f"http://{envoy.listener_address}", timeout=30) as rest,
        insecure_channel(server.address) as channel,
    ):
        health = health_pb2_grpc.HealthStub(channel)

        async def agent_health() -> int:
            request = health_pb2.HealthCheckRequest(service=AGENT_HEALTH_SERVICE)
            return int((await health.Check(request)).status)

        assert await agent_health() == health_pb2.HealthCheckResponse.SERVING
        session = (await rest.post("/v1/sessions", json={})).json()["session"]["sessionId"]
        mesh.kill(worker)

        async def withdrawn() -> bool:
            return (await rest.get("/ready")).status_code == 503

        await eventually(withdrawn, timeout=60, what="readiness to be withdrawn")
        ready = await rest.get("/ready")
        assert ready.json()["reason"] == "NO_LIVE_WORKER"
        assert ready.headers["retry-after"] == "5"
        chat_health = (await rest.get("/v1/chat/health")).json()
        assert chat_health["status"] == "unhealthy"
        assert chat_health.get("agent_ready", False) is False
        # Envoy still routes to the server: reads are answered.
        assert (await health.Check(health_pb2.HealthCheckRequest())).status == (
            health_pb2.HealthCheckResponse.SERVING
        )
        assert await agent_health() == health_pb2.HealthCheckResponse.NOT_SERVING
        assert (await rest.get(f"/v1/sessions/{session}")).status_code == 200
        # A known agent without a live worker is unavailable, not unknown.
        refusals = [
            await rest.post("/v1/sessions", json={}),
            await rest.post(f"/v1/sessions/{session}/turns", json={"message": "hi"}),
            await rest.post("/v1/chat", json={"message": "hi"}),
        ]
        for refused in refusals:
            assert refused.status_code == 503, refused.text
            assert refused.json()["reason"] == "NO_LIVE_WORKER"
            assert refused.headers["retry-after"] == "5"
        openai = await rest.post(
            "/v1/chat/completions",
            json={"model": "demo", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert openai.status_code == 503
        assert openai.json()["error"]["code"] == "no_live_worker"
        assert openai.headers["retry-after"] == "5"
        unknown = await rest.post("/v1/sessions", json={"agentName": "nobody"})
        assert unknown.status_code == 404

        mesh.wait_ready(mesh.spawn_worker("demo-again", "demo"))

        async def restored() -> bool:
            return (await rest.get("/ready")).status_code == 200

        await eventually(restored, timeout=60, what="readiness to come back")
        assert (await rest.get("/v1/chat/health")).json()["status"] == "healthy"
        assert await agent_health() == health_pb2.HealthCheckResponse.SERVING
        turn = await rest.post(f"/v1/sessions/{session}/turns", json={"message": "hi"})
        assert turn.status_code == 200, turn.text
