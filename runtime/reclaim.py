"""After large requests, free heap memory goes back to the system.

Reading a message of megabytes, grpc allocates it in slices, in its own
threads' heaps; the slices are freed once the message is whole, but a small
block allocated meanwhile above them keeps a heap from shrinking, so their
pages stayed resident (tens of MiB after twenty 20 MiB bodies, up to a
message's size per heap). ``malloc_trim`` returns them; it walks every
heap's free blocks, in a thread (it runs without the GIL). One trim at a
time, the next only after more large requests ended.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from turnmesh.runtime import wire
from turnmesh.runtime.handlers import (
    Continuation,
    MethodHandler,
    ServerInterceptor,
    ServicerContext,
    Stream,
    Unary,
    wrap,
)
from turnmesh.runtime.memory import malloc_trim

log = logging.getLogger(__name__)

# A request of this size or more leaves enough behind to be worth a trim.
LARGE_REQUEST_BYTES = 1024 * 1024
# From a large request's end to the trim: grpc frees what it held of the
# call (its message, its slices) once the status is sent, after the handler.
TRIM_DELAY_SECONDS = 0.5


class Trimmer:
    """Trims a while after large requests end, one trim at a time."""

    def __init__(self, delay: float = TRIM_DELAY_SECONDS) -> None:
        self._trim = malloc_trim()
        self._delay = delay
        self._wanted: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def request_ended(self, size: int | None) -> None:
        if self._trim is None or size is None or size < LARGE_REQUEST_BYTES:
            return
        if self._wanted is None:
            self._wanted = asyncio.Event()
        self._wanted.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="memory-trim")

    async def _run(self) -> None:
        assert self._wanted is not None and self._trim is not None
        while True:
            await self._wanted.wait()
            await asyncio.sleep(self._delay)
            self._wanted.clear()
            try:
                await asyncio.to_thread(self._trim)
            except Exception:  # never fatal: memory stays as it was
                log.warning("could not trim the heaps", exc_info=True)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


class ReclaimInterceptor(ServerInterceptor):
    """Tells the trimmer when a call that received a large request ends
    (its size, as decoded: ``wire.received_bytes``)."""

    def __init__(self, trimmer: Trimmer) -> None:
        self._trimmer = trimmer

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> MethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        trimmer = self._trimmer

        # The request is handed on, not kept: an aborted call's frames stay
        # in a reference cycle with grpc's state of the call, theirs too.
        def unary(inner: Unary) -> Unary:
            async def reclaimed(request: Any, context: ServicerContext) -> Any:
                answer = inner(request, context)
                del request
                try:
                    return await answer
                finally:
                    trimmer.request_ended(wire.received_bytes())

            return reclaimed

        def stream(inner: Stream) -> Stream:
            async def reclaimed(request: Any, context: ServicerContext) -> AsyncIterator[Any]:
                items = inner(request, context)
                del request
                try:
                    async for item in items:
                        yield item
                finally:
                    trimmer.request_ended(wire.received_bytes())

            return reclaimed

        return wrap(handler, unary, stream)
