from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.a2a_clients import BINDINGS, Agents
from tests.support.mesh import Component, Mesh, RedisServer
from tests.support.postgres import PostgresServer
from tests.support.redis_cluster import RedisCluster
from turnmesh.client import AsyncClient


class SharedMesh:
    """Router, two session servers, and workers for demo, echo and probe."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        mesh.start_router()
        workers = [
            mesh.spawn_worker("worker-demo-1", "demo"),
            mesh.spawn_worker("worker-demo-2", "demo"),
            mesh.spawn_worker("worker-echo-1", "echo"),
            mesh.spawn_worker("worker-echo-2", "echo"),
            mesh.spawn_worker("worker-probe-1", "probe_agent:ProbeAgent"),
        ]
        self.servers: list[Component] = [
            mesh.spawn_server("server-1"),
            mesh.spawn_server("server-2"),
        ]
        mesh.wait_ready(*workers, *self.servers)
        self.workers = workers
        self.envoy = mesh.start_envoy(self.servers)

    @property
    def edge(self) -> str:
        """Envoy's public listener: REST, SSE and native gRPC."""
        return self.envoy.listener_address

    @property
    def router(self) -> Component:
        assert self.mesh.router is not None
        return self.mesh.router


@pytest.fixture(scope="session")
def shared_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedMesh]:
    # Heartbeats each second (dropped after 8 s without one): nothing here is
    # killed, and the other test process's heavy runs may starve these
    # members for seconds; a drop made the router answer "still learning".
    mesh = Mesh(tmp_path_factory.mktemp("shared-mesh"), heartbeat_interval=1.0)
    try:
        yield SharedMesh(mesh)
    finally:
        mesh.stop()


@pytest.fixture
def mesh_factory(tmp_path: Path) -> Iterator[Mesh]:
    """A private mesh for tests that kill processes."""
    mesh = Mesh(tmp_path / "mesh")
    try:
        yield mesh
    finally:
        mesh.stop()


@pytest.fixture
async def rest(shared_mesh: SharedMesh) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=f"http://{shared_mesh.edge}", timeout=60) as c:
        yield c


@pytest.fixture
async def client(shared_mesh: SharedMesh) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(shared_mesh.servers[0].address) as c:
        yield c


@pytest.fixture
async def client2(shared_mesh: SharedMesh) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(shared_mesh.servers[1].address) as c:
        yield c


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> str:
    """A database of this test process's own (one per xdist worker)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    return postgres_server.database(f"turnmesh_{worker}")


@pytest.fixture(params=["redis", "postgres"])
def shared_store(request: pytest.FixtureRequest) -> str:
    """The URL of a store every server of a mesh shares: the run's Redis, or
    a new database of its own on the run's PostgreSQL."""
    if request.param == "redis":
        redis: RedisServer = request.getfixturevalue("redis_server")
        return redis.url
    postgres: PostgresServer = request.getfixturevalue("postgres_server")
    return postgres.database(f"mesh_{uuid.uuid4().hex[:12]}")


@pytest.fixture(params=BINDINGS)
async def agents(shared_mesh: SharedMesh, request: pytest.FixtureRequest) -> AsyncIterator[Agents]:
    """An a2a-sdk client maker over each A2A binding, against the shared mesh."""
    made = Agents(shared_mesh.edge, request.param)
    yield made
    await made.close()
