"""One client process of the paced-stream benchmarks (bench/paced.py,
bench/peers.py): one conversation per session, each a loop of turns whose echo
agent says one word every ``--delay-ms``; it notes when each word arrives and
prints, as JSON, the gaps between words beyond the agent's own pace, failed
turns, and its CPU.

REST runs through Envoy with aiohttp (SSE lines), gRPC straight to a session
server with grpc.aio; both on uvloop, the lightest clients Python has, so the
client is not what the benchmark measures (its CPU is reported to show it).
"langgraph" is the same aiohttp client against LangGraph's Agent Server: a run
on a kept thread (POST /threads/{id}/runs/stream, stream mode
"messages-tuple"), the session file holding thread ids; ``--graph`` names the
graph (bench/peer_graphs).

Usage: python -m bench.paced_client --target ADDR --kind rest|grpc|langgraph
       --sessions FILE --turns T --words W --delay-ms D [--graph paced|echo]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import resource
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import grpc

from turnmesh.runtime.serving import CHANNEL_OPTIONS
from turnmesh.v1 import event_pb2
from turnmesh.v1 import session_service_pb2 as spb
from turnmesh.v1.session_service_pb2_grpc import SessionServiceStub

DELTA = event_pb2.TEXT_MESSAGE_CONTENT
# A turn that takes this long has failed (the paced turn takes ~1.6 s).
TURN_TIMEOUT_S = 120.0


def message(words: int) -> str:
    return " ".join(f"w{i}" for i in range(words))


def cpu_now() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run(args: argparse.Namespace, sessions: list[str]) -> dict[str, object]:
    text = message(args.words)
    gaps: list[float] = []
    firsts: list[float] = []  # ms from the request to the first word
    durations: list[float] = []  # ms from the request to the last word
    ends: list[float] = []  # ms from the request to the end of its stream
    failures: Counter[str] = Counter()
    events = 0
    deltas = 0
    words = 0  # a delta of turnmesh's echo agent is a word; the peer's may hold several
    delay = args.delay_ms / 1000

    def note(started: float, arrivals: list[float], said: int | None = None) -> None:
        nonlocal deltas, words
        deltas += len(arrivals)
        words += len(arrivals) if said is None else said
        ends.append((time.perf_counter() - started) * 1000)
        if arrivals:
            firsts.append((arrivals[0] - started) * 1000)
            durations.append((arrivals[-1] - started) * 1000)
        gaps.extend(
            max(0.0, (later - earlier - delay) * 1000)
            for earlier, later in itertools.pairwise(arrivals)
        )

    if args.kind in ("rest", "langgraph"):
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        http = aiohttp.ClientSession(
            f"http://{args.target}",
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=TURN_TIMEOUT_S),
        )
        headers = {"content-type": "application/json"}

        async def close() -> None:
            await http.close()

    if args.kind == "rest":
        body = json.dumps({"message": text, "metadata": {"delay_ms": args.delay_ms}})

        async def turn(session_id: str) -> None:
            nonlocal events
            arrivals: list[float] = []
            started = time.perf_counter()
            async with http.post(
                f"/v1/sessions/{session_id}/turns", data=body, headers=headers
            ) as response:
                if response.status != 200:
                    failures[f"HTTP {response.status}"] += 1
                    await response.read()
                    return
                finished = False
                async for line in response.content:
                    if not line.startswith(b"data: "):
                        continue
                    events += 1
                    if b'"delta"' in line:
                        arrivals.append(time.perf_counter())
                    elif b"RUN_FINISHED" in line:
                        finished = True
                    elif b"RUN_ERROR" in line:
                        failures["RUN_ERROR"] += 1
                        return
                if not finished:
                    failures["cut short"] += 1
            note(started, arrivals)

    elif args.kind == "langgraph":
        run_body = json.dumps(
            {
                "assistant_id": args.graph,
                "input": {"messages": [{"role": "user", "content": text}]},
                "stream_mode": ["messages-tuple"],
                "config": {"configurable": {"delay_ms": args.delay_ms}},
            }
        )

        async def turn(session_id: str) -> None:
            nonlocal events
            arrivals: list[float] = []
            said = 0
            started = time.perf_counter()
            async with http.post(
                f"/threads/{session_id}/runs/stream", data=run_body, headers=headers
            ) as response:
                if response.status != 200:
                    failures[f"HTTP {response.status}"] += 1
                    await response.read()
                    return
                event = b""
                async for line in response.content:
                    if line.startswith(b"event: "):
                        event = line[7:].strip()
                    elif not line.startswith(b"data: "):
                        continue
                    elif event == b"messages":
                        events += 1
                        content = json.loads(line[6:])[0].get("content")
                        if isinstance(content, str) and content:
                            arrivals.append(time.perf_counter())
                            said += len(content.split())
                    elif event == b"error":
                        failures["error"] += 1
                        return
            if said < args.words:
                failures["cut short"] += 1
            note(started, arrivals, said)
    else:
        channel = grpc.aio.insecure_channel(args.target, options=CHANNEL_OPTIONS)
        stub = SessionServiceStub(channel)

        async def turn(session_id: str) -> None:
            nonlocal events
            arrivals: list[float] = []
            request = spb.TurnRequest(session_id=session_id, message=text)
            request.metadata.update({"delay_ms": args.delay_ms})
            started = time.perf_counter()
            try:
                async for event in stub.Turn(request, timeout=TURN_TIMEOUT_S):
                    events += 1
                    if event.type == DELTA:
                        arrivals.append(time.perf_counter())
            except grpc.aio.AioRpcError as exc:
                failures[exc.code().name] += 1
                return
            note(started, arrivals)

        async def close() -> None:
            await channel.close()

    async def conversation(session_id: str, call: Callable[[str], Awaitable[None]]) -> None:
        for _ in range(args.turns):
            try:
                await call(session_id)
            except (aiohttp.ClientError, TimeoutError) as exc:
                failures[type(exc).__name__] += 1

    cpu_before = cpu_now()
    started = time.perf_counter()
    await asyncio.gather(*(conversation(sid, turn) for sid in sessions))
    wall = time.perf_counter() - started
    cpu = cpu_now() - cpu_before
    await close()
    return {
        "added_gap_ms": gaps,
        "first_word_ms": firsts,
        "turn_ms": durations,
        "end_ms": ends,
        "events": events,
        "deltas": deltas,
        "words": words,
        "turns": len(sessions) * args.turns,
        "failed": dict(failures),
        "wall_s": wall,
        "cpu_s": cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--kind", choices=["rest", "grpc", "langgraph"], required=True)
    parser.add_argument("--sessions", required=True, help="a file of session ids")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--words", type=int, default=40)
    parser.add_argument("--delay-ms", type=int, default=40)
    parser.add_argument("--graph", default="paced", help="the peer's graph (--kind langgraph)")
    args = parser.parse_args()
    import uvloop

    sessions = Path(args.sessions).read_text().split()
    json.dump(uvloop.run(run(args, sessions)), sys.stdout)


if __name__ == "__main__":
    main()
