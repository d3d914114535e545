"""What one token-paced word costs a Python process at the least (issue 36).

Each mode is a bare sender in a process of its own (uvloop) streaming paced
words to one client process on loopback: ``--streams`` streams, a word every
``--pace-ms`` per stream (random phase), ``--words`` words each. Reported:
the sender's CPU per word, from /proc, with nothing of turnmesh in it, and
the receiving client's (grpc.aio, or asyncio streams for plain TCP).

- ``grpc``: a grpc.aio server, each stream a handler that yields an HttpBody
  (one SSE frame) per word: one Python gRPC message per word, as every hop of
  the mesh sends under paced load (a worker's ``Run``, a server's REST stream).
- ``tasks``: plain TCP, a task per stream that sleeps and writes each frame to
  its socket: the least a per-stream Python relay does (a wake-up and a write).
- ``pump``: plain TCP, one task for all streams that wakes every ``--tick-ms``
  and writes every frame due: words of many streams per wake-up, as a relay
  fed by a cross-stream batched hop would.
- ``stream_layers``: ``grpc`` with four pass-through async-generator layers
  around the handler, as the server's interceptors add (``--layers``).

Usage: python -m bench.floors [--smoke] [--streams 500] [--words 40]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import resource
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from multiprocessing.connection import Connection
from typing import Any

import grpc
import uvloop
from google.api import httpbody_pb2

FRAME = b'data: {"type":"TEXT_MESSAGE_CONTENT","delta":"word "}\n\n'
MODES = ("grpc", "stream_layers", "tasks", "pump")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- senders ---------------------------------------------------------------------


def _grpc_handler(
    words: int, pace: float, layers: int
) -> Callable[[bytes, Any], AsyncIterator[httpbody_pb2.HttpBody]]:
    async def paced(request: bytes, context: Any) -> AsyncIterator[httpbody_pb2.HttpBody]:
        await asyncio.sleep(random.random() * pace)
        for _ in range(words):
            yield httpbody_pb2.HttpBody(content_type="text/event-stream", data=FRAME)
            await asyncio.sleep(pace)

    Handler = Callable[[bytes, Any], AsyncIterator[httpbody_pb2.HttpBody]]
    handler: Handler = paced
    for _ in range(layers):

        def layer(inner: Handler) -> Handler:
            async def passed(request: bytes, context: Any) -> AsyncIterator[httpbody_pb2.HttpBody]:
                async for item in inner(request, context):
                    yield item

            return passed

        handler = layer(handler)
    return handler


async def _serve_grpc(port: int, words: int, pace: float, layers: int, ready: Connection) -> None:
    server = grpc.aio.server()
    method = grpc.unary_stream_rpc_method_handler(
        _grpc_handler(words, pace, layers),
        request_deserializer=bytes,
        response_serializer=httpbody_pb2.HttpBody.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("floors.Paced", {"Stream": method})]
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    ready.send(True)
    await server.wait_for_termination()


async def _serve_tcp(
    port: int, words: int, pace: float, pump_tick: float | None, ready: Connection
) -> None:
    due: list[tuple[float, int, asyncio.StreamWriter]] = []
    loop = asyncio.get_running_loop()

    async def per_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(random.random() * pace)
        for _ in range(words):
            writer.write(FRAME)
            await asyncio.sleep(pace)
        writer.close()

    async def pumped(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        due.append((loop.time() + random.random() * pace, words, writer))

    async def pump(tick: float) -> None:
        while True:
            await asyncio.sleep(tick)
            now = loop.time()
            kept: list[tuple[float, int, asyncio.StreamWriter]] = []
            for at, left, writer in due:
                if at > now:
                    kept.append((at, left, writer))
                    continue
                writer.write(FRAME)
                if left > 1:
                    kept.append((at + pace, left - 1, writer))
                else:
                    writer.close()
            due[:] = kept

    handler = per_stream if pump_tick is None else pumped
    server = await asyncio.start_server(handler, "127.0.0.1", port, backlog=4096)
    pumping = loop.create_task(pump(pump_tick)) if pump_tick is not None else None
    ready.send(True)
    async with server:
        await server.serve_forever()
    if pumping is not None:
        pumping.cancel()


def _sender(mode: str, port: int, args: argparse.Namespace, ready: Connection) -> None:
    pace = args.pace_ms / 1000
    if mode in ("grpc", "stream_layers"):
        layers = args.layers if mode == "stream_layers" else 0
        uvloop.run(_serve_grpc(port, args.words, pace, layers, ready))
    else:
        tick = args.tick_ms / 1000 if mode == "pump" else None
        uvloop.run(_serve_tcp(port, args.words, pace, tick, ready))


# -- the client ------------------------------------------------------------------


async def _receive_grpc(port: int, streams: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_stream(
            "/floors.Paced/Stream", request_serializer=bytes, response_deserializer=bytes
        )

        async def one() -> int:
            return sum([1 async for _ in call(b"")])

        return sum(await asyncio.gather(*(one() for _ in range(streams))))


async def _receive_tcp(port: int, streams: int) -> int:
    async def one() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        received = 0
        while chunk := await reader.read(65536):
            received += len(chunk)
        writer.close()
        return received // len(FRAME)

    return sum(await asyncio.gather(*(one() for _ in range(streams))))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(mode: str, args: argparse.Namespace) -> tuple[float, float, int]:
    """(the sender's and the receiver's CPU ms per word, words received) for
    one run of ``mode``."""
    port = _free_port()
    ours, theirs = multiprocessing.Pipe()
    sender = multiprocessing.Process(target=_sender, args=(mode, port, args, theirs))
    sender.start()
    try:
        if not ours.poll(60):
            raise RuntimeError(f"the {mode} sender did not start")
        ours.recv()
        receive = _receive_grpc if mode in ("grpc", "stream_layers") else _receive_tcp
        assert sender.pid is not None
        before, own_before = _cpu_seconds(sender.pid), _own_cpu_seconds()
        words = uvloop.run(receive(port, args.streams))
        spent = _cpu_seconds(sender.pid) - before
        received = _own_cpu_seconds() - own_before
    finally:
        sender.kill()
        sender.join()
    return spent * 1000 / max(words, 1), received * 1000 / max(words, 1), words


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--words", type=int, default=40)
    parser.add_argument("--pace-ms", type=float, default=40.0)
    parser.add_argument("--tick-ms", type=float, default=5.0)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="20 streams, 5 words, 1 round")
    args = parser.parse_args(argv)
    if args.smoke:
        args.streams, args.words, args.rounds = 20, 5, 1
    results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    started = time.time()
    for _ in range(args.rounds):
        for mode in MODES:  # interleaved, so a slow minute touches every mode
            sent, received, words = measure(mode, args)
            if words != args.streams * args.words:
                sys.exit(f"{mode}: {words} words arrived of {args.streams * args.words}")
            results[mode].append((sent, received))
    print(
        f"{args.streams} streams x {args.words} words, one every {args.pace_ms:g} ms,"
        f" {args.rounds} rounds, {time.time() - started:.0f} s"
    )
    print("| sender | its CPU ms per word, each round | the receiver's, each round |")
    print("|---|---|---|")
    for mode, values in results.items():
        sent_text = " / ".join(f"{v[0]:.4f}" for v in values)
        received_text = " / ".join(f"{v[1]:.4f}" for v in values)
        print(f"| {mode} | {sent_text} | {received_text} |")


if __name__ == "__main__":
    main()
