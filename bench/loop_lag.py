"""The session server's event loop while large requests decode (part of
`make bench`): one server decodes N compatibility bodies of about 96 MiB each
(OpenAI chat completions, two base64 text files of 36 MiB), sent at once,
while a gRPC health probe asks every 20 ms. Reported: the probe's slowest
answer, the server's turnmesh_event_loop_lag_seconds at its worst (read every
50 ms), and the time to decode and run the turns. The same run with no bodies
is the baseline. Loopback only, bounded, stops by itself.

Usage: python -m bench.loop_lag [--bodies N]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import tempfile
import time
from pathlib import Path

import grpc
import httpx
from google.api import httpbody_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.mesh import Mesh
from turnmesh.runtime.serving import MAX_TURN_REQUEST_BYTES
from turnmesh.v1.compat_service_pb2_grpc import CompatServiceStub

FILE_BYTES = 36 * 2**20
PROBE_SECONDS = 0.02


def chat_body(file_bytes: int = FILE_BYTES) -> bytes:
    """A chat completion whose user message carries two base64 text files."""
    text = base64.b64encode(os.urandom(file_bytes // 4 * 3))  # ASCII: a text file
    data = base64.b64encode(text).decode()
    part = {"type": "file", "file": {"filename": "big.txt", "file_data": data}}
    content = [{"type": "text", "text": "summarise"}, part, part]
    body = {"model": "echo", "messages": [{"role": "user", "content": content}]}
    return json.dumps(body).encode()


async def _probe(address: str, stop: asyncio.Event) -> float:
    """The slowest health check while the bodies decode."""
    worst = 0.0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while not stop.is_set():
            started = time.monotonic()
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=60)
            worst = max(worst, time.monotonic() - started)
            await asyncio.sleep(PROBE_SECONDS)
    return worst


async def _lag(metrics: str, stop: asyncio.Event) -> float:
    """The worst turnmesh_event_loop_lag_seconds seen."""
    worst = 0.0
    async with httpx.AsyncClient(timeout=60) as http:
        while not stop.is_set():
            for line in (await http.get(metrics)).text.splitlines():
                if line.startswith("turnmesh_event_loop_lag_seconds "):
                    worst = max(worst, float(line.split()[1]))
            await asyncio.sleep(0.05)
    return worst


async def _send(address: str, body: bytes) -> str:
    options = [("grpc.max_send_message_length", MAX_TURN_REQUEST_BYTES)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        call = CompatServiceStub(channel).CreateChatCompletion(
            httpbody_pb2.HttpBody(content_type="application/json", data=body), timeout=300
        )
        try:
            return "".join([chunk.data.decode() async for chunk in call])[:80]
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"


async def measure(bodies: int, workdir: Path) -> dict[str, float | str]:
    mesh = Mesh(workdir / "mesh")
    try:
        mesh.start_router()
        worker = mesh.spawn_worker("echo", "echo")
        server = mesh.spawn_server("server", "--agent", "echo", "--metrics-port", "0")
        mesh.wait_ready(worker, server)
        body = chat_body()
        stop = asyncio.Event()
        probe = asyncio.create_task(_probe(server.address, stop))
        lag = asyncio.create_task(_lag(f"http://{server.info['metrics_address']}/metrics", stop))
        await asyncio.sleep(1.0)  # a baseline second of probes
        started = time.monotonic()
        answers = await asyncio.gather(*(_send(server.address, body) for _ in range(bodies)))
        elapsed = time.monotonic() - started
        await asyncio.sleep(1.0)  # the lag gauge's next reading
        stop.set()
        return {
            "bodies": bodies,
            "body_mib": round(len(body) / 2**20, 1),
            "probe_worst_ms": round(await probe * 1000, 1),
            "loop_lag_worst_ms": round(await lag * 1000, 1),
            "turns_seconds": round(elapsed, 2),
            "first_answer": answers[0] if answers else "",
        }
    finally:
        mesh.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bodies", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        baseline = asyncio.run(measure(0, Path(tmp) / "baseline"))
        loaded = asyncio.run(measure(args.bodies, Path(tmp) / "loaded"))
    print(json.dumps({"baseline": baseline, "decoding": loaded}, indent=2))


if __name__ == "__main__":
    main()
