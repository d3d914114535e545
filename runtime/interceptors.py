"""Server interceptors shared by every turnmesh service."""

from __future__ import annotations

import hmac
import logging
import math
import traceback
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn, cast

import grpc

from turnmesh.runtime import principals, receipts, requests, sanitize, wire
from turnmesh.runtime.auth import ApiKeys, authenticate, bearer
from turnmesh.runtime.errors import (
    FieldViolation,
    InvalidArgument,
    InvalidParams,
    RateLimited,
    TurnmeshError,
    Unauthenticated,
)
from turnmesh.runtime.handlers import (
    Continuation,
    MethodHandler,
    ServerInterceptor,
    ServicerContext,
    Stream,
    Unary,
    wrap,
)
from turnmesh.runtime.principals import (
    ANONYMOUS_PRINCIPAL,
    PRINCIPAL_METADATA,
    Principal,
)
from turnmesh.runtime.ratelimit import RequestRates
from turnmesh.runtime.receipts import ReceiptSlots

log = logging.getLogger(__name__)

MESH_KEY_METADATA = "x-turnmesh-mesh-key"


class ErrorMappingInterceptor(ServerInterceptor):
    """Turns TurnmeshError into a status with google.rpc details; anything
    else into INTERNAL with a generic message, logged with its traceback here
    and never sent to the client."""

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> MethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method

        # The request is handed on, not kept (the handler keeps it or drops
        # it), nor kept by the abort's reference cycle (``_abort``).
        def unary(inner: Unary) -> Unary:
            async def mapped(request: Any, context: ServicerContext) -> Any:
                try:
                    _decoded(request, method)
                    answer = inner(request, context)
                    request = None
                    return await answer
                except Exception as exc:
                    request = None
                    await _abort(context, exc, method)

            return mapped

        def stream(inner: Stream) -> Stream:
            async def mapped(request: Any, context: ServicerContext) -> AsyncIterator[Any]:
                try:
                    _decoded(request, method)
                    items = inner(request, context)
                    request = None
                    async for item in items:
                        yield item
                except Exception as exc:
                    request = None
                    await _abort(context, exc, method)

            return mapped

        wrapped = wrap(handler, unary, stream)
        if handler.unary_unary is None and handler.unary_stream is None:
            return wrapped  # a streamed request: its messages decode as they come
        # grpc answers a request it cannot decode (nested past protobuf's depth
        # limit, say) with UNKNOWN and the parser's text; this makes it a 400.
        tolerant: MethodHandler = cast(Any, wrapped)._replace(
            request_deserializer=_tolerant(handler.request_deserializer)
        )
        return tolerant


class ReceiptInterceptor(ServerInterceptor):
    """Reads a unary request only once its principal has a receipt slot
    (``runtime.receipts``): the method is served as a streamed request, which
    grpc does not read until asked, so a request waiting for a slot costs its
    headers and a flow-control window, not its size. Open methods (health,
    the edge's key check), streamed requests and mesh members' calls (read
    under a slot where they came in) pass untouched. On a keyless mesh every
    caller is the anonymous principal, so there the slots are each
    connection's: one client's slow senders never hold up another's. The
    ``decoded_later`` methods keep their slot until the handler has decoded
    the body (``receipts.decoded``), or ends."""

    def __init__(
        self,
        slots: ReceiptSlots,
        open_methods: frozenset[str],
        mesh_key: str | None = None,
        *,
        decoded_later: frozenset[str] = frozenset(),
    ) -> None:
        self._slots = slots
        self._open = open_methods
        self._mesh_key = mesh_key.encode() if mesh_key else None
        self._decoded_later = decoded_later

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> MethodHandler | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method in self._open or method.startswith(OPEN_PREFIXES):
            return handler
        if self._mesh_key is not None and has_mesh_key(
            handler_call_details.invocation_metadata or (), self._mesh_key
        ):
            return handler
        slots = self._slots
        decoded_later = method in self._decoded_later

        async def receive(requests: Any, context: ServicerContext) -> Any:
            principal = principals.current()
            key = principal.name if principal != ANONYMOUS_PRINCIPAL else f" {context.peer()}"
            try:
                slot = await slots.acquire(key)
            except TurnmeshError as exc:
                await _abort(context, exc, method)
            try:
                request = await context.read()
            except BaseException:
                slot.release()  # its caller went away
                raise
            if decoded_later:
                receipts.keep_until_decoded(slot)
            else:
                slot.release()  # arrived
            if request is grpc.aio.EOF:
                empty = InvalidArgument([FieldViolation("request", "no message was sent")])
                await _abort(context, empty, method)
            return request

        codec: dict[str, Any] = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            inner_unary = cast(Unary, handler.unary_unary)

            async def unary(requests: Any, context: ServicerContext) -> Any:
                try:
                    return await inner_unary(await receive(requests, context), context)
                finally:
                    receipts.decoded()

            return grpc.stream_unary_rpc_method_handler(unary, **codec)
        if handler.unary_stream is not None:
            inner_stream = cast(Stream, handler.unary_stream)

            async def stream(requests: Any, context: ServicerContext) -> AsyncIterator[Any]:
                try:
                    async for item in inner_stream(await receive(requests, context), context):
                        yield item
                finally:
                    receipts.decoded()

            return grpc.stream_stream_rpc_method_handler(stream, **codec)
        return handler  # a streamed request: its messages are read as they come


