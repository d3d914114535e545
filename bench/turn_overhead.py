"""What the mesh's hops cost next to calling a worker directly.

Starts a router, one echo worker and two session servers on loopback, then runs
the same short echo turn (5 words, 7 events from the worker) on three paths, in
the same run so the ratios hold on a noisy machine:

  worker   direct WorkerService.Run (the baseline: one Python gRPC hop)
  owner    SessionService.Turn on the server that owns the session
  forward  SessionService.Turn on the other server (forwarded to the owner)

Usage: python -m bench.turn_overhead [--turns N] [--concurrency C ...]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from tests.support.mesh import Mesh
from turnmesh.client import AsyncClient
from turnmesh.runtime.serving import insecure_channel
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1 import worker_service_pb2 as wpb
from turnmesh.v1.router_service_pb2_grpc import RouterServiceStub
from turnmesh.v1.worker_service_pb2_grpc import WorkerServiceStub

MESSAGE = "one two three four five"


async def _measure(
    turn: Callable[[int], Awaitable[None]], turns: int, concurrency: int
) -> tuple[float, float, float]:
    """(turns per second, p50 ms, p99 ms)."""
    latencies: list[float] = []
    next_index = 0

    async def loop() -> None:
        nonlocal next_index
        while next_index < turns:
            i = next_index
            next_index += 1
            start = time.perf_counter()
            await turn(i)
            latencies.append((time.perf_counter() - start) * 1000)

    for i in range(min(20, turns)):  # warm up channels and code paths
        await turn(i)
    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return turns / elapsed, statistics.median(latencies), p99


async def run(turns: int, concurrencies: list[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mesh = Mesh(Path(tmp))
        try:
            router = mesh.start_router()
            worker = mesh.spawn_worker("echo", "echo")
            servers = [mesh.spawn_server("s1"), mesh.spawn_server("s2")]
            mesh.wait_ready(worker, *servers)
            router_stub = RouterServiceStub(insecure_channel(router.address))
            worker_stub = WorkerServiceStub(insecure_channel(worker.address))
            clients = [AsyncClient(s.address) for s in servers]
            sessions: dict[str, list[str]] = {"owner": [], "forward": []}
            for _ in range(max(concurrencies) * 2):
                sid = (await clients[0].create_session(agent="echo")).session_id
                owner = (await router_stub.Route(rpb.RouteRequest(session_id=sid))).owner
                owned_by_first = owner.member_id == servers[0].member_id
                sessions["owner" if owned_by_first else "forward"].append(sid)

            async def direct(i: int) -> None:
                request = wpb.RunRequest(session_id="bench", turn_id=str(i), messages=[MESSAGE])
                async for _ in worker_stub.Run(request):
                    pass

            def via(path: str) -> Callable[[int], Awaitable[None]]:
                ids = sessions[path]

                async def turn(i: int) -> None:
                    sid = ids[i % len(ids)]
                    await clients[0].send(sid, MESSAGE, policy="enqueue")

                return turn

            print(f"{turns} turns per cell; ratio = path turns/s over the direct worker's")
            print(f"{'path':8} {'conc':>4} {'turns/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'ratio':>6}")
            for concurrency in concurrencies:
                base, *_ = result = await _measure(direct, turns, concurrency)
                rows = [("worker", result)]
                for path in ("owner", "forward"):
                    rows.append((path, await _measure(via(path), turns, concurrency)))
                for name, (rate, p50, p99) in rows:
                    print(
                        f"{name:8} {concurrency:>4} {rate:8.0f} {p50:7.2f} {p99:7.2f} "
                        f"{rate / base:6.2f}"
                    )
            for client in clients:
                await client.close()
        finally:
            mesh.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    args = parser.parse_args()
    asyncio.run(run(args.turns, args.concurrency))


if __name__ == "__main__":
    main()
