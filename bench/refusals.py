"""Refused creates at scale (part of `make bench`): a full server refuses
N creates (default 270,000, the count that once grew the router from 58 to
123 MB and then broke its restart); the router's and the server's memory are
measured before and after, then the router is restarted and the time until
the server's sessions route again is measured. The same run with N=0 is the
baseline. Loopback only, bounded, stops by itself.

Usage: python -m bench.refusals [--refusals N] [--concurrency C]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import grpc

from tests.support.mesh import Mesh, RedisServer
from turnmesh.client import AsyncClient, ResourceExhaustedError, UnavailableError
from turnmesh.runtime.serving import insecure_channel
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1.router_service_pb2_grpc import RouterServiceStub

SESSIONS = 1_000


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def refuse(address: str, count: int, concurrency: int) -> int:
    refused = 0

    async def one_client(share: int) -> None:
        nonlocal refused
        async with AsyncClient(address) as client:
            for _ in range(share):
                try:
                    await client.create_session(agent="echo")
                except ResourceExhaustedError:
                    refused += 1

    shares = [count // concurrency + (i < count % concurrency) for i in range(concurrency)]
    await asyncio.gather(*(one_client(s) for s in shares if s))
    return refused


async def measure(refusals: int, concurrency: int, workdir: Path) -> dict[str, float]:
    redis = RedisServer(workdir)
    mesh = Mesh(workdir / "mesh")
    try:
        router = mesh.start_router()
        worker = mesh.spawn_worker("echo", "echo")
        server = mesh.spawn_server("server", "--store", redis.url, "--max-sessions", str(SESSIONS))
        mesh.wait_ready(worker, server)
        async with AsyncClient(server.address) as client:
            sessions = [
                (await client.create_session(agent="echo")).session_id for _ in range(SESSIONS)
            ]
        before = {"router": rss_mib(router.pid), "server": rss_mib(server.pid)}
        started = time.monotonic()
        refused = await refuse(server.address, refusals, concurrency)
        refuse_seconds = time.monotonic() - started
        after = {"router": rss_mib(router.pid), "server": rss_mib(server.pid)}
        assert refused == refusals, (refused, refusals)

        restarted = time.monotonic()
        mesh.restart_router()
        assert mesh.router is not None
        async with insecure_channel(mesh.router.address) as channel:
            stub = RouterServiceStub(channel)
            for sid in (sessions[0], sessions[-1]):
                while True:
                    try:
                        route = await stub.Route(rpb.RouteRequest(session_id=sid, lookup_only=True))
                    except grpc.aio.AioRpcError:  # still learning: UNAVAILABLE
                        await asyncio.sleep(0.02)
                        continue
                    assert route.owner.member_id == server.member_id
                    break
        recovered = time.monotonic() - restarted
        async with AsyncClient(server.address) as client:
            for _ in range(500):  # until the worker has re-registered too
                try:
                    assert (await client.send(sessions[0], "after")).text == "after"
                    break
                except UnavailableError:
                    await asyncio.sleep(0.02)
            else:
                raise AssertionError("no turn after the router restart")
        return {
            "refusals": refusals,
            "refusals_per_second": refusals / refuse_seconds if refusals else 0.0,
            "router_rss_before_mib": before["router"],
            "router_rss_after_mib": after["router"],
            "server_rss_before_mib": before["server"],
            "server_rss_after_mib": after["server"],
            "router_restart_to_routes_seconds": recovered,
        }
    finally:
        mesh.stop()
        redis.stop()


async def main_async(args: argparse.Namespace) -> list[dict[str, float]]:
    rows = []
    for count in (0, args.refusals):
        with tempfile.TemporaryDirectory(prefix="turnmesh-refusals-") as tmp:
            rows.append(await measure(count, args.concurrency, Path(tmp)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refusals", type=int, default=270_000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    rows = asyncio.run(main_async(args))
    print(json.dumps(rows, indent=2))
    baseline, loaded = rows
    growth = loaded["router_rss_after_mib"] - loaded["router_rss_before_mib"]
    base_growth = baseline["router_rss_after_mib"] - baseline["router_rss_before_mib"]
    print(
        f"router memory growth after {loaded['refusals']:,} refusals: {growth:+.1f} MiB "
        f"(baseline run: {base_growth:+.1f} MiB); "
        f"router restart to routes: {loaded['router_restart_to_routes_seconds']:.2f} s "
        f"(baseline {baseline['router_restart_to_routes_seconds']:.2f} s)"
    )


if __name__ == "__main__":
    main()
