"""Listing a principal's sessions (part of `make bench`): on each store, one
principal's N sessions among as many of other principals', walked in pages
of 100, and filtered by metadata that one session in ten matches. Each figure
is set next to GetSession's latency measured in the same run (the baseline),
and the machine's speed next to them. Memory runs two servers (a listing asks
both), SQLite one, Redis two (the store's per-principal index). Loopback only,
bounded, stops by itself.

Usage: python -m bench.listing [--sessions N] [--stores memory sqlite redis]
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench import per_store
from tests.support.mesh import Mesh, RedisServer
from turnmesh.client import AsyncClient

MESH_KEY = "bench-listing-mesh-key"
KEYS = {"acme": "bench-key-acme", "noise": "bench-key-noise"}
CONCURRENCY = 16


async def _create_many(address: str, key: str, count: int, tag_every: int) -> None:
    async def one(share: range) -> None:
        async with AsyncClient(address, api_key=key) as client:
            for i in share:
                team = "red" if i % tag_every == 0 else "blue"
                await client.create_session(agent="echo", metadata={"team": team, "n": i})

    await asyncio.gather(*(one(range(c, count, CONCURRENCY)) for c in range(CONCURRENCY)))


async def _latencies(call: Callable[[], Awaitable[Any]], times: int) -> list[float]:
    spent = []
    for _ in range(times):
        started = time.perf_counter()
        await call()
        spent.append((time.perf_counter() - started) * 1000)
    return spent


def _p50(values: list[float]) -> float:
    return round(statistics.median(values), 2)


async def measure(store: str, sessions: int, workdir: Path) -> dict[str, Any]:
    keys = workdir / "keys"
    keys.write_text("".join(f"{name}\t{key}\n" for name, key in KEYS.items()))
    redis = RedisServer(workdir) if store == "redis" else None
    mesh = Mesh(workdir / "mesh", common_args=("--mesh-key", MESH_KEY))
    try:
        mesh.start_router()
        worker = mesh.spawn_worker("echo", "echo")
        flags = ["--api-keys-file", str(keys), "--max-sessions", str(sessions * 4)]
        if store == "sqlite":
            flags += ["--store", f"sqlite:{workdir / 'sessions.db'}"]
        elif redis is not None:
            flags += ["--store", redis.url]
        count = 1 if store == "sqlite" else 2
        servers = [mesh.spawn_server(f"server-{i}", *flags) for i in range(count)]
        mesh.wait_ready(worker, *servers)
        address = servers[0].address
        await _create_many(address, KEYS["noise"], sessions, 10)
        await _create_many(address, KEYS["acme"], sessions, 10)
        async with AsyncClient(address, api_key=KEYS["acme"]) as client:
            first = (await client.list_sessions(page_size=1)).sessions[0].session_id
            get = await _latencies(lambda: client.get_session(first), 50)
            pages: list[float] = []
            listed = 0
            token = ""
            walk_started = time.perf_counter()
            while True:
                started = time.perf_counter()
                page = await client.list_sessions(page_size=100, page_token=token)
                pages.append((time.perf_counter() - started) * 1000)
                listed += len(page.sessions)
                token = page.next_page_token
                if not token:
                    break
            walk_seconds = time.perf_counter() - walk_started
            assert listed == sessions, (listed, sessions)
            filtered = await _latencies(
                lambda: client.list_sessions(page_size=100, metadata={"team": "red"}), 20
            )
        baseline = _p50(get)
        return {
            "store": store,
            "servers": count,
            "sessions_of_the_principal": sessions,
            "other_sessions": sessions,
            "get_session_p50_ms": baseline,
            "page_of_100_p50_ms": _p50(pages),
            "page_ratio_to_get": round(_p50(pages) / baseline, 1),
            "whole_walk_s": round(walk_seconds, 2),
            "filtered_page_p50_ms": _p50(filtered),
            "filtered_ratio_to_get": round(_p50(filtered) / baseline, 1),
        }
    finally:
        mesh.stop()
        if redis is not None:
            redis.stop()


def main() -> None:
    per_store.main(__doc__ or "", "listing", ("sessions", 10_000), measure)


if __name__ == "__main__":
    main()
