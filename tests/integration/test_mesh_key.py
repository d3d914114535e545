"""With a mesh key, the mesh works for its members and refuses everyone else."""

from __future__ import annotations

import grpc
import pytest

from tests.support.mesh import Mesh
from turnmesh.client import AsyncClient
from turnmesh.runtime.serving import insecure_channel
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1 import worker_service_pb2 as wpb
from turnmesh.v1.router_service_pb2_grpc import RouterServiceStub
from turnmesh.v1.worker_service_pb2_grpc import WorkerServiceStub

KEY = "test-mesh-key-0123456789"


async def test_mesh_key_guards_router_and_worker(mesh_factory: Mesh) -> None:
    mesh = mesh_factory
    router = mesh.spawn("router", "router", "--mesh-key", KEY)
    mesh.wait_ready(router)
    mesh.router = router
    worker_args = ("--mesh-key", KEY)
    worker = mesh.spawn(
        "echo-keyed", "worker", "--router", router.address, "--agent", "echo", *worker_args
    )
    server = mesh.spawn("server", "server", "--router", router.address, "--mesh-key", KEY)
    mesh.wait_ready(worker, server)

    async with AsyncClient(server.address) as client:
        sid = (await client.create_session(agent="echo")).session_id
        assert (await client.send(sid, "members only")).text == "members only"

    async with insecure_channel(router.address) as channel:
        stub = RouterServiceStub(channel)
        member = rpb.Member(
            member_id="intruder", role=rpb.MEMBER_ROLE_SERVER, address="127.0.0.1:1"
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Register(rpb.RegisterRequest(member=member))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert KEY not in (info.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Register(
                rpb.RegisterRequest(member=member),
                metadata=(("x-turnmesh-mesh-key", "wrong"),),
            )
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED

    async with insecure_channel(worker.address) as channel:
        call = WorkerServiceStub(channel).Run(
            wpb.RunRequest(session_id="s", turn_id="t", messages=["hi"])
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            [e async for e in call]
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
