"""Calls between servers for A2A task records, which live in the session
store beside their session: read and written on the session's owner, listed
on every server (``SessionServicer.get_task_record`` and the two beside it).

No public contract carries them, so they are not in the proto (whose
services are the public API): three unary methods under an internal service
name, JSON bytes in and out, served only to a call another mesh member
forwarded (``handler``), so a client that reaches a server directly can
neither read nor write a record this way.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from turnmesh.runtime.handlers import ServicerContext
from turnmesh.v1.event_stream_pb2_grpc import EventStreamServiceStub
from turnmesh.v1.session_service_pb2_grpc import SessionServiceStub

if TYPE_CHECKING:
    from turnmesh.v1.event_stream_pb2_grpc import EventStreamServiceAsyncStub
    from turnmesh.v1.session_service_pb2_grpc import SessionServiceAsyncStub as _Stub
else:
    _Stub = SessionServiceStub

SERVICE = "turnmesh.internal.A2ATaskRecords"
GET, PUT, LIST = (f"/{SERVICE}/{name}" for name in ("Get", "Put", "List"))

Call = Callable[[Any, ServicerContext], Awaitable[Any]]


class OwnerStub(_Stub):
    """Another server's SessionService, and its channel for these calls."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        super().__init__(channel)
        self.channel = channel
        # The REST event streams (EventStreamService), forwarded as they are.
        self.events: EventStreamServiceAsyncStub = EventStreamServiceStub(channel)


def call(
    stub: object, method: str, payload: Any, metadata: Sequence[tuple[str, str]], timeout: float
) -> grpc.aio.UnaryUnaryCall[bytes, bytes]:
    """One of these calls to the server ``stub`` reaches (a router's stub)."""
    if not isinstance(stub, OwnerStub):
        raise TypeError("A2A task records are asked of another server by its OwnerStub")
    multicallable: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = stub.channel.unary_unary(method)
    return multicallable(json.dumps(payload).encode(), metadata=tuple(metadata), timeout=timeout)


def decoded(answer: bytes) -> Any:
    return json.loads(answer)


def handler(
    forwarded: Callable[[ServicerContext], bool], methods: dict[str, Callable[..., Awaitable[Any]]]
) -> grpc.GenericRpcHandler:
    """The three methods, each ``methods[name](*payload, context)`` with the
    request's JSON list as arguments, its answer as JSON."""

    def served(method: Callable[..., Awaitable[Any]]) -> Call:
        async def serve(request: bytes, context: ServicerContext) -> bytes:
            if not forwarded(context):
                await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            try:
                arguments = json.loads(request)
            except ValueError:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "not JSON")
            return json.dumps(await method(*arguments, context)).encode()

        return serve

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            name: grpc.unary_unary_rpc_method_handler(served(method))
            for name, method in methods.items()
        },
    )
