"""A full server refuses new work before any stream starts: 429 with Retry-After."""

from __future__ import annotations

import httpx
import pytest

from tests.support.mesh import Mesh, eventually
from turnmesh.client import AsyncClient, TurnmeshClientError
from turnmesh.v1 import event_pb2


async def test_turns_and_sessions_over_the_limits_are_refused(mesh_factory: Mesh) -> None:
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("probe", "probe_agent:ProbeAgent")
    server = mesh.spawn_server("server", "--max-turns", "1", "--max-sessions", "3")
    mesh.wait_ready(worker, server)
    envoy = mesh.start_envoy([server])
    async with AsyncClient(server.address) as client:
        busy = (await client.create_session(agent="probe")).session_id
        other = (await client.create_session(agent="probe")).session_id
        async with client.stream_turn(busy, "slow", metadata={"deltas": 1000, "delay_ms": 20}) as s:
            async for event in s:
                if event.type == event_pb2.TEXT_MESSAGE_CONTENT:
                    # One turn runs: a turn on another session is refused up front.
                    with pytest.raises(TurnmeshClientError) as info:
                        await client.send(other, "hi")
                    assert info.value.code is not None
                    assert info.value.code.name == "RESOURCE_EXHAUSTED"
                    async with httpx.AsyncClient(
                        base_url=f"http://{envoy.listener_address}"
                    ) as rest:
                        response = await rest.post(
                            f"/v1/sessions/{other}/turns", json={"message": "hi"}
                        )
                        assert response.status_code == 429
                        assert response.headers["retry-after"] == "1"
                        assert response.headers["content-type"] == "application/problem+json"
                    await client.cancel_turn(busy, event.run_id)
                    break

        async def freed() -> bool:
            return (await client.health()).running_turns == 0

        await eventually(freed, what="the cancelled turn to end")
        # The limit freed, the other session works, and nothing changed before.
        assert await client.history(other) == []
        assert (await client.send(other, "hi", metadata={"deltas": 1, "delay_ms": 1})).text
        await client.create_session(agent="probe")
        with pytest.raises(TurnmeshClientError) as info:
            await client.create_session(agent="probe")
        assert info.value.code is not None
        assert info.value.code.name == "RESOURCE_EXHAUSTED"


async def test_the_compatibility_surfaces_answer_a_full_server_with_429(
    mesh_factory: Mesh,
) -> None:
    """The limits reach every surface as 429 with Retry-After (they were 500)."""
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("echo", "echo")
    server = mesh.spawn_server("server", "--agent", "echo", "--max-sessions", "1")
    mesh.wait_ready(worker, server)
    envoy = mesh.start_envoy([server])
    async with AsyncClient(server.address) as client:
        await client.create_session()
    user = [{"role": "user", "content": "hi"}]
    async with httpx.AsyncClient(base_url=f"http://{envoy.listener_address}") as rest:
        chat = await rest.post("/v1/chat/completions", json={"model": "echo", "messages": user})
        responses = await rest.post("/v1/responses", json={"model": "echo", "input": "hi"})
        for response in (chat, responses):
            assert response.status_code == 429, response.text
            assert response.headers["retry-after"] == "1"
            error = response.json()["error"]
            assert error["type"] == "rate_limit_error"
            assert error["code"] == "resource_exhausted"
        agui = await rest.post(
            "/v1/agui",
            json={"threadId": "t", "messages": [{"id": "1", "role": "user", "content": "hi"}]},
        )
        simple = await rest.post("/v1/chat", json={"message": "hi"})
        for response in (agui, simple):
            assert response.status_code == 429, response.text
            assert response.headers["retry-after"] == "1"
            assert response.json()["type"] == "https://turnmesh.dev/problems/resource-exhausted"
