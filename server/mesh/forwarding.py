"""Running a call on the server that owns its session: forward it, wait for
the owner to take it, and follow the session when its owner is unreachable
(rerouted at once) or silent (asked about until the session moves).

An owner sends its response headers (with ``TOOK_CALL_METADATA``) as soon as
it takes a forwarded call, so a forwarding server can tell "took it and is
working" from "frozen or cut off" long before TCP or gRPC keepalives would,
and an owner's own UNAVAILABLE answer (draining, held elsewhere: passed to the
caller, who retries) from an owner it cannot reach (reported to the router).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from turnmesh.runtime import wire
from turnmesh.runtime.error_decoding import from_rpc_error
from turnmesh.runtime.errors import HeldElsewhere, Unavailable
from turnmesh.server.mesh.ownership import Forward, Owner, Placement, SessionOwnership

if TYPE_CHECKING:
    from turnmesh.v1.session_service_pb2_grpc import SessionServiceAsyncStub as Stub

Response = TypeVar("Response")
# What a streamed call yields (events, or the REST streams' SSE messages).
Item = TypeVar("Item")

# Set on calls one server forwards to another: the receiver handles them
# locally, so a stale route can never bounce a call around.
FORWARDED_METADATA = "x-turnmesh-forwarded"
# In the headers of an owner that took a forwarded call.
TOOK_CALL_METADATA = "x-turnmesh-owner"
# On a call forwarded after its owner could not be reached: the receiver may
# wait for that owner's lease to lapse (and then take the session over).
UNREACHABLE_METADATA = "x-turnmesh-unreachable"

Hint = tuple[tuple[str, str], ...]

# How long a forwarding server waits for the owner's response headers before
# it asks the router whether the session moved, and for how long in all.
OWNER_ANSWER_SECONDS = 2.0
OWNER_SILENT_LIMIT_SECONDS = 60.0


class OwnerFailed(Exception):
    """The owner answered with an error status: the caller gets it exactly
    (details and Retry-After included)."""

    def __init__(self, error: grpc.aio.AioRpcError) -> None:
        super().__init__(error.code().name)
        self.error = error


@dataclass(frozen=True)
class Answered:
    """The owner took the call (or failed it, which the call then raises)."""


@dataclass(frozen=True)
class Moved:
    """The owner stayed silent and the session moved; the call was cancelled."""

    placement: Placement


@dataclass
class _Attempts:
    """A forwarded call's second chances, each taken once: after an owner
    that could not be reached (the next server is told, ``hint``), and after
    an owner that says another server holds the session."""

    retried: bool = False
    redirected: bool = False
    hint: Hint = ()


class Forwarder:
    def __init__(
        self,
        ownership: SessionOwnership,
        stub: Callable[[Owner], Stub],
        *,
        answer_seconds: float = OWNER_ANSWER_SECONDS,
        silent_limit_seconds: float = OWNER_SILENT_LIMIT_SECONDS,
    ) -> None:
        self._ownership = ownership
        self._stub = stub
        self._answer_seconds = answer_seconds
        self._silent_limit = silent_limit_seconds

    async def unary(
        self,
        session_id: str,
        placement: Placement,
        forward: Callable[[Stub, Hint], grpc.aio.UnaryUnaryCall[Any, Response]],
        local: Callable[[], Awaitable[Response]],
    ) -> Response:
        """The call's response from the owner, or from ``local`` once the
        session turns out to be this server's. An unreachable owner is
        reported and the call placed again, once; a silent one is waited on
        until the session moves; an owner that says another server holds the
        session sends it there, once. Raises OwnerFailed with the owner's error."""
        attempts = _Attempts()
        while isinstance(placement, Forward):
            call = forward(self._stub(placement.owner), attempts.hint)
            answer = await self._answer(session_id, placement.owner, call)
            if isinstance(answer, Moved):
                placement = answer.placement
                continue
            try:
                response: Response = await call
                return response
            except grpc.aio.AioRpcError as exc:
                placement = await self._next(session_id, attempts, placement, call, exc)
        return await local()

    async def stream(
        self,
        session_id: str,
        placement: Placement,
        forward: Callable[[Stub, Hint], grpc.aio.UnaryStreamCall[Any, Item]],
        local: Callable[[], Awaitable[AsyncGenerator[Item, None]]],
    ) -> AsyncGenerator[Item, None]:
        """The call's events, relayed from the owner (or this server's own
        once the session turns out to be here). Only a stream that failed
        before its first event is placed again: after one, the caller resumes
        the turn itself."""
        attempts = _Attempts()
        while isinstance(placement, Forward):
            call = forward(self._stub(placement.owner), attempts.hint)
            answer = await self._answer(session_id, placement.owner, call)
            if isinstance(answer, Moved):
                placement = answer.placement
                continue
            received = False
            try:
                async for event in wire.responses(call):
                    received = True
                    yield event
                return
            except grpc.aio.AioRpcError as exc:
                if received:  # the caller resumes the turn itself
                    raise OwnerFailed(exc) from exc
                placement = await self._next(session_id, attempts, placement, call, exc)
            finally:
                # A caller that left (its call cancelled, this stream closed)
                # ends the owner's call now, not when the call is collected:
                # the owner cancels a turn whose caller asked for that then.
                call.cancel()
        async with contextlib.aclosing(await local()) as events:
            async for event in events:
                yield event

    async def _next(
        self,
        session_id: str,
        attempts: _Attempts,
        placement: Forward,
        call: grpc.aio.Call,
        error: grpc.aio.AioRpcError,
    ) -> Placement:
        """Where a call that failed before answering goes next: to the server
        its owner says holds the session (once), or, if the owner could not
        be reached, wherever the router then says (once). Raises OwnerFailed
        when the failure is the owner's answer."""
        took = await _took(call)
        holder = _held_elsewhere(error) if took and not attempts.redirected else None
        if holder is not None:
            attempts.redirected = True
            return self._ownership.held_by(session_id, holder)
        if error.code() != grpc.StatusCode.UNAVAILABLE or attempts.retried or took:
            raise OwnerFailed(error) from error
        attempts.retried = True
        attempts.hint = ((UNREACHABLE_METADATA, placement.owner.member_id),)
        return await self._ownership.after_unreachable(session_id, placement.owner)

    async def _answer(self, session_id: str, owner: Owner, call: grpc.aio.Call) -> Answered | Moved:
        """Wait for the owner's response headers; while none come, ask
        whether the session moved (then cancel the call)."""
        give_up = time.monotonic() + self._silent_limit
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.shield(call.initial_metadata()), self._answer_seconds
                )
                return Answered()
            try:
                moved = await self._ownership.after_silence(session_id, owner)
            except Unavailable:
                call.cancel()
                raise
            if moved is not None:
                call.cancel()
                return Moved(moved)
            if time.monotonic() > give_up:
                call.cancel()
                raise Unavailable("the server that owns this session does not answer")


async def _took(call: grpc.aio.Call) -> bool:
    """Whether the owner took the call (its headers say so): its errors are
    its answers, not signs that it is unreachable."""
    metadata = await call.initial_metadata()
    return any(key == TOOK_CALL_METADATA for key, _ in metadata or ())


def _held_elsewhere(error: grpc.aio.AioRpcError) -> Owner | None:
    """The server an owner says holds the session (HeldElsewhere), if any."""
    if error.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    known = from_rpc_error(error)
    member_id, address = known.metadata.get("owner_id"), known.metadata.get("owner_address")
    if not isinstance(known, HeldElsewhere) or not member_id or not address:
        return None
    return Owner(member_id, address)
