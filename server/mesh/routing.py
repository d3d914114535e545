"""The session server's calls to the router about sessions, and channels to
the other servers that own sessions."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import grpc

from turnmesh.runtime import tracing
from turnmesh.runtime.error_decoding import from_rpc_error
from turnmesh.runtime.errors import OwnerAway, Unavailable
from turnmesh.runtime.membership import Membership
from turnmesh.runtime.serving import mesh_channel
from turnmesh.server.mesh.ownership import Owner
from turnmesh.server.mesh.task_calls import OwnerStub
from turnmesh.v1 import router_service_pb2 as rpb

if TYPE_CHECKING:
    from turnmesh.v1.session_service_pb2_grpc import SessionServiceAsyncStub

log = logging.getLogger(__name__)

ROUTER_CALL_SECONDS = 5.0


class RouterClient:
    """Route and RemoveSession, as this member; also the stubs of other servers."""

    def __init__(self, membership: Membership) -> None:
        self._membership = membership
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def route(
        self, session_id: str, *, unreachable: Owner | None = None, assign: bool = False
    ) -> Owner | None:
        """The session's owner; None if it has none and ``assign`` is False.
        ``unreachable``: an owner this server could not reach (the router
        drops it and reassigns its sessions)."""
        try:
            response = await self._membership.router.Route(
                rpb.RouteRequest(
                    session_id=session_id,
                    unreachable_member_ids=[unreachable.member_id] if unreachable else [],
                    lookup_only=not assign,
                    caller_member_id=self._membership.member.member_id,
                ),
                metadata=(*self._membership.metadata, *tracing.inject()),
                timeout=ROUTER_CALL_SECONDS,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            error = from_rpc_error(exc)
            if isinstance(error, OwnerAway):
                raise OwnerAway(error.detail) from exc
            log.warning("router could not route %s: %s", session_id, exc.code())
            raise Unavailable("the mesh router is unavailable") from exc
        return Owner(response.owner.member_id, response.owner.address)

    async def remove_session(self, session_id: str) -> None:
        try:
            await self._membership.router.RemoveSession(
                rpb.RemoveSessionRequest(session_id=session_id),
                metadata=self._membership.metadata,
                timeout=ROUTER_CALL_SECONDS,
            )
        except grpc.aio.AioRpcError as exc:
            log.debug("could not tell the router %s is gone: %s", session_id, exc.code())

    async def other_servers(self) -> list[Owner]:
        """Every other session server (draining ones too: they still hold
        their sessions); UNAVAILABLE while the router may not know them all."""
        try:
            response = await self._membership.router.ListMembers(
                rpb.ListMembersRequest(
                    role=rpb.MEMBER_ROLE_SERVER,
                    caller_member_id=self._membership.member.member_id,
                ),
                metadata=self._membership.metadata,
                timeout=ROUTER_CALL_SECONDS,
            )
        except grpc.aio.AioRpcError as exc:
            log.warning("router could not list the servers: %s", exc.code())
            raise Unavailable("the mesh router is unavailable") from exc
        if response.learning:  # restarted: its list may still lack a server
            raise Unavailable("the mesh router is still learning the mesh; retry")
        me = self._membership.member.member_id
        return [Owner(m.member_id, m.address) for m in response.members if m.member_id != me]

    def stub(self, owner: Owner) -> SessionServiceAsyncStub:
        """A stub for another server (one channel per address, kept)."""
        channel = self._channels.get(owner.address)
        if channel is None:
            channel = mesh_channel(owner.address, self._membership.transport)
            self._channels[owner.address] = channel
        return OwnerStub(channel)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
