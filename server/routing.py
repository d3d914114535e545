"""Which server owns a session, and a channel to reach it.

Routes come from the router and are cached; a server that cannot be reached is
reported back (``unreachable_member_ids``) so the router reassigns at once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc

from turnmesh.runtime import tracing
from turnmesh.runtime.errors import Unavailable
from turnmesh.runtime.membership import Membership
from turnmesh.runtime.serving import mesh_channel
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1.session_service_pb2_grpc import SessionServiceStub

log = logging.getLogger(__name__)

# Set on calls one server forwards to another: the receiver handles them
# locally, so a stale route can never bounce a call around.
FORWARDED_METADATA = "x-turnmesh-forwarded"


@dataclass(frozen=True)
class Owner:
    member_id: str
    address: str


class RouteTable:
    def __init__(self, membership: Membership) -> None:
        self._membership = membership
        self._cache: dict[str, Owner] = {}
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def owner(
        self, session_id: str, unreachable: Owner | None = None, *, assign: bool = False
    ) -> Owner | None:
        """The session's owner; None if it has none and ``assign`` is False."""
        if unreachable is None and session_id in self._cache:
            return self._cache[session_id]
        if unreachable is not None:
            self._forget_member(unreachable.member_id)
        try:
            response = await self._membership.router.Route(
                rpb.RouteRequest(
                    session_id=session_id,
                    unreachable_member_ids=[unreachable.member_id] if unreachable else [],
                    lookup_only=not assign,
                    caller_member_id=self._membership.member.member_id,
                ),
                metadata=(*self._membership.metadata, *tracing.inject()),
                timeout=5,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            log.warning("router could not route %s: %s", session_id, exc.code())
            raise Unavailable("the mesh router is unavailable") from exc
        owner = Owner(response.owner.member_id, response.owner.address)
        if owner.member_id != self._membership.member.member_id:
            # Sessions this server owns are known from SessionCore.owned.
            self._cache[session_id] = owner
        return owner

    def stub(self, owner: Owner) -> SessionServiceStub:
        channel = self._channels.get(owner.address)
        if channel is None:
            channel = mesh_channel(owner.address, self._membership.transport)
            self._channels[owner.address] = channel
        return SessionServiceStub(channel)

    def forget_all(self) -> None:
        self._cache.clear()

    def forget(self, session_id: str) -> None:
        self._cache.pop(session_id, None)

    def _forget_member(self, member_id: str) -> None:
        for sid in [s for s, o in self._cache.items() if o.member_id == member_id]:
            del self._cache[sid]

    async def remove_session(self, session_id: str) -> None:
        self.forget(session_id)
        try:
            await self._membership.router.RemoveSession(
                rpb.RemoveSessionRequest(session_id=session_id),
                metadata=self._membership.metadata,
                timeout=5,
            )
        except grpc.aio.AioRpcError as exc:
            log.debug("could not tell the router %s is gone: %s", session_id, exc.code())

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
