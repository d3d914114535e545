"""The /ws listener itself (server/compat/areal_ws/gateway.py), in process
on loopback with a real websockets client: what it admits before any frame."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support.mesh import until
from turnmesh.runtime.auth import ApiKeys
from turnmesh.server.compat import Mesh
from turnmesh.server.compat.areal_ws import Gateway

TIMEOUT = 30.0


async def _started(max_connections: int = 10) -> tuple[Gateway, str]:
    gateway = Gateway(Mesh(), ApiKeys(["the-key"]), max_connections=max_connections)
    port = await gateway.start("127.0.0.1", 0)
    return gateway, f"ws://127.0.0.1:{port}"


async def test_sockets_past_the_limit_get_503_and_other_paths_404() -> None:
    gateway, base = await _started(max_connections=1)
    try:
        async with connect(f"{base}/ws?token=the-key") as first:
            await until(lambda: gateway.open_sockets >= 1, TIMEOUT, "the first socket served")
            with pytest.raises(InvalidStatus) as refused:
                await connect(f"{base}/ws?token=the-key")
            assert refused.value.response.status_code == 503
            await first.send(json.dumps({"type": "req"}))
            assert json.loads(await first.recv())["ok"] is False  # the first still served
        with pytest.raises(InvalidStatus) as elsewhere:
            await connect(f"{base}/other")
        assert elsewhere.value.response.status_code == 404
    finally:
        await gateway.stop()


async def test_a_wrong_key_closes_4001_before_reading_any_frame() -> None:
    gateway, base = await _started()
    try:
        async with connect(f"{base}/ws?token=not-it") as socket:
            with pytest.raises(ConnectionClosed) as closed:
                async with asyncio.timeout(TIMEOUT):
                    await socket.recv()
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4001, "Invalid admin key")
    finally:
        await gateway.stop()


class BrokenMesh(Mesh):
    """A mesh whose calls fail with what no surface expects."""

    def for_caller(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> Mesh:
        return self

    async def session_exists(self, session_id: str) -> bool:
        raise RuntimeError("a bug, with text no caller should see")


async def test_a_fault_of_ours_fails_the_request_in_words_and_the_socket_goes_on() -> None:
    gateway = Gateway(BrokenMesh(), ApiKeys())
    port = await gateway.start("127.0.0.1", 0)
    try:
        async with connect(f"ws://127.0.0.1:{port}/ws") as socket:
            params = {"message": "hi", "sessionKey": "s"}
            await socket.send(
                json.dumps({"type": "req", "id": "a", "method": "agent", "params": params})
            )
            async with asyncio.timeout(TIMEOUT):
                failed = json.loads(await socket.recv())
            assert failed["id"] == "a" and failed["payload"]["code"] == "INTERNAL"
            assert "bug" not in failed["payload"]["error"]
            await socket.send(
                json.dumps({"type": "req", "id": "b", "method": "agent", "params": params})
            )
            async with asyncio.timeout(TIMEOUT):
                assert json.loads(await socket.recv())["id"] == "b"
    finally:
        await gateway.stop()
