"""Interceptors wrap every kind of method: none slips past one (an API-key
check on a client- or bidi-streaming method, say)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from turnmesh.runtime.auth import ApiKeys
from turnmesh.runtime.handlers import MethodHandler, Stream, Unary, wrap
from turnmesh.runtime.interceptors import ApiKeyInterceptor


async def _one(request: Any, context: Any) -> str:
    return "inner"


async def _many(request: Any, context: Any) -> AsyncIterator[str]:
    yield "inner"


KINDS: dict[str, MethodHandler] = {
    "unary_unary": grpc.unary_unary_rpc_method_handler(_one),
    "unary_stream": grpc.unary_stream_rpc_method_handler(_many),
    "stream_unary": grpc.stream_unary_rpc_method_handler(_one),
    "stream_stream": grpc.stream_stream_rpc_method_handler(_many),
}


def _kind(handler: MethodHandler) -> str:
    (kind,) = [k for k in KINDS if getattr(handler, k) is not None]
    return kind


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_every_kind_of_method_is_wrapped(kind: str) -> None:
    wrapped: list[str] = []

    def unary(inner: Unary) -> Unary:
        async def call(request: Any, context: Any) -> Any:
            wrapped.append("unary")
            return await inner(request, context)

        return call

    def stream(inner: Stream) -> Stream:
        async def call(request: Any, context: Any) -> AsyncIterator[Any]:
            wrapped.append("stream")
            async for item in inner(request, context):
                yield item

        return call

    handler = wrap(KINDS[kind], unary, stream)
    assert _kind(handler) == kind
    behaviour: Any = getattr(handler, kind)
    if kind.endswith("_unary"):
        assert await behaviour(None, None) == "inner"
        assert wrapped == ["unary"]
    else:
        assert [item async for item in behaviour(None, None)] == ["inner"]
        assert wrapped == ["stream"]


class _Aborted(Exception):
    """What the fake context's abort raises."""


class _Context:
    def __init__(self) -> None:
        self.code: grpc.StatusCode | None = None

    async def abort(self, code: grpc.StatusCode, details: str, trailers: Any) -> None:
        self.code = code
        raise _Aborted


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_a_call_without_a_key_is_refused_whatever_its_kind(kind: str) -> None:
    interceptor = ApiKeyInterceptor(ApiKeys(["the-key"], None), frozenset(), None)

    async def continuation(details: grpc.HandlerCallDetails) -> MethodHandler:
        return KINDS[kind]

    details: Any = type("Details", (), {"method": "/x.Y/Z", "invocation_metadata": ()})()
    handler = await interceptor.intercept_service(continuation, details)
    # The refusal takes the request as a stream, so it is never read (a unary
    # request would be received whole first); the response keeps its kind.
    refusal = "stream_" + kind.split("_")[1]
    assert handler is not None and _kind(handler) == refusal
    behaviour: Any = getattr(handler, refusal)
    context = _Context()

    async def call() -> None:
        if kind.endswith("_unary"):
            await behaviour(None, context)
        else:
            async for _ in behaviour(None, context):
                pass

    with pytest.raises(_Aborted):
        await call()
    assert context.code == grpc.StatusCode.UNAUTHENTICATED
