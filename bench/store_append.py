"""Does committing a turn cost the same with 2 or 2,000 messages of history?

For each store (memory, SQLite, a real Redis, a real PostgreSQL), time committing a turn to a
session whose history holds 2 messages and to one holding 2,000, in the same
run, and report the ratio (1.0 = no dependence on history length).

Usage: python -m bench.store_append [--turns N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from tests.support.mesh import RedisServer
from tests.support.postgres import PostgresServer
from turnmesh.server.stores import open_store
from turnmesh.server.stores.base import SessionRecord, SessionStore
from turnmesh.v1 import event_pb2, message_pb2


def _turn(i: int) -> list[message_pb2.Message]:
    return [
        message_pb2.Message(role="user", content=f"question {i}", turn_id=f"t{i}"),
        message_pb2.Message(role="assistant", content=f"answer {i} " * 10, turn_id=f"t{i}"),
    ]


async def _seeded(store: SessionStore, session_id: str, messages: int) -> None:
    history = [m for i in range(messages // 2) for m in _turn(i)]
    await store.create(SessionRecord(session_id, "demo", 0.0, 0.0), history)


async def _compare(store: SessionStore, turns: int) -> tuple[float, float]:
    """Median ms per commit to the short and the long session, alternating
    between them so that drift on a shared machine hits both alike."""
    samples: dict[str, list[float]] = {"short": [], "long": []}
    for i in range(turns):
        for session_id in ("short", "long") if i % 2 else ("long", "short"):
            final = event_pb2.Event(type=event_pb2.RUN_FINISHED, seq=2, run_id=f"x{i}")
            start = time.perf_counter()
            await store.commit_turn(session_id, _turn(10_000 + i), final, float(i))
            samples[session_id].append((time.perf_counter() - start) * 1000)
    return statistics.median(samples["short"]), statistics.median(samples["long"])


async def main(turns: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp))
        postgres = PostgresServer()
        try:
            urls = {
                "memory": "memory",
                "sqlite": f"sqlite:{Path(tmp) / 'bench.db'}",
                "redis": redis.url,
                "postgres": postgres.database("bench_store_append"),
            }
            print(f"median ms to commit a 2-message turn, {turns} turns each")
            print(f"{'store':8} {'history 2':>10} {'history 2000':>13} {'ratio':>6}")
            for name, url in urls.items():
                store = open_store(url, 600)
                await store.open()
                await _seeded(store, "short", 2)
                await _seeded(store, "long", 2000)
                await _compare(store, 20)  # warm up
                short, long = await _compare(store, turns)
                print(f"{name:8} {short:10.3f} {long:13.3f} {long / short:6.2f}")
                await store.close()
        finally:
            redis.stop()
            postgres.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    asyncio.run(main(parser.parse_args().turns))
