"""One load-generating process: C concurrent conversations, each a loop of
turns, over gRPC; prints its samples and its own CPU time as JSON.

`bench/suite.py` runs several of these at once, so no single Python process
limits the measurement (each reports its CPU to prove it).

Usage: python -m bench.loadgen --target ADDR --kind run|turn --concurrency C
       --turns N [--sessions ID,ID,...] [--message TEXT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from typing import Any

import grpc

from turnmesh.runtime.serving import CHANNEL_OPTIONS
from turnmesh.v1 import session_service_pb2 as spb
from turnmesh.v1 import worker_service_pb2 as wpb
from turnmesh.v1.session_service_pb2_grpc import SessionServiceStub
from turnmesh.v1.worker_service_pb2_grpc import WorkerServiceStub


async def run(args: argparse.Namespace) -> dict[str, object]:
    channel = grpc.aio.insecure_channel(args.target, options=CHANNEL_OPTIONS)
    await channel.channel_ready()
    worker = WorkerServiceStub(channel)
    sessions = SessionServiceStub(channel)
    session_ids = args.sessions.split(",") if args.sessions else []
    latencies: list[float] = []
    first_events: list[float] = []
    events_seen = 0
    remaining = args.turns

    def call(loop: int, i: int) -> grpc.aio.UnaryStreamCall[Any, Any]:
        if args.kind == "run":
            return worker.Run(
                wpb.RunRequest(session_id=f"bench-{loop}", turn_id=str(i), messages=[args.message])
            )
        return sessions.Turn(
            spb.TurnRequest(
                session_id=session_ids[loop % len(session_ids)],
                message=args.message,
                policy=spb.TURN_POLICY_ENQUEUE,
            )
        )

    async def conversation(loop: int) -> None:
        nonlocal remaining, events_seen
        i = 0
        while remaining > 0:
            remaining -= 1
            i += 1
            start = time.perf_counter()
            first = None
            async for message in call(loop, i):
                if first is None:
                    first = time.perf_counter()
                # A worker's RunResponse carries a batch of events.
                events_seen += len(message.events) if args.kind == "run" else 1
            end = time.perf_counter()
            latencies.append((end - start) * 1000)
            first_events.append(((first or end) - start) * 1000)

    for loop in range(args.concurrency):  # warm-up: one turn per conversation
        async for _ in call(loop, 0):
            pass
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    await asyncio.gather(*(conversation(loop) for loop in range(args.concurrency)))
    wall = time.perf_counter() - started
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    await channel.close()
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return {
        "latency_ms": latencies,
        "first_event_ms": first_events,
        "events": events_seen,
        "wall_s": wall,
        "cpu_s": cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--kind", choices=["run", "turn"], required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--sessions", default="")
    parser.add_argument("--message", default="one two three four five")
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(run(args))
    else:  # the lighter the load generator, the less it takes from what it measures
        result = uvloop.run(run(args))
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
