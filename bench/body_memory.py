"""A server's memory under large and refused request bodies (part of `make
bench`). Every surface that takes a body gets every kind of body
(``tests/support/big_bodies.py``: REST through Envoy to OpenAI chat and
Responses, AG-UI, the simple chat API and native turns; gRPC straight at the
server to the HttpBody methods and native turns; refused as not JSON, as
too many values, as a message too long; accepted with a file, the turn's
session deleted after), ``--concurrency`` at once, in rounds. First a
warm-up round of 1 MiB bodies (a surface's first use loads what it needs),
then the baseline: the same rounds with 1 MiB bodies; then ``--megabytes``
bodies. Reported: the server's resident memory, alone and with its body
decoders (the processes that parse large JSON; a container's limit counts
them), after each round once settled, and its peak. Loopback only, bounded,
stops by itself.

Usage: python -m bench.body_memory [--rounds R] [--megabytes M] [--concurrency C]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TypedDict

from tests.support.big_bodies import Kind, Sender, kinds, rss_mib, settled, tree_rss_mib
from tests.support.mesh import Component, Mesh


class Round(TypedDict):
    round: int
    bodies: int
    peak_mib: int
    peak_with_decoders_mib: int
    after_mib: int
    after_with_decoders_mib: int


class Phase(TypedDict):
    phase: str
    megabytes: float
    bodies: int
    seconds: float
    outcomes: dict[str, int]
    rounds: list[Round]


class Sampler:
    """The server's RSS (and with its children) every 50 ms; peaks since reset."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = self.peak_tree = 0.0
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            self.peak = max(self.peak, rss_mib(self.pid))
            self.peak_tree = max(self.peak_tree, tree_rss_mib(self.pid))
            await asyncio.sleep(0.05)

    def reset(self) -> None:
        self.peak = self.peak_tree = 0.0

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def send_round(
    sender: Sender, round_kinds: list[Kind], concurrency: int, outcomes: Counter[str]
) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(kind: Kind) -> None:
        async with gate:
            got = await sender.send(kind)
        outcomes["expected" if got == kind.expected else f"{kind.label}: {got}"] += 1

    await asyncio.gather(*(one(k) for k in round_kinds))


async def phase(
    name: str,
    server: Component,
    edge: str,
    megabytes: float,
    rounds: int,
    concurrency: int,
    sampler: Sampler,
) -> Phase:
    every = kinds()
    outcomes: Counter[str] = Counter()
    series: list[Round] = []
    started = time.monotonic()
    async with Sender(server.address, edge, int(megabytes * 2**20)) as sender:
        for number in range(1, rounds + 1):
            sampler.reset()
            mixed = random.Random(number).sample(every, len(every))
            await send_round(sender, mixed, concurrency, outcomes)
            peak, peak_tree = sampler.peak, sampler.peak_tree
            after, after_tree = await settled(server.pid)
            series.append(
                Round(
                    round=number,
                    bodies=number * len(every),
                    peak_mib=round(peak),
                    peak_with_decoders_mib=round(peak_tree),
                    after_mib=round(after),
                    after_with_decoders_mib=round(after_tree),
                )
            )
            print(f"{name} round {number}: {series[-1]}", flush=True)
    return Phase(
        phase=name,
        megabytes=megabytes,
        bodies=rounds * len(every),
        seconds=round(time.monotonic() - started, 1),
        outcomes=dict(outcomes),
        rounds=series,
    )


async def measure(
    rounds: int, megabytes: float, concurrency: int, workdir: Path
) -> tuple[dict[str, object], list[Phase]]:
    mesh = Mesh(workdir / "mesh")
    try:
        mesh.start_router()
        worker = mesh.spawn_worker("echo", "echo")
        server = mesh.spawn_server("server", "--agent", "echo")
        mesh.wait_ready(worker, server)
        envoy = mesh.start_envoy([server])
        edge = envoy.listener_address
        started_mib = rss_mib(server.pid)
        sampler = Sampler(server.pid)
        try:
            warm = await phase("warm-up", server, edge, 1, 1, concurrency, sampler)
            baseline = await phase("baseline", server, edge, 1, rounds, concurrency, sampler)
            large = await phase("large", server, edge, megabytes, rounds, concurrency, sampler)
            idle, idle_tree = await settled(server.pid)
        finally:
            await sampler.stop()
        summary: dict[str, object] = {
            "concurrency": concurrency,
            "kinds": len(kinds()),
            "server_rss_at_start_mib": round(started_mib),
            "rss_at_the_end_mib": round(idle),
            "rss_at_the_end_with_decoders_mib": round(idle_tree),
        }
        return summary, [warm, baseline, large]
    finally:
        mesh.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--megabytes", type=float, default=20)
    parser.add_argument("--concurrency", type=int, default=4, help="bodies sent at once")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="turnmesh-body-memory-") as tmp:
        summary, phases = asyncio.run(
            measure(args.rounds, args.megabytes, args.concurrency, Path(tmp))
        )
    print(json.dumps({**summary, "phases": phases}, indent=2))
    warm, baseline, large = phases
    before = warm["rounds"][-1]["after_mib"]
    small_after = baseline["rounds"][-1]["after_mib"]
    large_after = large["rounds"][-1]["after_mib"]
    print(
        f"server RSS after warm-up {before} MiB; after {baseline['bodies']} bodies of 1 MiB"
        f" (baseline) {small_after} MiB ({small_after - before:+} MiB); after"
        f" {large['bodies']} bodies of {large['megabytes']:g} MiB {large_after} MiB"
        f" ({large_after - before:+} MiB), peak"
        f" {max(r['peak_mib'] for r in large['rounds'])} MiB"
        f" ({max(r['peak_with_decoders_mib'] for r in large['rounds'])} MiB with decoders)"
    )


if __name__ == "__main__":
    main()