class _Undecodable:
    """What a request that could not be decoded arrives as."""


UNDECODABLE = _Undecodable()


def _tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def decode(data: bytes) -> Any:
        wire.note_received(len(data))  # a request's size, known without copying its files
        try:
            return deserialize(data)
        except Exception:  # DecodeError, or nesting past the decoder's limit
            return UNDECODABLE

    return decode


# A2A's callers read its InvalidParams (A2A's ErrorInfo) where others read
# INVALID_ARGUMENT alone.
A2A_METHOD_PREFIX = "/lf.a2a.v1.A2AService/"


def _decoded(request: Any, method: str) -> None:
    if request is UNDECODABLE:
        kind = InvalidParams if method.startswith(A2A_METHOD_PREFIX) else InvalidArgument
        raise kind(
            [FieldViolation("request", "cannot be decoded: malformed, or nested too deeply")]
        )


async def _abort(context: ServicerContext, exc: Exception, method: str) -> NoReturn:
    # grpc keeps the abort's exception on its state of the call, and the
    # exception's frames refer to that state: a reference cycle, which only
    # the cyclic collector frees (with our thresholds, rarely). The abort
    # chains this exception, and this one the exceptions it was raised from
    # (a body's parse error, a validation error), each with its frames'
    # locals: the request, its bytes, the parsed body. A flood of refused
    # 20 MiB bodies held 20-35 MiB each. Every frame that has finished
    # drops its locals now.
    _clear_chain(exc)
    if isinstance(exc, TurnmeshError):
        status = worded_for_callers(exc, method).to_status()
    elif _is_abort(exc):
        raise exc  # context.abort() already set the status
    else:
        log.exception("unhandled error in %s", method)
        status = TurnmeshError("internal error").to_status()
    await context.abort(status.code, status.details, status.trailing_metadata)


def worded_for_callers(error: TurnmeshError, method: str) -> TurnmeshError:
    """The error, or, if its text reads like Python's exception text, the
    same row in the table's words (runtime.sanitize); the original is logged."""
    violations = error.violations if isinstance(error, InvalidArgument) else []
    texts = [error.detail, *(v.description for v in violations)]
    if not any(sanitize.is_internal(text) for text in texts):
        return error
    log.warning(
        "%s: an error's text reads like Python's own; sent as %r: %r", method, error.title, texts
    )
    if isinstance(error, InvalidArgument):
        return type(error)(  # InvalidParams stays A2A's
            [
                FieldViolation(
                    v.field,
                    "is not valid" if sanitize.is_internal(v.description) else v.description,
                )
                for v in violations
            ]
        )
    clean = TurnmeshError.__new__(type(error))
    TurnmeshError.__init__(
        clean,
        error.title,
        reason=error.reason,
        metadata=error.metadata,
        retry_after=error.retry_after,
    )
    return clean


