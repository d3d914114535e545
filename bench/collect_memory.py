"""The issue's COLLECT attack at full scale (part of `make bench`): 30 requests
of one 50 MB file each join one running turn (a probe agent held at a gate)
on a server with the default budgets (256 MiB per session, 512 MiB per
principal). Reported: the server's resident memory before, at its peak
(/proc VmRSS every 20 ms) and after; how many requests were held and how many
refused, by status; and whether another session's turn ran meanwhile.
`make test` runs the same attack at a tenth of the scale
(tests/integration/test_hostile_load.py). Loopback only, bounded, stops by itself.

Usage: python -m bench.collect_memory [--requests N] [--megabytes M]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from tests.support.mesh import Mesh, until
from turnmesh.client import AsyncClient, TurnmeshClientError
from turnmesh.v1 import message_pb2


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def measure(
    requests: int, megabytes: int, concurrency: int, workdir: Path
) -> dict[str, object]:
    mesh = Mesh(workdir / "mesh")
    try:
        mesh.start_router()
        worker = mesh.spawn_worker("probe", "probe_agent:ProbeAgent")
        server = mesh.spawn_server("server", "--agent", "probe", "--metrics-port", "0")
        mesh.wait_ready(worker, server)
        before = rss_mib(server.pid)
        peak = before
        sampling = True

        async def sample() -> None:
            nonlocal peak
            while sampling:
                peak = max(peak, rss_mib(server.pid))
                await asyncio.sleep(0.02)

        sampler = asyncio.create_task(sample())
        size = megabytes * 10**6
        file = message_pb2.File(content=b"x" * size, mime_type="text/plain")
        async with AsyncClient(server.address, timeout=600) as client:
            sid = (await client.create_session()).session_id
            other = (await client.create_session()).session_id
            holding = asyncio.create_task(
                client.send(sid, "hold", metadata={"gate": "bench", "deltas": 2})
            )
            await until(lambda: any(mesh.probe_dir.glob("*.started")), timeout=60)

            async def join(n: int) -> str:
                try:
                    await client.send(sid, f"more {n}", files=[file], metadata={"deltas": 1})
                except TurnmeshClientError as exc:
                    return f"{exc.code.name if exc.code else '?'} {exc.reason}"
                return "200"

            metrics = f"http://{server.info['metrics_address']}/metrics"
            joins: list[asyncio.Task[str]] = []
            async with httpx.AsyncClient(timeout=60) as http:

                async def held() -> float:
                    text = (await http.get(metrics)).text
                    return next(
                        float(line.split()[1])
                        for line in text.splitlines()
                        if line.startswith("turnmesh_pending_turn_bytes ")
                    )

                # In waves of ``concurrency``: each request held (its bytes
                # counted) or refused (answered) before the next wave.
                for first in range(0, requests, concurrency):
                    last = min(requests, first + concurrency)
                    joins += [asyncio.create_task(join(n)) for n in range(first, last)]
                    while await held() < sum(not t.done() for t in joins) * size:  # noqa: ASYNC110
                        await asyncio.sleep(0.05)
            refused = Counter(t.result() for t in joins if t.done())
            innocent_started = time.monotonic()
            await client.send(other, "hi", metadata={"deltas": 1})
            innocent_seconds = time.monotonic() - innocent_started
            peak_held = peak  # the flood decided, before the held turns run
            (mesh.probe_dir / "gate-bench").write_text("open")
            outcomes = Counter(await asyncio.gather(*joins))
            await holding
        sampling = False
        await sampler
        return {
            "requests": requests,
            "sent_at_once": concurrency,
            "file_mb": megabytes,
            "rss_before_mib": round(before),
            "rss_peak_while_flooded_mib": round(peak_held),
            "rss_peak_mib": round(peak),
            "rss_after_mib": round(rss_mib(server.pid)),
            "refused_before_the_gate_opened": dict(refused),
            "outcomes": dict(outcomes),
            "innocent_turn_seconds": round(innocent_seconds, 2),
        }
    finally:
        mesh.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--megabytes", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=30, help="requests sent at once")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(measure(args.requests, args.megabytes, args.concurrency, Path(tmp)))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
