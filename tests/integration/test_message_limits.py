"""gRPC message limits on every hop carry the largest valid request and no
more: a client will not send a Turn over 101 MiB, a server (directly or
through Envoy) will not receive one, and a worker will not receive a Run over
a Turn plus 64 MiB of history."""

from __future__ import annotations

import grpc
import pytest

from tests.conftest import SharedMesh
from turnmesh.client import AsyncClient, TurnmeshClientError
from turnmesh.runtime.serving import (
    MAX_RUN_REQUEST_BYTES,
    MAX_TURN_REQUEST_BYTES,
)
from turnmesh.v1 import event_pb2, worker_service_pb2
from turnmesh.v1 import session_service_pb2 as spb
from turnmesh.v1.session_service_pb2_grpc import SessionServiceStub
from turnmesh.v1.worker_service_pb2_grpc import WorkerServiceStub

# A channel that would send anything: what a hostile client does.
UNLIMITED = (("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1))


def _turn_of(size: int, session_id: str = "limits") -> spb.TurnRequest:
    """A Turn whose serialized size is exactly ``size`` bytes."""
    request = spb.TurnRequest(session_id=session_id, message="x")
    file = request.files.add(mime_type="text/plain", filename="f.txt")
    length = size - request.ByteSize()
    for _ in range(3):  # the field's length prefix grows with it: converge
        file.content = b"a" * length
        length += size - request.ByteSize()
    assert request.ByteSize() == size
    return request


async def test_the_client_will_not_send_a_turn_over_the_limit(shared_mesh: SharedMesh) -> None:
    async with AsyncClient(shared_mesh.servers[0].address) as client:
        request = _turn_of(MAX_TURN_REQUEST_BYTES + 1)
        with pytest.raises(TurnmeshClientError) as refused:
            await client.send("limits", "x", files=list(request.files))
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize("via", ["server", "envoy"])
async def test_a_server_will_not_receive_a_turn_over_the_limit(
    shared_mesh: SharedMesh, via: str
) -> None:
    target = shared_mesh.servers[0].address if via == "server" else shared_mesh.edge
    async with grpc.aio.insecure_channel(target, options=UNLIMITED) as channel:
        stub = SessionServiceStub(channel)
        for size, expected in (
            # Received, then refused by validation (over 100 MiB of files).
            (MAX_TURN_REQUEST_BYTES, grpc.StatusCode.INVALID_ARGUMENT),
            # Never received.
            (MAX_TURN_REQUEST_BYTES + 1, grpc.StatusCode.RESOURCE_EXHAUSTED),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async for _ in stub.Turn(_turn_of(size), timeout=60):
                    pass
            assert refused.value.code() == expected, size


async def test_a_worker_takes_a_run_at_its_limit_and_refuses_one_byte_more(
    shared_mesh: SharedMesh,
) -> None:
    worker = next(w for w in shared_mesh.workers if "echo" in w.name)

    def run_of(size: int) -> worker_service_pb2.RunRequest:
        request = worker_service_pb2.RunRequest(
            session_id="limits-run", turn_id="t1", messages=["hello"]
        )
        history = request.history.add(role="user", content="")
        length = size - request.ByteSize()
        for _ in range(3):  # the length prefixes grow with the content: converge
            history.content = "h" * length
            length += size - request.ByteSize()
        assert request.ByteSize() == size
        return request

    async with grpc.aio.insecure_channel(worker.address, options=UNLIMITED) as channel:
        stub = WorkerServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in stub.Run(run_of(MAX_RUN_REQUEST_BYTES + 1), timeout=60):
                pass
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # The same worker takes a Run of exactly the limit.
        responses = [r async for r in stub.Run(run_of(MAX_RUN_REQUEST_BYTES), timeout=60)]
        assert responses[-1].events[-1].type == event_pb2.RUN_FINISHED
