"""Turns on a session seeded with the largest history allowed (part of
`make bench`): 31 messages of ten 200,000-character file texts (62 MB, under
the 64 MiB seed limit) on the demo agent, whose fallback rule searches earlier
files. Reported: the create's time, each turn's time on the seeded session,
another session's turn time meanwhile, and the worst event-loop lag of the
server and the worker (turnmesh_event_loop_lag_seconds on the server; the
worker's heartbeat loop has no gauge, so a probe there: gRPC health).
Loopback only, bounded, stops by itself.

Usage: python -m bench.seeded_history [--turns N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import string
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.loop_lag import _lag
from tests.support.mesh import Mesh
from turnmesh.client import AsyncClient
from turnmesh.v1 import message_pb2

MESSAGES = 31
FILES = 10
TEXT_CHARS = 200_000


def seed() -> list[message_pb2.Message]:
    words = ["".join(random.choices(string.ascii_lowercase, k=7)) for _ in range(5000)]
    text = (" ".join(random.choices(words, k=40_000)) + ". ")[:TEXT_CHARS]
    return [
        message_pb2.Message(
            role="user",
            content=f"see files {i}",
            files=[
                message_pb2.FileRef(filename=f"f{i}-{n}.txt", mime_type="text/plain", text=text)
                for n in range(FILES)
            ],
        )
        for i in range(MESSAGES)
    ]


async def _probe(address: str, stop: asyncio.Event) -> float:
    worst = 0.0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        await stub.Check(health_pb2.HealthCheckRequest(), timeout=60)  # connected
        while not stop.is_set():
            started = time.monotonic()
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=60)
            worst = max(worst, time.monotonic() - started)
            await asyncio.sleep(0.02)
    return worst


async def _timed(turn: Awaitable[object]) -> float | str:
    """Seconds the turn took, or how it failed."""
    started = time.monotonic()
    try:
        await turn
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return round(time.monotonic() - started, 3)


async def measure(turns: int, workdir: Path) -> dict[str, object]:
    mesh = Mesh(workdir / "mesh")
    try:
        mesh.start_router()
        worker = mesh.spawn_worker("demo", "demo")
        server = mesh.spawn_server("server", "--metrics-port", "0")
        mesh.wait_ready(worker, server)
        history = seed()
        stop = asyncio.Event()
        lag = asyncio.create_task(_lag(f"http://{server.info['metrics_address']}/metrics", stop))
        worker_probe = asyncio.create_task(_probe(worker.address, stop))
        async with AsyncClient(server.address, timeout=300) as client:
            other = (await client.create_session(agent="demo")).session_id
            started = time.monotonic()
            seeded = (await client.create_session(agent="demo", messages=history)).session_id
            create_seconds = time.monotonic() - started
            seeded_turns: list[float | str] = []
            other_turns: list[float | str] = []
            for i in range(turns):
                started = time.monotonic()
                mine = asyncio.create_task(_timed(client.send(seeded, f"hello {i}")))
                await asyncio.sleep(0.05)  # the other turn runs while this one does
                other_turns.append(await _timed(client.send(other, f"hi {i}")))
                seeded_turns.append(await mine)
        stop.set()
        return {
            "seed_mb": round(sum(m.ByteSize() for m in history) / 1e6, 1),
            "create_seconds": round(create_seconds, 2),
            "seeded_turn_seconds": seeded_turns,
            "other_turn_seconds": other_turns,
            "server_loop_lag_worst_ms": round(await lag * 1000, 1),
            "worker_probe_worst_ms": round(await worker_probe * 1000, 1),
        }
    finally:
        mesh.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(asyncio.run(measure(args.turns, Path(tmp))), indent=2))


if __name__ == "__main__":
    main()
