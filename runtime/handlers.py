"""grpc.aio's server-side types, and wrapping a method handler.

grpc's stubs describe method handlers for the synchronous server; grpc.aio
puts coroutine functions (and async generators) in the same slots. This is the
one place that says so: interceptors wrap handlers with ``wrap`` and name
their parts with these aliases.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias, cast

import grpc

ServerInterceptor: TypeAlias = grpc.aio.ServerInterceptor

ServicerContext: TypeAlias = grpc.aio.ServicerContext[Any, Any]
# A string: grpc.RpcMethodHandler is generic in the stubs only.
MethodHandler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
Continuation: TypeAlias = Callable[[grpc.HandlerCallDetails], Awaitable["MethodHandler | None"]]
# What a unary-unary and a unary-stream method runs, on grpc.aio.
Unary: TypeAlias = Callable[[Any, ServicerContext], Awaitable[Any]]
Stream: TypeAlias = Callable[[Any, ServicerContext], AsyncIterator[Any]]


def wrap(
    handler: MethodHandler,
    unary: Callable[[Unary], Unary],
    stream: Callable[[Stream], Stream],
) -> MethodHandler:
    """The handler with its behaviour wrapped: ``unary`` for a method with
    one response, ``stream`` for a streamed one. A streamed request (reflection
    is a bidi stream) passes through as the first argument, so every kind of
    method is wrapped: none slips past an interceptor."""
    codec = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        behaviour = unary(cast(Unary, handler.unary_unary))
        return grpc.unary_unary_rpc_method_handler(cast(Any, behaviour), **codec)
    if handler.unary_stream is not None:
        streamed = stream(cast(Stream, handler.unary_stream))
        return grpc.unary_stream_rpc_method_handler(cast(Any, streamed), **codec)
    if handler.stream_unary is not None:
        behaviour = unary(cast(Unary, handler.stream_unary))
        return grpc.stream_unary_rpc_method_handler(cast(Any, behaviour), **codec)
    assert handler.stream_stream is not None
    streamed = stream(cast(Stream, handler.stream_stream))
    return grpc.stream_stream_rpc_method_handler(cast(Any, streamed), **codec)
