"""A mesh member's side of the router protocol: register, heartbeat, leave.

Servers and workers run one ``Membership``. It re-registers when the router
forgets it (NOT_FOUND on heartbeat: the router restarted or dropped us) and
keeps retrying while the router is unreachable, so members and router can
start in any order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc

from turnmesh.runtime.errors import Unavailable
from turnmesh.runtime.interceptors import MESH_KEY_METADATA
from turnmesh.runtime.renewal import Background
from turnmesh.runtime.serving import mesh_channel
from turnmesh.runtime.tls import PLAINTEXT, Transport
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1.router_service_pb2_grpc import RouterServiceStub

log = logging.getLogger(__name__)


@dataclass
class MemberInfo:
    member_id: str
    role: rpb.MemberRole.ValueType
    address: str
    agent_name: str = ""
    # Servers: whether their session store is shared (their sessions can move).
    shared_store: bool = False


# Sessions a server reports in one ReportSessions call (the router takes at
# most 10,000): a few hundred KiB, far below any message limit.
REPORT_PAGE_SIZE = 5_000


async def _no_sessions() -> list[str]:
    return []


class Membership:
    def __init__(
        self,
        router_address: str,
        member: MemberInfo,
        *,
        mesh_key: str | None = None,
        inflight: Callable[[], int] = lambda: 0,
        accepting: Callable[[], bool] = lambda: True,
        owned_sessions: Callable[[], Awaitable[list[str]]] = _no_sessions,
        on_rejoined: Callable[[], None] = lambda: None,
        heartbeat_interval: float = 1.0,
        transport: Transport = PLAINTEXT,
        report_page_size: int = REPORT_PAGE_SIZE,
    ) -> None:
        self.member = member
        # Servers open their channels to workers and other servers with it too.
        self.transport = transport
        self._channel = mesh_channel(router_address, transport)
        self.router = RouterServiceStub(self._channel)
        self._metadata = ((MESH_KEY_METADATA, mesh_key),) if mesh_key else ()
        self._inflight = inflight
        self._accepting = accepting
        self._owned_sessions = owned_sessions
        self._on_rejoined = on_rejoined
        self._page_size = report_page_size
        self._interval = heartbeat_interval
        # Not a Renewal: it beats at once, then every interval the router
        # gives it; re-registers without waiting; logs each failure by kind.
        self._beats = Background(self._run, name="membership")
        self.registered = asyncio.Event()
        # Set when the router forgot us after a registration (it restarted).
        self._forgotten = False
        # Registered, and the last call to the router went through.
        self._reachable = False

    @property
    def connected(self) -> bool:
        """Registered with a router that answered our last call."""
        return self.registered.is_set() and self._reachable

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata for router RPCs (carries the mesh key when set)."""
        return self._metadata

    def start(self) -> None:
        self._beats.start()

    async def _register(self) -> None:
        m = self.member
        response = await self.router.Register(
            rpb.RegisterRequest(
                member=rpb.Member(
                    member_id=m.member_id,
                    role=m.role,
                    address=m.address,
                    agent_name=m.agent_name,
                    inflight_turns=self._inflight(),
                    accepting=self._accepting(),
                    shared_store=m.shared_store,
                ),
                rejoining=self._forgotten,
            ),
            metadata=self._metadata,
            timeout=5,
        )
        # What we own, in pages, before we count as registered: a router that
        # forgot us learns our sessions before it routes anything to us.
        owned = await self._owned_sessions()
        for start in range(0, len(owned), self._page_size):
            await self.router.ReportSessions(
                rpb.ReportSessionsRequest(
                    member_id=m.member_id, session_ids=owned[start : start + self._page_size]
                ),
                metadata=self._metadata,
                timeout=5,
            )
        if owned:
            log.info("reported %d owned sessions to the router", len(owned))
        interval = response.heartbeat_interval.ToTimedelta().total_seconds()
        if interval > 0:
            self._interval = interval
        if not self.registered.is_set():
            log.info("registered with the router as %s", m.member_id)
        if self._forgotten:
            # The router may have given some of our sessions to others
            # meanwhile: forget what we assumed and ask it again.
            self._on_rejoined()
        self.registered.set()

    async def _run(self) -> None:
        unreachable = False  # said once per outage, at WARNING: why we are not ready
        while True:
            try:
                if not self.registered.is_set():
                    await self._register()
                else:
                    await self.router.Heartbeat(
                        rpb.HeartbeatRequest(
                            member_id=self.member.member_id,
                            inflight_turns=self._inflight(),
                            accepting=self._accepting(),
                        ),
                        metadata=self._metadata,
                        timeout=5,
                    )
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    log.warning("router forgot this member; registering again")
                    self.registered.clear()
                    self._forgotten = True
                    continue
                if not unreachable:
                    log.warning("router unreachable (%s); retrying", exc.code().name)
                unreachable = True
                self._reachable = False
            except Unavailable as exc:  # what we own cannot be checked yet
                log.warning("cannot register yet: %s", exc)
            except Exception:
                log.warning("registering or heartbeating failed; retrying", exc_info=True)
                self._reachable = False
            else:
                self._reachable = True
                if unreachable:
                    log.info("router reachable again")
                unreachable = False
            await asyncio.sleep(self._interval)

    async def stop(self) -> None:
        await self._beats.stop()
        with contextlib.suppress(grpc.aio.AioRpcError):
            await self.router.Unregister(
                rpb.UnregisterRequest(member_id=self.member.member_id),
                metadata=self._metadata,
                timeout=2,
            )
        await self._channel.close()
