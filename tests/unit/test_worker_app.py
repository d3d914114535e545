"""The worker process: start-up checks, serving, and shutdown on a signal."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pydantic
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from turnmesh.runtime.interceptors import MESH_KEY_METADATA
from turnmesh.runtime.serving import write_ready_file
from turnmesh.v1 import worker_service_pb2, worker_service_pb2_grpc
from turnmesh.worker import WorkerConfig, app, serve


async def test_an_unloadable_agent_refuses_to_start(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(SystemExit) as caught:
        await serve(WorkerConfig(agent="no-such-agent"))
    assert caught.value.code == 2
    assert "unknown agent 'no-such-agent'" in caplog.text


def test_config_rejects_unknown_settings() -> None:
    with pytest.raises(pydantic.ValidationError):
        WorkerConfig(agnet="echo")  # type: ignore[call-arg]


async def test_open_bind_without_a_key_is_refused() -> None:
    with pytest.raises(SystemExit, match="refusing to bind"):
        await serve(WorkerConfig(host="0.0.0.0", agent="echo"))


async def test_serves_until_sigterm_then_closes_the_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    ready = asyncio.Event()
    write = write_ready_file  # what app calls, before the patch below

    def write_and_flag(path: str | None, **info: Any) -> None:
        write(path, **info)
        ready.set()

    monkeypatch.setattr(app, "write_ready_file", write_and_flag)
    if TYPE_CHECKING:
        from tests.unit._agent_samples import ClosingAgent
    else:  # the module the worker loads, by the name it loads it as
        from _agent_samples import ClosingAgent

    closed_before = ClosingAgent.closed
    ready_file = tmp_path / "worker.json"
    config = WorkerConfig(agent="_agent_samples:ClosingAgent", ready_file=str(ready_file))
    task = asyncio.create_task(serve(config))
    async with asyncio.timeout(10):
        await ready.wait()
    info = json.loads(ready_file.read_text())
    assert info["agent"] == "closingagent"
    assert info["member_id"].startswith("worker-")

    async with grpc.aio.insecure_channel(info["address"]) as channel:
        got = await worker_service_pb2_grpc.WorkerServiceStub(channel).GetInfo(
            worker_service_pb2.GetInfoRequest()
        )
        health = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="turnmesh.v1.WorkerService")
        )
    assert (got.agent_name, got.ready, got.worker_id) == ("closingagent", True, info["member_id"])
    assert health.status == health_pb2.HealthCheckResponse.SERVING

    # serve() installed its handlers before announcing readiness.
    os.kill(os.getpid(), signal.SIGTERM)
    async with asyncio.timeout(10):
        await task
    assert ClosingAgent.closed == closed_before + 1


async def test_with_a_mesh_key_every_worker_method_needs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ready = asyncio.Event()
    write = write_ready_file

    def write_and_flag(path: str | None, **info: Any) -> None:
        write(path, **info)
        ready.set()

    monkeypatch.setattr(app, "write_ready_file", write_and_flag)
    ready_file = tmp_path / "worker.json"
    config = WorkerConfig(agent="echo", ready_file=str(ready_file), mesh_key="k" * 32)
    task = asyncio.create_task(serve(config))
    async with asyncio.timeout(10):
        await ready.wait()
    address = json.loads(ready_file.read_text())["address"]
    async with grpc.aio.insecure_channel(address) as channel:
        stub = worker_service_pb2_grpc.WorkerServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetInfo(worker_service_pb2.GetInfoRequest())
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        got = await stub.GetInfo(
            worker_service_pb2.GetInfoRequest(), metadata=((MESH_KEY_METADATA, "k" * 32),)
        )
        assert got.agent_name == "echo"
    os.kill(os.getpid(), signal.SIGTERM)
    async with asyncio.timeout(10):
        await task
