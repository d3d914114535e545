"""The baseline: a bare single-process grpc.aio server that streams the same
events, of the same sizes, as a client of the mesh receives for one echo turn
(RUN_STARTED to RUN_FINISHED, numbered). Nothing in Python can serve a
streamed turn over one gRPC hop faster on this machine.

Usage: python -m bench.baseline --port 0 --ready-file PATH
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypedDict

import grpc

from turnmesh.runtime.serving import SERVER_OPTIONS, write_ready_file
from turnmesh.v1 import event_pb2, worker_service_pb2, worker_service_pb2_grpc


class BaselineWorker(worker_service_pb2_grpc.WorkerServiceServicer):
    """Streams what EchoAgent streams, one message per event (as the public
    stream does): RUN_STARTED, a text message word by word, RUN_FINISHED with
    usage; no agent, no emitter, no queue."""

    async def Run(
        self, request: worker_service_pb2.RunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[worker_service_pb2.RunResponse]:
        for event in _events(request):
            yield worker_service_pb2.RunResponse(events=[event])


class _Ids(TypedDict):
    thread_id: str
    run_id: str
    timestamp: float


def _events(request: worker_service_pb2.RunRequest) -> list[event_pb2.Event]:
    now = float(time.time_ns() // 1_000_000)
    ids: _Ids = {"thread_id": request.session_id, "run_id": request.turn_id, "timestamp": now}
    message_id = "01JBASELINEMESSAGE00000000"
    repeat = 1
    if "repeat" in request.metadata.fields:
        repeat = int(request.metadata.fields["repeat"].number_value)
    text = " ".join(["\n\n".join(request.messages)] * repeat)
    events = [
        event_pb2.Event(type=event_pb2.RUN_STARTED, **ids),
        event_pb2.Event(
            type=event_pb2.TEXT_MESSAGE_START, message_id=message_id, role="assistant", **ids
        ),
    ]
    events += [
        event_pb2.Event(
            type=event_pb2.TEXT_MESSAGE_CONTENT, message_id=message_id, delta=word + " ", **ids
        )
        for word in text.split(" ")
    ]
    events.append(event_pb2.Event(type=event_pb2.TEXT_MESSAGE_END, message_id=message_id, **ids))
    done = event_pb2.Event(type=event_pb2.RUN_FINISHED, **ids)
    words = len(text.split())
    done.usage.add(input_tokens=words, output_tokens=words, total_tokens=2 * words)
    events.append(done)
    for seq, event in enumerate(events, start=1):
        event.seq = seq
    return events


async def serve(port: int, ready_file: Path) -> None:
    server = grpc.aio.server(options=SERVER_OPTIONS)
    # Abstract only in the mypy-protobuf stubs: at runtime GetInfo answers UNIMPLEMENTED.
    worker = BaselineWorker()  # type: ignore[abstract]
    worker_service_pb2_grpc.add_WorkerServiceServicer_to_server(worker, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    write_ready_file(str(ready_file), address=f"127.0.0.1:{bound}", pid=os.getpid())
    await server.wait_for_termination()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file", type=Path, required=True)
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args.port, args.ready_file))
    else:  # the same event loop the mesh runs on, for a fair baseline
        uvloop.run(serve(args.port, args.ready_file))
