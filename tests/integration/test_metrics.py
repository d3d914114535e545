"""Prometheus metrics on each component's metrics port."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.mesh import Mesh
from turnmesh.client import AsyncClient


def _samples(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"http://{address}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_components_expose_turn_and_mesh_metrics(mesh_factory: Mesh) -> None:
    mesh = mesh_factory
    router = mesh.spawn(
        "router",
        "router",
        "--metrics-port",
        "0",
        "--heartbeat-interval",
        "0.3",
        "--heartbeat-timeout",
        "1.5",
    )
    mesh.wait_ready(router)
    mesh.router = router
    worker = mesh.spawn(
        "worker", "worker", "--router", router.address, "--agent", "echo", "--metrics-port", "0"
    )
    server = mesh.spawn("server", "server", "--router", router.address, "--metrics-port", "0")
    mesh.wait_ready(worker, server)
    async with AsyncClient(server.address) as client:
        sid = (
            await client.create_session(
                agent="echo",
            )
        ).session_id
        for _ in range(3):
            await client.send(sid, "hello there", policy="enqueue")

    s = _samples(str(server.info["metrics_address"]))
    assert s[("turnmesh_turns_total", (("outcome", "finished"), ("policy", "enqueue")))] == 3
    assert s[("turnmesh_turn_duration_seconds_count", ())] == 3
    assert s[("turnmesh_time_to_first_event_seconds_count", ())] == 3
    assert s[("turnmesh_turns_in_flight", ())] == 0
    assert s[("turnmesh_active_sessions", ())] == 1
    assert s[("turnmesh_store_operation_seconds_count", (("operation", "commit_turn"),))] == 3
    # The event loop's lag is watched (a stalled loop delays every caller).
    assert 0 <= s[("turnmesh_event_loop_lag_seconds", ())] < 60
    # No series per principal unless asked (--metrics-principal-label).
    assert not any(name.startswith("turnmesh_principal_turns") for name, _ in s)

    w = _samples(str(worker.info["metrics_address"]))
    assert w[("turnmesh_worker_runs_total", (("outcome", "finished"),))] == 3

    r = _samples(str(router.info["metrics_address"]))
    assert r[("turnmesh_router_members", (("role", "server"),))] == 1
    assert r[("turnmesh_router_members", (("role", "worker"),))] == 1
