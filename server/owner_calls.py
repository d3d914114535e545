"""Where a session server runs a call: here, when it owns the session (or
another server forwarded the call), else on the owner, forwarded with the
caller's identity and relayed back (``server/mesh/forwarding.py`` follows
the owner when it moves or cannot be reached).

``OwnerCalls`` is what every SessionService method goes through: ``unary``
and ``relay`` take the call as it would be made to the owner and as it is
run here, and run the one the session's placement says.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

import grpc

from turnmesh.runtime import principals, requests, tracing
from turnmesh.runtime.interceptors import MESH_KEY_METADATA, has_mesh_key
from turnmesh.runtime.principals import PRINCIPAL_METADATA
from turnmesh.runtime.requests import REQUEST_ID_METADATA
from turnmesh.server.mesh.forwarding import (
    FORWARDED_METADATA,
    TOOK_CALL_METADATA,
    UNREACHABLE_METADATA,
    Forwarder,
    OwnerFailed,
)
from turnmesh.server.mesh.ownership import Local, Placement, SessionOwnership

if TYPE_CHECKING:
    from turnmesh.v1.session_service_pb2_grpc import SessionServiceAsyncStub as Stub

Response = TypeVar("Response")
# What a streaming call yields: events (gRPC), or SSE messages (REST).
Item = TypeVar("Item")
Metadata = tuple[tuple[str, str], ...]
# What a forwarded call's error keeps of the owner's trailers.
PASSED_TRAILERS = frozenset({"grpc-status-details-bin", "retry-after"})


class Context(Protocol):
    """What the service reads of a call: grpc.aio's ServicerContext, or a
    compatibility surface's call made in this process
    (``server.compat._common.InProcessCall``)."""

    def invocation_metadata(self) -> grpc.aio.Metadata | None: ...

    async def send_initial_metadata(
        self, initial_metadata: grpc.aio.Metadata | Sequence[tuple[str, str | bytes]]
    ) -> None: ...

    async def abort(
        self,
        code: grpc.StatusCode,
        details: str = "",
        trailing_metadata: grpc.aio.Metadata | Sequence[tuple[str, str | bytes]] = (),
    ) -> NoReturn: ...


class OwnerCalls:
    """Runs a call where its session lives (see the module's docstring)."""

    def __init__(
        self,
        ownership: SessionOwnership,
        forwarder: Forwarder,
        *,
        mesh_key: str | None = None,
        forward_credentials: bool = False,
    ) -> None:
        self._ownership = ownership
        self._forwarder = forwarder
        self._mesh_key = mesh_key
        self._forward_credentials = forward_credentials

    def forwarded(self, context: Context) -> bool:
        """A call another server forwarded here: handled here, whatever this
        server's routes say, so a stale route can never bounce it. Only a mesh
        member may say so (Envoy also strips the header from clients)."""
        metadata = context.invocation_metadata() or ()
        if not any(key == FORWARDED_METADATA for key, _ in metadata):
            return False
        return self._mesh_key is None or has_mesh_key(metadata, self._mesh_key.encode())

    async def place(self, session_id: str, context: Context, *, assign: bool) -> Placement:
        if self.forwarded(context):
            # The forwarding server waits for these to know we took the call
            # (and that an error from here on is our answer).
            await context.send_initial_metadata(((TOOK_CALL_METADATA, self._ownership.member_id),))
            unreachable = next(
                (v for k, v in context.invocation_metadata() or () if k == UNREACHABLE_METADATA),
                None,
            )
            await self._ownership.accept_forwarded(
                session_id, unreachable if isinstance(unreachable, str) else None
            )
            return Local()
        return await self._ownership.place(session_id, assign=assign)

    def forward_metadata(self, context: Context) -> Metadata:
        # The caller's key goes only to a peer proven in the mesh by mTLS, and
        # only when no mesh key (which opens the owner by itself) is set.
        passed = tuple(
            (k, v)
            for k, v in context.invocation_metadata() or ()
            if k == "authorization" and isinstance(v, str) and self._forward_credentials
        )
        mesh = ((MESH_KEY_METADATA, self._mesh_key),) if self._mesh_key else ()
        member = self._ownership.member_id
        # The principal the call acts for: the receiver believes it only
        # beside the mesh key (with mTLS alone it reads the caller's key).
        principal = ((PRINCIPAL_METADATA, principals.current().header()),)
        request = ((REQUEST_ID_METADATA, rid),) if (rid := requests.current()) else ()
        return (
            (FORWARDED_METADATA, member),
            *mesh,
            *principal,
            *request,
            *passed,
            *tracing.inject(),
        )

    async def unary(
        self,
        session_id: str,
        context: Context,
        forward: Callable[[Stub, Metadata], grpc.aio.UnaryUnaryCall[Any, Response]],
        local: Callable[[], Awaitable[Response]],
        *,
        assign: bool = False,
    ) -> Response:
        """Run a unary call on the session's owner: here, or forwarded there."""
        placement = await self.place(session_id, context, assign=assign)
        if isinstance(placement, Local):
            return await local()
        metadata = self.forward_metadata(context)
        try:
            response: Response = await self._forwarder.unary(
                session_id, placement, lambda stub, hint: forward(stub, metadata + hint), local
            )
        except OwnerFailed as failed:
            await pass_through(context, failed.error)
        return response

    async def relay(
        self,
        session_id: str,
        context: Context,
        forward: Callable[[Stub, Metadata], grpc.aio.UnaryStreamCall[Any, Any]],
        local: Callable[[], Awaitable[AsyncGenerator[Item, None]]],
        adapt: Callable[[AsyncGenerator[Any, None]], AsyncGenerator[Item, None]] | None = None,
    ) -> AsyncGenerator[Item, None]:
        """The events of a streaming call: this server's own (iterated
        directly: no extra layer per event on the hottest path), or relayed
        from the owner (its stream made ours by ``adapt``, when the two
        differ). Its caller closes it (``aclosing``): a caller that leaves
        ends the owner's call at once."""
        placement = await self.place(session_id, context, assign=False)
        if isinstance(placement, Local):
            return await local()
        metadata = self.forward_metadata(context)
        relayed: AsyncGenerator[Any, None] = self._relayed(
            context,
            self._forwarder.stream(
                session_id,
                placement,
                lambda stub, hint: forward(stub, metadata + hint),
                local,
            ),
        )
        return relayed if adapt is None else adapt(relayed)

    async def _relayed(
        self, context: Context, events: AsyncGenerator[Item, None]
    ) -> AsyncGenerator[Item, None]:
        async with contextlib.aclosing(events):
            try:
                async for event in events:
                    yield event
            except OwnerFailed as failed:
                await pass_through(context, failed.error)


async def pass_through(context: Context, error: grpc.aio.AioRpcError) -> NoReturn:
    """Give the caller the owner's status exactly, details included."""
    trailing = tuple((k, v) for k, v in (error.trailing_metadata() or ()) if k in PASSED_TRAILERS)
    await context.abort(error.code(), error.details() or "", trailing)
