"""What a webhook costs a turn (part of `make bench`): on each store, echo
turns on one session without a webhook (the baseline, measured in the same
run) and then with one to a receiver on loopback that answers 200 at once;
the turn's latency p50 and its ratio to the baseline, and how long after its
turn ended each notice arrived (p50, p99). The machine's speed is printed
beside the figures. Loopback only, bounded, stops by itself.

Usage: python -m bench.webhooks [--turns N] [--stores memory sqlite redis]
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from bench import per_store
from tests.support.mesh import Mesh, RedisServer
from tests.support.webhooks import SECRET, receiving
from turnmesh.client import AsyncClient


async def measure(store: str, turns: int, workdir: Path) -> dict[str, Any]:
    redis = RedisServer(workdir) if store == "redis" else None
    mesh = Mesh(workdir / "mesh")
    secret = workdir / "secret"
    secret.write_text(SECRET)
    try:
        async with receiving() as hooks:
            mesh.start_router()
            worker = mesh.spawn_worker("echo", "echo")
            flags = ["--webhook-allow", hooks.url, "--webhook-secret-file", str(secret)]
            if store == "sqlite":
                flags += ["--store", f"sqlite:{workdir / 'sessions.db'}"]
            elif redis is not None:
                flags += ["--store", redis.url]
            server = mesh.spawn_server("server", *flags)
            mesh.wait_ready(worker, server)
            async with AsyncClient(server.address) as client:
                sid = (await client.create_session(agent="echo")).session_id
                for _ in range(10):  # warm up
                    await client.send(sid, "warm up")
                plain: list[float] = []
                for _ in range(turns):
                    started = time.perf_counter()
                    await client.send(sid, "hello there")
                    plain.append((time.perf_counter() - started) * 1000)
                hooked: list[float] = []
                ended: dict[str, float] = {}
                for _ in range(turns):
                    started = time.perf_counter()
                    result = await client.send(sid, "hello there", webhook_url=hooks.url)
                    ended[f"msg_{result.turn_id}"] = result.events[-1].timestamp / 1000
                    hooked.append((time.perf_counter() - started) * 1000)
            await hooks.requests(turns)
            arrived: dict[str, float] = {}
            for (headers, _), at in zip(hooks.seen, hooks.times, strict=True):
                arrived.setdefault(headers["webhook-id"], at)
        lag = [(arrived[i] - at) * 1000 for i, at in ended.items()]
        baseline = statistics.median(plain)
        return {
            "store": store,
            "turns": turns,
            "turn_p50_ms": round(baseline, 2),
            "turn_with_webhook_p50_ms": round(statistics.median(hooked), 2),
            "ratio_to_turn": round(statistics.median(hooked) / baseline, 2),
            "notice_after_end_p50_ms": per_store.quantile(lag, 0.5),
            "notice_after_end_p99_ms": per_store.quantile(lag, 0.99),
        }
    finally:
        mesh.stop()
        if redis is not None:
            redis.stop()


def main() -> None:
    per_store.main(__doc__ or "", "webhooks", ("turns", 300), measure)


if __name__ == "__main__":
    main()
