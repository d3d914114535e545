"""What a turn costs on each surface (part of `make bench`): the same echo
turn (a 5-word message) through Envoy as native REST (a turn on an existing
session, SSE; and "native-rest-new": a new session, then its turn), OpenAI
chat completions and Responses (streamed, one user message, as a stateless
client sends it: each makes a session), AG-UI (a run on a new thread) and
A2A (a streamed message in a new context, a background turn: over HTTP+JSON,
and as "a2a-jsonrpc" over JSON-RPC, SendStreamingMessage),
interleaved in rounds so drift on a shared machine hits all alike. Reported:
CPU per turn of the server, the worker and Envoy, from /proc, and each
surface's server CPU as a ratio to native REST's, next to the bare baseline's
turns/s in the same run (the machine's speed). Loopback only, bounded.

Usage: python -m bench.compat_cost [--turns N] [--concurrency C] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from bench.suite import MESSAGE, Bench, cpu_seconds

SURFACES = (
    "native-rest",
    "native-rest-new",
    "chat-completions",
    "responses",
    "agui",
    "a2a",
    "a2a-jsonrpc",
)


def _request(surface: str, session_id: str) -> tuple[str, dict[str, Any]]:
    user = [{"role": "user", "content": MESSAGE}]
    if surface.startswith("native-rest"):
        return f"/v1/sessions/{session_id}/turns", {"message": MESSAGE}
    if surface == "chat-completions":
        return "/v1/chat/completions", {"model": "echo", "messages": user, "stream": True}
    if surface == "responses":
        return "/v1/responses", {"model": "echo", "input": MESSAGE, "stream": True}
    if surface.startswith("a2a"):
        message = {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": MESSAGE}]}
        if surface == "a2a-jsonrpc":
            call = {"method": "SendStreamingMessage", "params": {"message": message}}
            return "/echo/jsonrpc", {"jsonrpc": "2.0", "id": 1, **call}
        return "/echo/message:stream", {"message": message}
    thread = f"bench-{uuid.uuid4().hex}"
    return "/v1/agui", {
        "threadId": thread,
        "runId": "run",
        "messages": [{"id": "m", **user[0]}],
        "forwardedProps": {"agent": "echo"},
    }


async def run_surface(
    http: aiohttp.ClientSession, surface: str, turns: int, concurrency: int, sessions: list[str]
) -> int:
    """``turns`` turns, ``concurrency`` at a time; each read to its end."""
    remaining = turns
    failed = 0

    async def loop(n: int) -> None:
        nonlocal remaining, failed
        while remaining > 0:
            remaining -= 1
            session_id = sessions[n % len(sessions)]
            if surface == "native-rest-new":  # a new session, then the turn
                async with http.post("/v1/sessions", json={"agentName": "echo"}) as created:
                    session_id = (await created.json())["session"]["sessionId"]
            path, body = _request(surface, session_id)
            async with http.post(path, json=body) as response:
                await response.read()
                failed += response.status != 200

    await asyncio.gather(*(loop(n) for n in range(concurrency)))
    return failed


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, object]:
    bench = Bench(workdir, turns=0, smoke=False)
    bench.start()
    try:
        speed = await bench.grpc_cell("baseline", 16, min(4000, args.turns * 4), [])
        sessions = await bench.sessions(args.concurrency)
        pids = {
            "server": bench.server.pid,
            "worker": bench.worker.pid,
            "envoy": bench.envoy.proc.pid,
        }
        cpu: dict[str, dict[str, float]] = {s: dict.fromkeys(pids, 0.0) for s in SURFACES}
        done = dict.fromkeys(SURFACES, 0)
        failures = dict.fromkeys(SURFACES, 0)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(
            f"http://{bench.envoy.listener_address}", connector=connector
        ) as http:
            surfaces = tuple(s for s in SURFACES if s in args.surfaces)
            for surface in surfaces:  # warm-up: every path once
                await run_surface(http, surface, args.concurrency, args.concurrency, sessions)
            per_round = max(1, args.turns // args.rounds)
            for round_ in range(args.rounds):
                order = surfaces if round_ % 2 == 0 else tuple(reversed(surfaces))
                for surface in order:
                    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
                    failures[surface] += await run_surface(
                        http, surface, per_round, args.concurrency, sessions
                    )
                    for name, pid in pids.items():
                        cpu[surface][name] += cpu_seconds(pid) - before[name]
                    done[surface] += per_round
    finally:
        bench.stop()
    per_turn = {
        s: {name: round(seconds * 1000 / done[s], 3) for name, seconds in cpu[s].items()}
        for s in surfaces
    }
    native = per_turn.get("native-rest", {}).get("server") or float("nan")
    return {
        "baseline_turns_per_s": round(speed.turns_per_s, 1),
        "turns_per_surface": done,
        "concurrency": args.concurrency,
        "failed": failures,
        "cpu_ms_per_turn": per_turn,
        "server_cpu_ratio_to_native_rest": {
            s: round(per_turn[s]["server"] / native, 2) for s in surfaces
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=4000, help="per surface")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--surfaces", nargs="+", choices=SURFACES, default=list(SURFACES))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(measure(args, Path(tmp)))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
