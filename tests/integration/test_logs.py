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
