"""A session server's death or freeze costs no request another server could
serve: Envoy's retries (the route's and the key check's) reach the live server
instead of running into the cluster's default limit of 3 retries at once, and
a frozen server's connections are found dead by the HTTP/2 keepalive before
a key check sent to it runs out of time."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.support.mesh import Component, Mesh, start_keyed_mesh, until

KEY = "tm-failover-key-0123456789abcdef"
MESH_KEY = "tm-failover-mesh-key-fedcba98765"
CALLERS = 48
BEFORE_KILL = 400  # answers before the kill
AFTER_KILL = 1_600  # answers after it


@pytest.fixture
def two_servers(mesh_factory: Mesh, tmp_path: Path) -> Mesh:
    keys = tmp_path / "api-keys"
    keys.write_text(f"sha256:{hashlib.sha256(KEY.encode()).hexdigest()}\n")
    start_keyed_mesh(mesh_factory, keys, MESH_KEY, agent="echo")
    return mesh_factory


async def _reads_through_a_fault(mesh: Mesh, fault: Callable[[Component], None]) -> None:
    """48 callers read through Envoy; after BEFORE_KILL answers ``fault``
    strikes the first of two servers, and every one of the next AFTER_KILL
    answers must still be a 200."""
    servers = mesh.components[-2:]
    envoy = mesh.start_envoy(servers)

    def healthy() -> bool:
        stats = envoy.admin("/stats?filter=session_servers.membership_healthy$")
        return stats.strip().endswith(": 2")

    await until(healthy, what="Envoy to see both servers healthy")
    answers: Counter[int] = Counter()
    bodies: list[str] = []
    killed = asyncio.Event()
    limits = httpx.Limits(max_connections=CALLERS, max_keepalive_connections=CALLERS)
    async with httpx.AsyncClient(
        base_url=f"http://{envoy.listener_address}",
        headers={"Authorization": f"Bearer {KEY}"},
        limits=limits,
        timeout=60,
    ) as rest:

        async def caller() -> None:
            while answers.total() < BEFORE_KILL + AFTER_KILL:
                response = await rest.get("/v1/models")
                answers[response.status_code] += 1
                if response.status_code != 200:
                    bodies.append(response.text[:200])
                if answers.total() >= BEFORE_KILL and not killed.is_set():
                    killed.set()
                    fault(servers[0])  # by PID, under load

        await asyncio.gather(*(caller() for _ in range(CALLERS)))
    assert killed.is_set()
    retries = envoy.admin("/stats?filter=session_servers.upstream_rq_retry")
    assert answers == {200: answers.total()}, (answers, bodies[:5], retries)


async def test_a_killed_server_costs_no_read_a_live_one_could_answer(two_servers: Mesh) -> None:
    await _reads_through_a_fault(two_servers, two_servers.kill)  # SIGKILL


async def test_a_frozen_server_costs_no_read_a_live_one_could_answer(two_servers: Mesh) -> None:
    """SIGSTOP: the server still accepts connections but answers nothing.
    Before, key checks sent to it ran out their 2 s and 22-40 of ~1,600
    reads got 503 "the API key could not be checked"."""
    frozen: list[Component] = []

    def freeze(server: Component) -> None:
        os.kill(server.pid, signal.SIGSTOP)
        frozen.append(server)

    try:
        await _reads_through_a_fault(two_servers, freeze)
    finally:
        for server in frozen:
            os.kill(server.pid, signal.SIGCONT)  # so that it can be stopped
    assert frozen
