"""Operating the edge: health-checked upstreams, keepalives on silent turns,
the access log."""

from __future__ import annotations

import asyncio
import json
import signal

import httpx
from httpx_sse import aconnect_sse

from tests.conftest import SharedMesh
from tests.support.mesh import Component, Mesh, until
from turnmesh.client import AsyncClient
from turnmesh.envoy.process import RunningEnvoy
from turnmesh.runtime.serving import insecure_channel
from turnmesh.server.compat.areal_ws import gateway
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1.router_service_pb2_grpc import RouterServiceStub


def _unhealthy_hosts(envoy: RunningEnvoy) -> set[str]:
    clusters = json.loads(envoy.admin("/clusters?format=json"))
    hosts = clusters["cluster_statuses"][0]["host_statuses"]
    return {
        f"{h['address']['socket_address']['address']}:{h['address']['socket_address']['port_value']}"
        for h in hosts
        if h["health_status"].get("failed_active_health_check")
    }


async def _ws_ready(server: Component) -> int:
    """What the server's /ws listener answers the edge's health check."""
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"http://{server.info['ws_address']}{gateway.HEALTH_PATH}")
    return answer.status_code


async def test_a_draining_server_gets_no_new_calls(mesh_factory: Mesh) -> None:
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("probe", "probe_agent:ProbeAgent")
    servers = [
        mesh.spawn_server(f"server-{i}", "--grace-seconds", "30", "--ws-port", "0") for i in (1, 2)
    ]
    mesh.wait_ready(worker, *servers)
    envoy = mesh.start_envoy(servers)
    draining, other = servers
    assert await _ws_ready(draining) == await _ws_ready(other) == 200

    assert mesh.router is not None
    router = RouterServiceStub(insecure_channel(mesh.router.address))
    async with AsyncClient(draining.address) as direct:
        # A long turn on a session the draining server owns keeps it draining.
        while True:
            sid = (await direct.create_session(agent="probe")).session_id
            route = await router.Route(rpb.RouteRequest(session_id=sid, lookup_only=True))
            if route.owner.member_id == draining.member_id:
                break
        async with direct.stream_turn(
            sid, "long", metadata={"deltas": 200, "delay_ms": 50}
        ) as stream:
            async for event in stream:
                if event.delta:
                    break
        draining.proc.send_signal(signal.SIGTERM)
        await until(lambda: draining.address in _unhealthy_hosts(envoy), what="health check")

        async with httpx.AsyncClient(base_url=f"http://{envoy.listener_address}") as rest:
            for _ in range(10):
                response = await rest.post("/v1/sessions", json={"agentName": "probe"})
                assert response.status_code == 200, response.text
        assert other.address not in _unhealthy_hosts(envoy)
        # Its /ws listener says so too: the edge sends it no new sockets.
        assert (await _ws_ready(draining), await _ws_ready(other)) == (503, 200)
        assert draining.proc.poll() is None, "still draining its turn"
        await direct.cancel_turn(sid, event.run_id)


async def test_silent_turns_get_keepalive_events_over_sse(mesh_factory: Mesh) -> None:
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("probe", "probe_agent:ProbeAgent")
    server = mesh.spawn_server("server", "--keepalive", "0.2")
    mesh.wait_ready(worker, server)
    envoy = mesh.start_envoy([server])
    async with httpx.AsyncClient(base_url=f"http://{envoy.listener_address}", timeout=30) as rest:
        sid = (await rest.post("/v1/sessions", json={"agentName": "probe"})).json()["session"][
            "sessionId"
        ]
        body = {"message": "quiet", "metadata": {"deltas": 2, "delay_ms": 1000}}
        async with aconnect_sse(rest, "POST", f"/v1/sessions/{sid}/turns", json=body) as source:
            events = [json.loads(sse.data) async for sse in source.aiter_sse()]
    keepalives = [e for e in events if e["type"] == "CUSTOM"]
    assert keepalives
    assert all(e["name"] == "keepalive" and e["value"] == {} for e in keepalives)
    assert all("seq" not in e for e in keepalives)  # seq 0: not part of the turn's log
    numbered = [e["seq"] for e in events if e["type"] != "CUSTOM"]
    assert numbered == list(range(1, len(numbered) + 1))
    assert events[-1]["type"] == "RUN_FINISHED"


async def test_access_log_has_the_original_method_and_path(
    shared_mesh: SharedMesh, rest: httpx.AsyncClient
) -> None:
    sid = (await rest.post("/v1/sessions", json={})).json()["session"]["sessionId"]
    await rest.get(f"/v1/sessions/{sid}/history")
    log = shared_mesh.mesh.workdir / "envoy.log"
    expected = f'"GET /v1/sessions/{sid}/history HTTP/1.1" 200 grpc=OK'
    await until(lambda: expected in log.read_text(), what="the access log line")


def _health_check_failures(envoy: RunningEnvoy) -> int:
    stats = envoy.admin("/stats?filter=^cluster.session_servers.health_check.failure$")
    return int(stats.split(":")[1]) if ":" in stats else 0


async def test_one_missed_health_check_does_not_remove_the_only_server(
    mesh_factory: Mesh,
) -> None:
    """A saturated server may answer a health check late. Frozen (SIGSTOP)
    until Envoy has counted a failed check, the only server stays in the
    cluster, and the call sent meanwhile is served once it answers again:
    no 503 "no healthy upstream"."""
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("echo", "echo")
    server = mesh.spawn_server("server")
    mesh.wait_ready(worker, server)
    envoy = mesh.start_envoy([server])
    async with httpx.AsyncClient(base_url=f"http://{envoy.listener_address}", timeout=120) as rest:
        created = await rest.post("/v1/sessions", json={"agentName": "echo"})
        assert created.status_code == 200
        failures = _health_check_failures(envoy)
        server.proc.send_signal(signal.SIGSTOP)
        try:
            await until(
                lambda: _health_check_failures(envoy) > failures,
                timeout=120,
                what="a failed health check",
            )
            assert server.address not in _unhealthy_hosts(envoy)
            pending = asyncio.ensure_future(rest.post("/v1/sessions", json={"agentName": "echo"}))
        finally:
            server.proc.send_signal(signal.SIGCONT)
        response = await pending
        assert response.status_code == 200, response.text
        assert server.address not in _unhealthy_hosts(envoy)
