"""TLS: HTTPS and gRPC over TLS at Envoy's listener, mutual TLS between every
mesh member, and every internal port refusing a client without a certificate
from the mesh CA."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from websockets.asyncio.client import connect as ws_connect

from tests.support.certs import Issued, TestCA
from tests.support.mesh import Component, Mesh
from turnmesh.client import AsyncClient
from turnmesh.runtime.serving import CHANNEL_OPTIONS
from turnmesh.runtime.tls import TlsFiles

MESH_KEY = "tm-mesh-key-for-the-tls-test"
GRPCURL = str(Path(sys.executable).parent / "grpcurl")


@dataclass
class TlsMesh:
    mesh: Mesh
    ca: TestCA
    rogue: TestCA
    operator: Issued  # a valid mesh certificate, as an operator would hold
    edge: str
    router: Component
    worker: Component
    servers: list[Component]

    def internal(self) -> dict[str, str]:
        return {
            "router": self.router.address,
            "worker": self.worker.address,
            "server-1": self.servers[0].address,
            "server-2": self.servers[1].address,
        }


@pytest.fixture(scope="module")
def tls_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsMesh]:
    workdir = tmp_path_factory.mktemp("tls-mesh")
    ca = TestCA(workdir / "ca")
    rogue = TestCA(workdir / "rogue", name="rogue CA")

    def member(name: str) -> tuple[str, ...]:
        return (*ca.issue(name).flags(), "--mesh-key", MESH_KEY)

    mesh = Mesh(workdir / "mesh")
    try:
        router = mesh.spawn("router", "router", *member("router"))
        mesh.wait_ready(router)
        mesh.router = router
        worker = mesh.spawn(
            "worker", "worker", "--router", router.address, "--agent", "demo", *member("worker")
        )
        servers = [
            mesh.spawn(
                f"server-{i}",
                "server",
                "--router",
                router.address,
                "--ws-port",
                "0",  # AReaL's /ws, behind the edge over mutual TLS too
                *member(f"server-{i}"),
            )
            for i in (1, 2)
        ]
        mesh.wait_ready(worker, *servers)
        edge_cert = ca.issue("edge")  # what the public sees
        envoy_client = ca.issue("envoy")  # what Envoy shows the servers
        envoy = mesh.start_envoy(
            servers,
            listener_tls=(edge_cert.cert_file, edge_cert.key_file),
            upstream_tls=TlsFiles(
                ca_file=ca.ca_file,
                cert_file=envoy_client.cert_file,
                key_file=envoy_client.key_file,
            ),
            ca_file=ca.ca_file,
        )
        yield TlsMesh(
            mesh,
            ca,
            rogue,
            ca.issue("operator"),
            envoy.listener_address,
            router,
            worker,
            servers,
        )
    finally:
        mesh.stop()


async def test_a_conversation_over_https_and_grpc_tls_through_envoy(tls_mesh: TlsMesh) -> None:
    async with httpx.AsyncClient(
        base_url=f"https://{tls_mesh.edge}",
        verify=ssl.create_default_context(cafile=tls_mesh.ca.ca_file),
        timeout=30,
    ) as rest:
        created = await rest.post("/v1/sessions", json={})
        assert created.status_code == 200, created.text
        sid = created.json()["session"]["sessionId"]
        turn = await rest.post(f"/v1/sessions/{sid}/turns", json={"message": "What is 6*7?"})
        assert turn.status_code == 200, turn.text
        events = [
            json.loads(line[5:]) for line in turn.text.splitlines() if line.startswith("data:")
        ]
        assert "42" in json.dumps(events)
        assert "RUN_FINISHED" in json.dumps(events[-1])

    root = tls_mesh.ca.ca_file.read_bytes()
    async with AsyncClient(
        tls_mesh.edge, credentials=grpc.ssl_channel_credentials(root_certificates=root)
    ) as client:
        result = await client.send(sid, "What did I ask first?")
        assert "6*7" in result.text
    # Straight to each server with a mesh certificate: one of them owns the
    # session, the other forwards to it over mutual TLS.
    for server in tls_mesh.servers:
        async with AsyncClient(
            server.address, credentials=_credentials(tls_mesh, "valid")
        ) as direct:
            await direct.send(sid, f"hello from {server.name}")
    async with AsyncClient(
        tls_mesh.servers[0].address, credentials=_credentials(tls_mesh, "valid")
    ) as direct:
        users = [m.content for m in await direct.history(sid) if m.role == "user"]
    assert users == [
        "What is 6*7?",
        "What did I ask first?",
        *(f"hello from {s.name}" for s in tls_mesh.servers),
    ]


async def test_areal_ws_over_wss_to_listeners_behind_mutual_tls(tls_mesh: TlsMesh) -> None:
    """/ws over wss at the edge, on to the servers' listeners over mutual TLS,
    which the edge's health checks reach the same way (with no check
    passing, every upgrade would be 503)."""
    params = {"message": "hi tls", "sessionKey": "tls-ws-session"}
    request = {"type": "req", "id": "r1", "method": "agent", "params": params}
    context = ssl.create_default_context(cafile=tls_mesh.ca.ca_file)
    async with ws_connect(f"wss://{tls_mesh.edge}/ws", ssl=context) as ws:
        await ws.send(json.dumps(request))
        frames: list[dict[str, Any]] = []
        async with asyncio.timeout(30):
            while not _final(frames):
                frames.append(json.loads(await ws.recv()))
    assert frames[-1]["payload"]["status"] == "complete", frames


def _final(frames: list[dict[str, Any]]) -> bool:
    """Whether the last frame ends the request (a ``res`` past ``accepted``)."""
    return (
        bool(frames)
        and frames[-1]["type"] == "res"
        and (frames[-1]["payload"]["status"] != "accepted")
    )


def test_envoy_listener_refuses_plaintext(tls_mesh: TlsMesh) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{tls_mesh.edge}/ready", timeout=5)
    # A client that does not trust the mesh CA refuses the edge's certificate.
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"https://{tls_mesh.edge}/ready", timeout=5)


def _credentials(tls_mesh: TlsMesh, kind: str) -> grpc.ChannelCredentials | None:
    root = tls_mesh.ca.ca_file.read_bytes()
    if kind == "plaintext":
        return None
    if kind == "no client certificate":
        return grpc.ssl_channel_credentials(root_certificates=root)
    issued = tls_mesh.rogue.issue("intruder") if kind == "rogue CA" else tls_mesh.operator
    return grpc.ssl_channel_credentials(
        root_certificates=root,
        private_key=issued.key_file.read_bytes(),
        certificate_chain=issued.cert_file.read_bytes(),
    )


async def _health(address: str, credentials: grpc.ChannelCredentials | None) -> int:
    channel = (
        grpc.aio.secure_channel(address, credentials, options=CHANNEL_OPTIONS)
        if credentials is not None
        else grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    )
    async with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        response = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        return int(response.status)


@pytest.mark.parametrize("kind", ["plaintext", "no client certificate", "rogue CA"])
async def test_every_internal_port_refuses_a_client_without_a_valid_certificate(
    tls_mesh: TlsMesh, kind: str
) -> None:
    for name, address in tls_mesh.internal().items():
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _health(address, _credentials(tls_mesh, kind))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, name


async def test_a_certificate_from_the_mesh_ca_is_accepted_everywhere(tls_mesh: TlsMesh) -> None:
    # The control for the refusals above: the same call with a valid certificate.
    for name, address in tls_mesh.internal().items():
        status = await _health(address, _credentials(tls_mesh, "valid"))
        assert status == health_pb2.HealthCheckResponse.SERVING, name


def test_grpcurl_with_a_mesh_certificate(tls_mesh: TlsMesh) -> None:
    op = tls_mesh.operator
    result = subprocess.run(
        [
            GRPCURL,
            "-cacert",
            str(op.ca_file),
            "-cert",
            str(op.cert_file),
            "-key",
            str(op.key_file),
            tls_mesh.worker.address,
            "list",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "turnmesh.v1.WorkerService" in result.stdout


def test_a_member_with_half_its_tls_flags_refuses_to_start(tls_mesh: TlsMesh) -> None:
    issued = tls_mesh.operator
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "turnmesh",
            "worker",
            "--tls-ca",
            str(issued.ca_file),
            "--tls-cert",
            str(issued.cert_file),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "missing --tls-key" in result.stderr
    assert "Traceback" not in result.stderr
