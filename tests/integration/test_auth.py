"""Public API keys: required everywhere but health, reloadable, never echoed;
they never open a mesh-internal RPC."""

from __future__ import annotations

import hashlib
from pathlib import Path

import grpc
import httpx
import openai
import pytest

from tests.support.mesh import Mesh, eventually, start_keyed_mesh
from turnmesh.client import AsyncClient, UnauthenticatedError
from turnmesh.runtime.serving import insecure_channel
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1.router_service_pb2_grpc import RouterServiceStub

KEY = "tm-public-key-0123456789abcdef"
MESH_KEY = "tm-mesh-key-fedcba9876543210"


@pytest.fixture
def keyed_mesh(mesh_factory: Mesh, tmp_path: Path) -> tuple[Mesh, str, Path]:
    keys = tmp_path / "api-keys"
    stored = hashlib.sha256(KEY.encode()).hexdigest()
    keys.write_text(f"# the public keys, stored as hashes\nsha256:{stored}\n")
    mesh = mesh_factory
    servers = start_keyed_mesh(mesh, keys, MESH_KEY)
    envoy = mesh.start_envoy(servers)
    return mesh, envoy.listener_address, keys


async def test_rest_and_grpc_need_a_key(keyed_mesh: tuple[Mesh, str, Path]) -> None:
    mesh, edge, _ = keyed_mesh
    async with httpx.AsyncClient(base_url=f"http://{edge}") as rest:
        for headers in ({}, {"Authorization": "Bearer wrong-key"}, {"Authorization": KEY}):
            response = await rest.post("/v1/sessions", json={}, headers=headers)
            assert response.status_code == 401
            assert response.headers["content-type"] == "application/problem+json"
            assert response.headers["www-authenticate"].startswith("Bearer")
            assert "wrong-key" not in response.text
        # Health and readiness stay open, HoloDeck's health shape too.
        assert (await rest.get("/health")).status_code == 200
        assert (await rest.get("/ready")).status_code == 200
        assert (await rest.get("/v1/chat/health")).json()["status"] == "healthy"
        ok = await rest.post("/v1/sessions", json={}, headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200
        sid = ok.json()["session"]["sessionId"]

    async with AsyncClient(edge) as anonymous:
        with pytest.raises(UnauthenticatedError):
            await anonymous.history(sid)
    # A session on either server, reached through the other: forwarding keeps the key.
    for server in mesh.components[-2:]:
        async with AsyncClient(server.address, api_key=KEY) as client:
            assert "42" in (await client.send(sid, "What is 6*7?")).text

    log_text = "".join(c.log() for c in mesh.components)
    assert KEY not in log_text
    assert "wrong-key" not in log_text


async def test_health_shows_the_meshs_counts_only_to_a_caller_with_a_key(
    keyed_mesh: tuple[Mesh, str, Path],
) -> None:
    """Health stays open, but how many sessions and turns the mesh holds
    (every tenant's activity) is for a caller with a key."""
    _, edge, _ = keyed_mesh
    key = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=f"http://{edge}") as rest:
        made = await rest.post("/v1/sessions", json={}, headers=key)
        assert made.status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong-key"}):
            outside = (await rest.get("/health", headers=headers)).json()
            assert outside["status"] in ("LIFECYCLE_STATE_READY", "LIFECYCLE_STATE_RUNNING")
            assert (outside["activeSessions"], outside["runningTurns"]) == (0, 0)
            assert int(outside["sessionsAvailable"]) == 0
            chat = (await rest.get("/v1/chat/health", headers=headers)).json()
            assert (chat["status"], chat["active_sessions"]) == ("healthy", 0)
        # Sessions live on either server: a known caller sees some on one.
        seen = [(await rest.get("/health", headers=key)).json()["activeSessions"] for _ in range(8)]
        assert max(seen) >= 1
        inside = (await rest.get("/health", headers=key)).json()
        assert int(inside["sessionsAvailable"]) > 0
        chat = (await rest.get("/v1/chat/health", headers=key)).json()
        assert chat["active_sessions"] >= 0


