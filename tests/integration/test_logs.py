"""JSON logs: one object per line, a line per turn with ids, status and
latency, and no message content at INFO."""

from __future__ import annotations

import json

from tests.support.mesh import Mesh
from turnmesh.client import AsyncClient


async def test_json_logs_have_a_line_per_turn_and_no_content(mesh_factory: Mesh) -> None:
    mesh = mesh_factory
    router = mesh.spawn("router", "router", "--log-format", "json")
    mesh.wait_ready(router)
    mesh.router = router
    worker = mesh.spawn(
        "worker", "worker", "--router", router.address, "--agent", "echo", "--log-format", "json"
    )
    server = mesh.spawn("server", "server", "--router", router.address, "--log-format", "json")
    mesh.wait_ready(worker, server)
    secret = "the-users-private-words-42"
    async with AsyncClient(server.address) as client:
        sid = (await client.create_session(agent="echo")).session_id
        result = await client.send(sid, secret)
    mesh.stop()  # flushes and ends the processes: their logs are complete

    records = []
    for component in (router, worker, server):
        for line in component.log().splitlines():
            record = json.loads(line)  # every line is one JSON object
            assert {"timestamp", "level", "component", "logger", "message"} <= set(record)
            records.append(record)
    turns = [r for r in records if r["message"] == "turn ended"]
    assert len(turns) == 1
    turn = turns[0]
    assert turn["component"] == "server"
    assert (turn["session_id"], turn["turn_id"], turn["status"]) == (
        sid,
        result.turn_id,
        "finished",
    )
    assert turn["latency_ms"] > 0
    assert secret not in server.log()
    assert secret not in worker.log()


async def test_debug_logs_show_the_bodies(mesh_factory: Mesh) -> None:
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("worker", "echo")
    server = mesh.spawn_server("server", "--log-format", "json", "--log-level", "DEBUG")
    mesh.wait_ready(worker, server)
    words = "words-only-a-debug-log-may-show"
    async with AsyncClient(server.address) as client:
        sid = (await client.create_session(agent="echo")).session_id
        await client.send(sid, words)
    mesh.stop()
    debug = [
        record
        for record in map(json.loads, server.log().splitlines())
        if record["level"] == "DEBUG" and words in record["message"]
    ]
    assert debug, "the DEBUG log should carry the turn's messages"


async def test_one_request_id_in_the_access_log_the_problem_and_the_turns_log_line(
    mesh_factory: Mesh,
) -> None:
    import httpx

    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("worker", "echo")
    first = mesh.spawn_server("server-1", "--log-format", "json")
    second = mesh.spawn_server("server-2", "--log-format", "json")
    mesh.wait_ready(worker, first, second)
    envoy = mesh.start_envoy([first, second])
    async with httpx.AsyncClient(base_url=f"http://{envoy.listener_address}", timeout=60) as rest:
        created = await rest.post("/v1/sessions", json={"agentName": "echo"})
        sid = created.json()["session"]["sessionId"]
        turn = await rest.post(f"/v1/sessions/{sid}/turns", json={"message": "hi"})
        turn_request = turn.headers["x-request-id"]
        blank = await rest.post(f"/v1/sessions/{sid}/turns", json={"message": "  "})
        problem = blank.json()
        assert problem["instance"] == blank.headers["x-request-id"]
        refused = await rest.post("/v1/sessions", content=b"{oops")  # Envoy's own reply
        assert refused.status_code == 400
        assert refused.json()["instance"] == refused.headers["x-request-id"]
    # A turn sent through either server (one of them forwards it to the
    # session's owner) logs the id of the call that started it.
    ids = []
    for n, server in enumerate((first, second)):
        ids.append(f"forwarded-or-not-{n}")
        async with AsyncClient(server.address, metadata=[("x-request-id", ids[-1])]) as client:
            await client.send(sid, "again")
    mesh.stop()
    turns = [
        json.loads(line)
        for server in (first, second)
        for line in server.log().splitlines()
        if '"turn ended"' in line
    ]
    assert sorted(t["request_id"] for t in turns) == sorted([turn_request, *ids])
    access_log = (mesh.workdir / "envoy.log").read_text()
    for request_id in (turn_request, problem["instance"]):
        assert f"rid={request_id}" in access_log
