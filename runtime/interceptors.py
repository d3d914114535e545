"""Server interceptors shared by every turnmesh service."""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from turnmesh.runtime.errors import TurnmeshError, Unauthenticated

log = logging.getLogger(__name__)

ADMIN_KEY_METADATA = "x-turnmesh-admin-key"

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):
    """Turns TurnmeshError into a status with google.rpc details; anything
    else into INTERNAL with a generic message, logged with its traceback here
    and never sent to the client."""

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if handler.unary_unary is not None:
            inner_uu = handler.unary_unary

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                try:
                    return await inner_uu(request, context)
                except Exception as exc:
                    await _abort(context, exc, method)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream

            async def unary_stream(
                request: Any, context: grpc.aio.ServicerContext
            ) -> AsyncIterator[Any]:
                try:
                    async for item in inner_us(request, context):
                        yield item
                except Exception as exc:
                    await _abort(context, exc, method)

            return grpc.unary_stream_rpc_method_handler(
                unary_stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


async def _abort(context: grpc.aio.ServicerContext, exc: Exception, method: str) -> None:
    if isinstance(exc, TurnmeshError):
        status = exc.to_status()
    elif _is_abort(exc):
        raise exc  # context.abort() already set the status
    else:
        log.exception("unhandled error in %s", method)
        status = TurnmeshError("internal error").to_status()
    await context.abort(status.code, status.details, status.trailing_metadata)


def _is_abort(exc: Exception) -> bool:
    # grpc.aio raises AbortError from context.abort(); it is not public API.
    return type(exc).__name__ == "AbortError"


class AdminKeyInterceptor(grpc.aio.ServerInterceptor):
    """Requires the admin key on the listed methods (when a key is set)."""

    def __init__(self, admin_key: str | None, protected_methods: frozenset[str]) -> None:
        self._key = admin_key.encode() if admin_key else None
        self._protected = protected_methods

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        if self._key is None or handler_call_details.method not in self._protected:
            return await continuation(handler_call_details)
        supplied = b""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == ADMIN_KEY_METADATA:
                supplied = value.encode() if isinstance(value, str) else value
        if hmac.compare_digest(supplied, self._key):
            return await continuation(handler_call_details)
        status = Unauthenticated("missing or wrong admin key").to_status()

        async def deny(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(status.code, status.details, status.trailing_metadata)

        return grpc.unary_unary_rpc_method_handler(deny)
