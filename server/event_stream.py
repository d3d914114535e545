"""``EventStreamService``: the REST event streams (the edge routes
``POST /v1/sessions/{id}/turns`` and ``GET .../turns/{turn}/events`` here).

The same calls as ``SessionService.Turn`` and ``SubscribeTurn`` (the session
servicer does the work), answered as SSE messages that carry every event
ready at once (``runtime/sse.py`` prints them as the transcoder would), so a
busy server sends one message, and Envoy forwards one chunk, for many events.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

from google.api import httpbody_pb2

from turnmesh.runtime.handlers import ServicerContext
from turnmesh.server.service import SessionServicer
from turnmesh.v1 import session_service_pb2 as spb
from turnmesh.v1.event_stream_pb2_grpc import EventStreamServiceServicer


class EventStreamServicer(EventStreamServiceServicer):
    def __init__(self, sessions: SessionServicer) -> None:
        self._sessions = sessions

    async def StreamTurn(
        self, request: spb.TurnRequest, context: ServicerContext
    ) -> AsyncGenerator[httpbody_pb2.HttpBody, None]:
        bodies = await self._sessions.turn_sse(request, context)
        async with contextlib.aclosing(bodies):
            async for body in bodies:
                yield body

    async def StreamSubscribeTurn(
        self, request: spb.SubscribeTurnRequest, context: ServicerContext
    ) -> AsyncGenerator[httpbody_pb2.HttpBody, None]:
        bodies = await self._sessions.subscribe_sse(request, context)
        async with contextlib.aclosing(bodies):
            async for body in bodies:
                yield body