def _clear_chain(exc: BaseException) -> None:
    """Clear the finished frames of ``exc`` and of what it was raised from
    (``__cause__``) or while handling (``__context__``), all the way down."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        todo += (e.__cause__, e.__context__)


def _is_abort(exc: Exception) -> bool:
    # grpc.aio raises AbortError from context.abort(); it is not public API.
    return type(exc).__name__ == "AbortError"


class MeshKeyInterceptor(ServerInterceptor):
    """Requires the mesh key on the listed methods (when a key is set)."""

    def __init__(self, mesh_key: str | None, protected_methods: frozenset[str]) -> None:
        self._key = mesh_key.encode() if mesh_key else None
        self._protected = protected_methods

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> MethodHandler | None:
        if self._key is None or handler_call_details.method not in self._protected:
            return await continuation(handler_call_details)
        if has_mesh_key(handler_call_details.invocation_metadata or (), self._key):
            return await continuation(handler_call_details)
        return await _denied(
            continuation, handler_call_details, Unauthenticated("missing or wrong mesh key")
        )


class ApiKeyInterceptor(ServerInterceptor):
    """Requires a public API key (`Authorization: Bearer KEY`) on every method
    but the open ones, when keys are configured; sets the call's principal
    (``runtime.principals``: the key's, or the anonymous one) and holds each
    principal to its request rate. Calls from mesh members (they hold the mesh
    key) pass: the call that led to them was checked already, and they name
    its principal."""

    def __init__(
        self,
        keys: ApiKeys,
        open_methods: frozenset[str],
        mesh_key: str | None,
        *,
        rate_limit: RequestRates | None = None,
    ) -> None:
        self._keys = keys
        self._open = open_methods
        self._mesh_key = mesh_key.encode() if mesh_key else None
        self._rates = rate_limit

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> MethodHandler | None:
        # Set on every call (each runs in a task of its own), so no call can
        # see another's principal.
        principals.set_current(ANONYMOUS_PRINCIPAL)
        principals.set_caller_known(not self._keys.configured)
        requests.set_from(handler_call_details.invocation_metadata or ())
        method = handler_call_details.method
        metadata = handler_call_details.invocation_metadata or ()
        if method in self._open or method.startswith(OPEN_PREFIXES):
            # Open to anyone; a caller that shows a key is known (health then
            # shows it the mesh's counts), one that shows a wrong key is not.
            if self._keys.configured:
                self._recognize(metadata)
            return await continuation(handler_call_details)
        if self._mesh_key is not None and has_mesh_key(metadata, self._mesh_key):
            # With keys, a member's call must say whose it is: one that names
            # nobody (an older server's) never acts for the anonymous principal.
            named = _named_principal(metadata, required=self._keys.configured)
            if named is None:
                return await _denied(
                    continuation,
                    handler_call_details,
                    Unauthenticated("a mesh call must name its principal, well formed"),
                )
            principals.set_current(named)
            principals.set_caller_known(True)
            return await continuation(handler_call_details)
        if not self._keys.configured:
            return await continuation(handler_call_details)
        try:
            principal = authenticate(self._keys, bearer(metadata))
        except Unauthenticated as error:
            return await _denied(continuation, handler_call_details, error)
        principals.set_current(principal)
        principals.set_caller_known(True)
        if (
            self._rates is not None
            and (wait := await self._rates.admit(principal.name.encode())) > 0
        ):
            return await _denied(
                continuation,
                handler_call_details,
                RateLimited(
                    f"this caller may make {self._rates.rate:g} requests a second",
                    retry_after=max(1, math.ceil(wait)),
                    metadata={"limit": "requests_per_second"},
                ),
            )
        return await continuation(handler_call_details)

    def _recognize(self, metadata: Any) -> None:
        """Whether an open call's caller is known, never refusing it."""
        if self._mesh_key is not None and has_mesh_key(metadata, self._mesh_key):
            principals.set_caller_known(True)
            return
        presented = bearer(metadata)
        if presented and (principal := self._keys.match(presented)) is not None:
            principals.set_current(principal)
            principals.set_caller_known(True)


def _named_principal(metadata: Any, *, required: bool) -> Principal | None:
    """The principal a trusted call names (None if malformed, or missing
    where required; else anonymous if it names none)."""
    for key, value in metadata:
        if key == PRINCIPAL_METADATA:
            return Principal.from_header(value) if isinstance(value, str) else None
    return None if required else ANONYMOUS_PRINCIPAL


def _has(metadata: Any, name: str, expected: bytes) -> bool:
    for key, value in metadata:
        if key == name:
            supplied = value.encode() if isinstance(value, str) else value
            return hmac.compare_digest(supplied, expected)
    return False


OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def has_mesh_key(metadata: Any, expected: bytes) -> bool:
    return _has(metadata, MESH_KEY_METADATA, expected)


async def _denied(
    continuation: Continuation, details: grpc.HandlerCallDetails, error: TurnmeshError
) -> MethodHandler | None:
    """A handler that aborts with the error before reading the request. It
    takes the request as a stream whatever the method's kind: for a unary
    request grpc would first receive the whole message (up to the 101 MiB
    receive limit, an unauthenticated caller's too) only to refuse it."""
    handler = await continuation(details)
    if handler is None:
        return None
    status = error.to_status()

    async def deny(requests: Any, context: ServicerContext) -> Any:
        await context.abort(status.code, status.details, status.trailing_metadata)

    async def deny_stream(requests: Any, context: ServicerContext) -> AsyncIterator[Any]:
        await context.abort(status.code, status.details, status.trailing_metadata)
        yield None  # type: ignore[unreachable]  # makes this an async generator

    codec: dict[str, Any] = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None or handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(deny, **codec)
    return grpc.stream_stream_rpc_method_handler(deny_stream, **codec)
