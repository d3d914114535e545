"""Never-finished uploads at the edge: N HTTP/1.1 chunked uploads of M MiB
with a valid key, whose last chunk never comes (after the body they fall
silent), against a real Envoy in front of a keyed mesh.

Reported: Envoy's heap as its overload manager sees it (admin ``/memory``:
heap size less free pages) and its resident memory, at their peak and at
the end; how each upload ended (what Envoy answered, after how many bytes and
seconds); the overload actions and load-shed points that fired; and what a
caller with the key got meanwhile (one small request every half second).
Loopback only, bounded (``--watch`` seconds at most), stops by itself.

Usage: python -m bench.edge_uploads [--uploads N] [--mib M] [--watch SECONDS]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.mesh import Mesh
from turnmesh.envoy import EdgeGuards
from turnmesh.envoy.process import RunningEnvoy

KEY = "tm-bench-upload-key-0123456789"
MESH_KEY = "tm-bench-upload-mesh-key-9876543210"
MIB = 1024 * 1024
CHUNK = b"%x\r\n" % MIB + b"a" * MIB + b"\r\n"


@dataclass
class Upload:
    sent: int = 0
    answer: str = ""
    ended: float | None = None


@dataclass
class Watch:
    started: float = field(default_factory=time.monotonic)
    heap: list[tuple[float, int]] = field(default_factory=list)
    rss: list[tuple[float, int]] = field(default_factory=list)
    probes: collections.Counter[str] = field(default_factory=collections.Counter)
    refused_until: float = 0.0

    def now(self) -> float:
        return time.monotonic() - self.started


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def heap_bytes(envoy: RunningEnvoy) -> int:
    """What the fixed_heap monitor counts: tcmalloc's heap less its free pages
    (mapped or not)."""
    memory = json.loads(envoy.admin("/memory"))
    free = int(memory["pageheap_unmapped"]) + int(memory["pageheap_free"])
    return int(memory["heap_size"]) - free


def counters(envoy: RunningEnvoy) -> dict[str, int]:
    wanted = (
        "overload.",
        "http.public.downstream_rq_overload_close",
        "http.public.downstream_rq_rx_reset",
        "http.public.downstream_cx_destroy_local_active_rq",
        "http.public.downstream_rq_timeout",
        "http.public.downstream_rq_idle_timeout",
        "http.public.rq_too_large",
        "http.public.downstream_rq_4xx",
        "http.public.downstream_rq_5xx",
    )
    found = {}
    for line in envoy.admin("/stats").splitlines():
        name, _, value = line.partition(": ")
        if name.startswith(wanted) and value.strip().isdigit() and int(value) > 0:
            found[name] = int(value)
    return found


def every(watch: Watch, step: float) -> list[tuple[int, int]]:
    """(heap, RSS) in MiB at the first sample past each step seconds."""
    points, mark = [], 0.0
    for (t, heap), (_, rss) in zip(watch.heap, watch.rss, strict=True):
        if t >= mark:
            points.append((round(heap / MIB), round(rss / MIB)))
            mark += step
    return points


async def upload(host: str, port: int, path: str, mib: int, hold: float, state: Upload) -> None:
    """Headers, then mib MiB of chunked body and no last chunk; then silence
    until Envoy answers or closes, or hold seconds pass."""
    reader, writer = await asyncio.open_connection(host, port)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {KEY}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    began = time.monotonic()

    async def send() -> None:
        writer.write(head + b'6\r\n{"a":"\r\n')
        while state.sent < mib * MIB:
            writer.write(CHUNK)
            await writer.drain()
            state.sent += MIB

    sender = asyncio.create_task(send())
    try:
        with contextlib.suppress(TimeoutError, ConnectionError):
            first = await asyncio.wait_for(reader.readline(), hold)
            state.answer = first.decode(errors="replace").strip() or "closed"
    finally:
        state.ended = time.monotonic() - began
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await sender
        writer.close()
    if not state.answer:
        state.answer = "still open"


async def sample(envoy: RunningEnvoy, watch: Watch, stop: asyncio.Event) -> None:
    while not stop.is_set():
        t = watch.now()
        watch.heap.append((t, await asyncio.to_thread(heap_bytes, envoy)))
        watch.rss.append((t, rss_bytes(envoy.proc.pid)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)


async def probe(base: str, path: str, watch: Watch, stop: asyncio.Event) -> None:
    """A small request every half second on a fresh connection."""
    headers = {"Authorization": f"Bearer {KEY}"}
    while not stop.is_set():
        try:
            async with httpx.AsyncClient(base_url=base, headers=headers, timeout=10) as http:
                status = str((await http.get(path)).status_code)
        except httpx.HTTPError as e:
            status = type(e).__name__
        watch.probes[status] += 1
        if status != "200":
            watch.refused_until = watch.now()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


async def run(
    uploads: int,
    mib: int,
    watch_seconds: float,
    settle_seconds: float,
    max_heap_mb: int,
    workdir: Path,
) -> dict[str, object]:
    mesh = Mesh(workdir, common_args=("--mesh-key", MESH_KEY))
    try:
        keys = workdir / "api-keys"
        keys.write_text(f"bench\t{KEY}\n")
        mesh.start_router()
        worker = mesh.spawn_worker("worker", "echo")
        server = mesh.spawn_server("server", "--api-keys-file", str(keys))
        mesh.wait_ready(worker, server)
        envoy = mesh.start_envoy([server], guards=EdgeGuards(max_heap_mb=max_heap_mb))
        base = f"http://{envoy.listener_address}"
        async with httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {KEY}"}
        ) as http:
            created = await http.post("/v1/sessions", json={"agentName": "echo"})
            sid = created.json()["session"]["sessionId"]
        host, _, port = envoy.listener_address.rpartition(":")
        watch = Watch()
        baseline_heap, baseline_rss = heap_bytes(envoy), rss_bytes(envoy.proc.pid)
        stop = asyncio.Event()
        background = [
            asyncio.create_task(sample(envoy, watch, stop)),
            asyncio.create_task(probe(base, f"/v1/sessions/{sid}", watch, stop)),
        ]
        states = [Upload() for _ in range(uploads)]
        await asyncio.gather(
            *(
                upload(host, int(port), f"/v1/sessions/{sid}/turns", mib, watch_seconds, s)
                for s in states
            )
        )
        # Watch past the last upload's end: do the heap and RSS come back?
        await asyncio.sleep(settle_seconds)
        stop.set()
        await asyncio.gather(*background)
        return {
            "uploads": uploads,
            "mib_each": mib,
            "max_heap_mib": max_heap_mb,
            "heap_mib": {
                "baseline": round(baseline_heap / MIB),
                "peak": round(max(h for _, h in watch.heap) / MIB),
                "end": round(watch.heap[-1][1] / MIB),
            },
            "rss_mib": {
                "baseline": round(baseline_rss / MIB),
                "peak": round(max(r for _, r in watch.rss) / MIB),
                "end": round(watch.rss[-1][1] / MIB),
            },
            "uploads_ended": collections.Counter(s.answer for s in states),
            "upload_mib_sent": sorted(round(s.sent / MIB) for s in states),
            "upload_seconds": sorted(round(s.ended or 0, 1) for s in states),
            "every_5s_heap_rss_mib": every(watch, 5.0),
            "probes": dict(watch.probes),
            "last_refused_probe_s": round(watch.refused_until, 1),
            "envoy_counters": counters(envoy),
            "envoy_memory_end_mib": {
                k: round(int(v) / MIB) for k, v in json.loads(envoy.admin("/memory")).items()
            },
        }
    finally:
        mesh.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--uploads", type=int, default=10)
    parser.add_argument("--mib", type=int, default=130)
    parser.add_argument(
        "--watch", type=float, default=150.0, help="seconds an upload is held at most"
    )
    parser.add_argument("--settle", type=float, default=30.0, help="seconds watched after")
    parser.add_argument("--max-heap-mb", type=int, default=1024)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edge-uploads-") as tmp:
        result = asyncio.run(
            run(args.uploads, args.mib, args.watch, args.settle, args.max_heap_mb, Path(tmp))
        )
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
