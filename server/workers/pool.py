"""The pool of workers a server sends turns to.

Live workers come from the router (refreshed in the background and on demand);
a turn goes to the worker of its agent with the fewest turns in flight from
this server, preferring the one that served the session last (its caches are
warm) unless it is clearly busier than the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from turnmesh.runtime import wire
from turnmesh.runtime.membership import Membership
from turnmesh.runtime.serving import mesh_channel
from turnmesh.server.workers.relay import RelayLink
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1 import worker_service_pb2 as wpb
from turnmesh.v1.worker_service_pb2_grpc import WorkerServiceStub

if TYPE_CHECKING:
    from turnmesh.v1.worker_service_pb2_grpc import WorkerServiceAsyncStub

log = logging.getLogger(__name__)

# A sticky worker keeps its session unless it has this many more turns in
# flight than the least busy worker.
STICKY_SLACK = 2
# A worker that failed a call is skipped for this long, even if the router
# still lists it (the router drops it only after missed heartbeats).
FAILED_WORKER_QUARANTINE = 5.0
# Bound on sessions whose history positions on workers are remembered; a
# forgotten one only costs one full history send.
MAX_HISTORY_ENTRIES = 100_000
# Bound on agent names remembered from workers seen (live or not): a known
# agent without a live worker is unavailable (retry), not unknown.
MAX_KNOWN_AGENTS = 1024


_RUN = wpb.DESCRIPTOR.services_by_name["WorkerService"].methods_by_name["Run"]


@dataclass
class WorkerRef:
    member_id: str
    address: str
    agent_name: str
    stub: WorkerServiceAsyncStub
    # Run, for a request serialized already (a large one: runtime.wire).
    run_serialized: grpc.aio.UnaryStreamMultiCallable[bytes, wpb.RunResponse] | None = None


class WorkerPool:
    def __init__(
        self,
        membership: Membership,
        refresh_interval: float = 1.0,
        on_listed: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._membership = membership
        self._interval = refresh_interval
        # Called after each periodic list of the mesh's workers.
        self._on_listed = on_listed
        self._seen_agents: OrderedDict[str, None] = OrderedDict()
        self._workers: dict[str, WorkerRef] = {}
        self._channels: dict[str, grpc.aio.Channel] = {}
        # This server's relay from each worker (by address), once asked for.
        self._relays: dict[str, RelayLink] = {}
        self._stopped = False
        self._inflight: dict[str, int] = {}
        self._last_worker: dict[str, str] = {}
        self._failed_until: dict[str, float] = {}
        self._address_of: dict[str, str] = {}
        # session -> worker -> how many messages of its history that worker
        # holds; by session, so that deleting one is one step, not a scan.
        self._history_sent: OrderedDict[str, dict[str, int]] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self._refresh_lock = asyncio.Lock()
        self.known = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="worker-pool")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._stopped = True  # no relay opens from here on
        for link in list(self._relays.values()):
            await link.close()
        for channel in self._channels.values():
            await channel.close()

    async def _loop(self) -> None:
        while True:
            await self.refresh()
            if self._on_listed is not None:
                await self._on_listed()
            await asyncio.sleep(self._interval)

    async def refresh(self) -> None:
        async with self._refresh_lock:
            try:
                response = await self._membership.router.ListMembers(
                    rpb.ListMembersRequest(
                        role=rpb.MEMBER_ROLE_WORKER,
                        caller_member_id=self._membership.member.member_id,
                    ),
                    metadata=self._membership.metadata,
                    timeout=5,
                )
            except grpc.aio.AioRpcError as exc:
                log.debug("cannot list workers: %s", exc.code())
                return
            # A router that restarted lists only who registered again so far:
            # keep the workers we knew (a dead one fails its call and is
            # quarantined) until its list is complete.
            live: dict[str, WorkerRef] = dict(self._workers) if response.learning else {}
            now = time.monotonic()
            for member_id, until in list(self._failed_until.items()):
                if until < now:
                    del self._failed_until[member_id]
            for member in response.members:
                self._remember_agent(member.agent_name)
                if not member.accepting or member.member_id in self._failed_until:
                    live.pop(member.member_id, None)  # kept from before: draining now
                    continue
                channel = self._channels.get(member.address)
                if channel is None:
                    channel = mesh_channel(member.address, self._membership.transport)
                    self._channels[member.address] = channel
                live[member.member_id] = WorkerRef(
                    member.member_id,
                    member.address,
                    member.agent_name,
                    WorkerServiceStub(channel),
                    wire.raw_unary_stream(channel, _RUN, wpb.RunResponse),
                )
            for member_id in self._failed_until:
                live.pop(member_id, None)
            self._workers = live
            if live:
                self.known.set()
            if not response.learning:
                await self._close_unlisted({m.address for m in response.members})

    async def _close_unlisted(self, listed: set[str]) -> None:
        """Close channels to workers that left the mesh, once no turn of ours
        runs on them: an idle channel to a dead address keeps reconnecting."""
        busy = {self._address_of[m] for m, n in self._inflight.items() if n > 0}
        for address in [a for a in self._channels if a not in listed and a not in busy]:
            if (link := self._relays.pop(address, None)) is not None:
                await link.close()
            await self._channels.pop(address).close()

    @property
    def call_metadata(self) -> tuple[tuple[str, str], ...]:
        """Metadata for worker calls (carries the mesh key when set)."""
        return self._membership.metadata

    def agents(self) -> set[str]:
        return {w.agent_name for w in self._workers.values()}

    def has_agent(self, agent_name: str) -> bool:
        return any(w.agent_name == agent_name for w in self._workers.values())

    def knows_agent(self, agent_name: str) -> bool:
        """A worker of this agent was seen, live or not, since this server started."""
        return agent_name in self._seen_agents

    def _remember_agent(self, agent_name: str) -> None:
        self._seen_agents[agent_name] = None
        self._seen_agents.move_to_end(agent_name)
        while len(self._seen_agents) > MAX_KNOWN_AGENTS:
            self._seen_agents.popitem(last=False)

    def pick(self, agent_name: str, session_id: str, exclude: set[str]) -> WorkerRef | None:
        candidates = [
            w
            for w in self._workers.values()
            if w.agent_name == agent_name and w.member_id not in exclude
        ]
        if not candidates:
            return None
        least = min(candidates, key=lambda w: (self._inflight.get(w.member_id, 0), w.member_id))
        last = self._workers.get(self._last_worker.get(session_id, ""))
        if last is not None and last in candidates:
            slack = self._inflight.get(last.member_id, 0) - self._inflight.get(least.member_id, 0)
            if slack < STICKY_SLACK:
                return last
        return least

    def relay(self, worker: WorkerRef) -> RelayLink | None:
        """This server's open relay from the worker, or None (a turn then
        streams on its own call); asking opens one if there is none."""
        if self._stopped:
            return None
        link = self._relays.get(worker.address)
        if link is not None and link.open:
            return link
        if link is None or (link.closed and time.monotonic() >= link.reopen_at):
            self._relays[worker.address] = RelayLink(worker.stub, self.call_metadata)
        return None

    def acquire(self, worker: WorkerRef, session_id: str) -> None:
        self._address_of[worker.member_id] = worker.address
        self._inflight[worker.member_id] = self._inflight.get(worker.member_id, 0) + 1
        self._last_worker[session_id] = worker.member_id

    def release(self, worker: WorkerRef) -> None:
        left = self._inflight.get(worker.member_id, 0) - 1
        if left > 0:
            self._inflight[worker.member_id] = left
        else:
            self._inflight.pop(worker.member_id, None)
            self._address_of.pop(worker.member_id, None)

    def mark_failed(self, worker: WorkerRef) -> None:
        """Stop using a worker for a while."""
        self._workers.pop(worker.member_id, None)
        self._failed_until[worker.member_id] = time.monotonic() + FAILED_WORKER_QUARANTINE

    def forget_session(self, session_id: str) -> None:
        self._last_worker.pop(session_id, None)
        self._history_sent.pop(session_id, None)

    def history_base(self, worker: WorkerRef, session_id: str) -> int:
        """Messages of the session's history this worker already holds."""
        return self._history_sent.get(session_id, {}).get(worker.member_id, 0)

    def remember_history(self, worker: WorkerRef, session_id: str, count: int) -> None:
        self._history_sent.setdefault(session_id, {})[worker.member_id] = count
        self._history_sent.move_to_end(session_id)
        while len(self._history_sent) > MAX_HISTORY_ENTRIES:
            self._history_sent.popitem(last=False)

    def forget_history(self, worker: WorkerRef, session_id: str) -> None:
        held = self._history_sent.get(session_id)
        if held is not None:
            held.pop(worker.member_id, None)
            if not held:
                del self._history_sent[session_id]