def test_the_openai_sdk_uses_its_api_key(keyed_mesh: tuple[Mesh, str, Path]) -> None:
    _, edge, _ = keyed_mesh
    messages = [{"role": "user", "content": "What is 6*7?"}]
    with openai.OpenAI(base_url=f"http://{edge}/v1", api_key=KEY, max_retries=0) as sdk:
        answer = sdk.chat.completions.create(model="demo", messages=messages)  # type: ignore[arg-type]
        assert "42" in (answer.choices[0].message.content or "")
    with (
        openai.OpenAI(base_url=f"http://{edge}/v1", api_key="nope", max_retries=0) as sdk,
        pytest.raises(openai.AuthenticationError),
    ):
        sdk.chat.completions.create(model="demo", messages=messages)  # type: ignore[arg-type]


async def test_keys_reload_without_a_restart(keyed_mesh: tuple[Mesh, str, Path]) -> None:
    _, edge, keys = keyed_mesh
    new_key = "tm-rotated-key-42"
    keys.write_text(keys.read_text() + new_key + "\n")

    async def accepted() -> bool:
        async with httpx.AsyncClient(base_url=f"http://{edge}") as rest:
            response = await rest.post(
                "/v1/sessions", json={}, headers={"Authorization": f"Bearer {new_key}"}
            )
            return response.status_code == 200

    await eventually(accepted, timeout=20, what="the new key to be accepted")


async def test_a_public_key_never_opens_an_internal_rpc(
    keyed_mesh: tuple[Mesh, str, Path],
) -> None:
    mesh, _, _ = keyed_mesh
    assert mesh.router is not None
    async with insecure_channel(mesh.router.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await RouterServiceStub(channel).Register(
                rpb.RegisterRequest(
                    member=rpb.Member(
                        member_id="intruder", role=rpb.MEMBER_ROLE_SERVER, address="127.0.0.1:1"
                    )
                ),
                metadata=(("authorization", f"Bearer {KEY}"),),
            )
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_each_principal_is_held_to_its_rate(mesh_factory: Mesh, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY}\nother-key\n")
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("echo", "echo")
    server = mesh.spawn_server(
        "server", "--api-keys-file", str(keys), "--rate-limit", "0.2", "--mesh-key", MESH_KEY
    )
    mesh.wait_ready(worker, server)
    envoy = mesh.start_envoy([server])
    async with httpx.AsyncClient(base_url=f"http://{envoy.listener_address}") as rest:
        responses = []
        for _ in range(4):
            responses.append(
                await rest.get("/v1/sessions/x", headers={"Authorization": f"Bearer {KEY}"})
            )
        # One request, then refused at once: the bucket refills one every 5 s.
        assert [r.status_code for r in responses] == [404, 429, 429, 429]
        limited = responses[1]
        # When the next request may go: up to the 5 s one token takes.
        assert 1 <= int(limited.headers["retry-after"]) <= 5
        assert limited.headers["content-type"] == "application/problem+json"
        # The reason keeps a rate limit apart from a server's own limits.
        assert limited.json()["title"] == "Rate limit exceeded"
        assert limited.json()["type"] == "https://turnmesh.dev/problems/rate-limited"
        assert limited.json()["reason"] == "RATE_LIMITED"
        assert KEY not in limited.text
        # Another key (another principal) has its own budget; health is never limited.
        other = await rest.get("/v1/sessions/x", headers={"Authorization": "Bearer other-key"})
        assert other.status_code == 404
        for _ in range(5):
            assert (await rest.get("/health")).status_code == 200


async def test_api_keys_without_a_mesh_key_refuse_to_start(
    mesh_factory: Mesh, tmp_path: Path
) -> None:
    """Servers forward calls to each other: without a mesh key (or mTLS) the
    only credential they could pass on is the caller's own key, to whatever
    registered with the router. Refused at start, in one line."""
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY}\n")
    mesh = mesh_factory
    mesh.start_router()
    server = mesh.spawn_server("server", "--api-keys-file", str(keys))
    assert server.proc.wait(timeout=60) != 0
    assert "API keys need a mesh key" in server.log()
    assert KEY not in server.log()
