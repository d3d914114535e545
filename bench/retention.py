"""Memory retained over time (part of `make bench`): 100,000 echo turns
across 2,000 sessions on one server, then the event-log window passes.

Reported: the server's and the worker's resident memory before the turns, at
the end, and once every finished turn's events have expired (the window is
``--event-log-ttl``, shortened here so the run ends), each per finished turn
beyond the text the turns added to histories; the event-log bytes the server
held at the end (``turnmesh_event_log_bytes``, bounded by
``--max-event-log-bytes``); and the machine's speed (the bare baseline's
turns/s in the same run). Loopback only, bounded, stops by itself.

Usage: python -m bench.retention [--turns N] [--sessions S] [--window SECONDS]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import httpx

from bench.suite import MESSAGE, Bench, rss_bytes


async def gauge(url: str, name: str) -> float:
    async with httpx.AsyncClient(timeout=60) as http:
        for line in (await http.get(url)).text.splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
    return float("nan")


async def expired(url: str, window: float) -> None:
    """Until the server's event logs are empty: every finished turn's events
    went (a window after the last turn, and a sweep); at most ten windows
    and a minute, on a machine however busy."""
    await asyncio.sleep(window)  # none can go sooner
    deadline = time.monotonic() + 10 * window + 60
    while await gauge(url, "turnmesh_event_log_bytes") > 0:
        if time.monotonic() > deadline:
            return  # reported as it is: event_log_bytes_after_window says so
        await asyncio.sleep(min(0.2, window / 10))


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, object]:
    server_args = ("--event-log-ttl", str(args.window), "--metrics-port", "0")
    bench = Bench(workdir, turns=0, smoke=False, server_args=server_args)
    bench.start()
    try:
        metrics = f"http://{bench.server.info['metrics_address']}/metrics"
        speed = await bench.grpc_cell("baseline", 16, min(4000, args.turns), [])
        sessions = await bench.sessions(args.sessions)
        # One turn a session first: every session has a history and a worker cache entry.
        concurrency = min(64, args.sessions)
        await bench.grpc_cell("mesh-grpc", concurrency, args.sessions, sessions)
        await expired(metrics, args.window)  # the warm-up's events expire too
        pids = {"server": bench.server.pid, "worker": bench.worker.pid}
        before = {name: rss_bytes(pid) for name, pid in pids.items()}
        cell = await bench.grpc_cell("mesh-grpc", concurrency, args.turns, sessions)
        turns = cell.turns
        at_end = {name: rss_bytes(pid) for name, pid in pids.items()}
        log_bytes = await gauge(metrics, "turnmesh_event_log_bytes")
        # The last turn's events expire one window after it ended, and the
        # server sweeps a tenth of a window later at most.
        await expired(metrics, args.window)
        after_window = {name: rss_bytes(pid) for name, pid in pids.items()}
        log_bytes_after = await gauge(metrics, "turnmesh_event_log_bytes")
    finally:
        bench.stop()
    text = 2 * len(MESSAGE.encode()) * turns  # the user's message and the echo
    per_turn = {
        f"{name}_bytes_per_turn_{when}": round((rss[name] - before[name] - text) / turns, 1)
        for when, rss in (("at_end", at_end), ("after_window", after_window))
        for name in pids
    }
    return {
        "baseline_turns_per_s": round(speed.turns_per_s, 1),
        "turns": turns,
        "sessions": args.sessions,
        "turns_per_s": round(cell.turns_per_s, 1),
        "event_log_window_s": args.window,
        "history_text_bytes": text,
        "rss_before_mib": {k: round(v / 2**20, 1) for k, v in before.items()},
        "rss_at_end_mib": {k: round(v / 2**20, 1) for k, v in at_end.items()},
        "rss_after_window_mib": {k: round(v / 2**20, 1) for k, v in after_window.items()},
        "event_log_bytes_at_end": log_bytes,
        "event_log_bytes_after_window": log_bytes_after,
        **per_turn,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100_000)
    parser.add_argument("--sessions", type=int, default=2_000)
    parser.add_argument("--window", type=float, default=30.0, help="--event-log-ttl, seconds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(measure(args, Path(tmp)))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
