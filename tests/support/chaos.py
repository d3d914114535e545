"""The chaos run: conversations through Envoy (REST/SSE and native gRPC) while
workers, a server and the router are killed and a server is frozen (SIGSTOP,
then SIGCONT); then every history is checked, and every 503 a caller got is
accounted for.

`make chaos` runs it long; `tests/integration/test_chaos.py` runs it short.
Loopback only, bounded in time, stops by itself, ends only processes it
started. Usage: python -m tests.support.chaos [--seconds N] [--conversations N]
[--store redis|postgres] (the store every server shares).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
from httpx_sse import aconnect_sse

from tests.support.mesh import Component, Mesh, RedisServer
from tests.support.postgres import PostgresServer
from turnmesh.client import AsyncClient, TurnmeshClientError
from turnmesh.runtime.serving import insecure_channel
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1.router_service_pb2_grpc import RouterServiceStub

TERMINAL = ("RUN_FINISHED", "RUN_ERROR")
# Turns that must finish after a fault before the next one: it took effect.
LANDED_BETWEEN_FAULTS = 16
REQUEST_TIMEOUT = 30.0  # a request that takes longer counts as hung
RESUME_ATTEMPTS = 40


@dataclass
class Counts:
    turns_attempted: int = 0
    turns_finished: int = 0
    turns_failed_cleanly: int = 0
    turns_retried_with_same_key: int = 0
    turns_without_router: int = 0
    streams_resumed: int = 0
    resumed_seq_errors: int = 0
    hung: int = 0
    lost: int = 0
    duplicated: int = 0
    partial: int = 0
    # 503s a server answered with a reason of the error table (a session
    # changing owner, say): the caller was told why, and retries.
    unavailable_with_reason: int = 0
    # 503s for a turn Envoy had sent to a server that died or froze: Envoy
    # never sends a turn twice (it may have started); the caller retries with
    # the same idempotency key.
    turns_cut_in_flight: int = 0
    # Any other 503 (no healthy server, a key that could not be checked, a
    # read that was not retried on a live server): must stay 0.
    unexplained_503: int = 0
    unexplained_details: list[str] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.hung
            or self.lost
            or self.duplicated
            or self.partial
            or self.resumed_seq_errors
            or self.unexplained_503
        )


class Broken(Exception):
    """The stream broke before a terminal event (connection or status)."""

    def __init__(self, what: str, refusal: Refusal | None = None) -> None:
        super().__init__(what)
        # The 503 it was, if it was one.
        self.refusal = refusal


@dataclass(frozen=True)
class Refusal:
    """A 503 (UNAVAILABLE) answer: a server's has a reason of the error
    table; Envoy's own has none, only its detail."""

    reason: str
    detail: str


def _refusal_of_response(response: httpx.Response) -> Refusal | None:
    if response.status_code != 503:
        return None
    try:
        body = response.json()
    except ValueError:
        return Refusal("", response.text[:200])
    reason = body.get("reason") or ""
    return Refusal(reason, str(body.get("detail") or body)[:200])


def _refusal_of_error(error: TurnmeshClientError) -> Refusal | None:
    if error.code != grpc.StatusCode.UNAVAILABLE:
        return None
    return Refusal(error.reason, error.message[:200])


@dataclass
class Conversation:
    index: int
    session_id: str
    via_rest: bool
    finished: list[str] = field(default_factory=list)  # turn ids, in order


class ChaosRun:
    def __init__(
        self, workdir: Path, seconds: float, conversations: int, store: str = "redis"
    ) -> None:
        self.workdir = workdir
        self.seconds = seconds
        self.conversations = conversations
        self.counts = Counts()
        self.mesh = Mesh(workdir / "mesh")
        # The store every server shares: a Redis or a PostgreSQL of the run's own.
        self.store = store
        self.redis: RedisServer | None = None
        self.postgres: PostgresServer | None = None
        self.store_url = ""
        self.rng = random.Random(7)
        # Set once every fault of the plan happened (or the fault loop ended).
        self.plan_done = asyncio.Event()
        # Notified whenever a turn finishes: faults wait for turns to land.
        self.landed = asyncio.Condition()

    # The mesh ----------------------------------------------------------------

    def start(self) -> None:
        if self.store == "postgres":
            self.postgres = PostgresServer()
            self.store_url = self.postgres.database("chaos")
        else:
            self.redis = RedisServer(self.workdir)
            self.store_url = self.redis.url
        mesh = self.mesh
        mesh.start_router()
        self.workers = [mesh.spawn_worker(f"worker-{i}", "echo") for i in range(3)]
        self.servers = [
            mesh.spawn_server(f"server-{i}", "--store", self.store_url, "--grace-seconds", "2")
            for i in range(2)
        ]
        mesh.wait_ready(*self.workers, *self.servers)
        self.envoy = mesh.start_envoy(self.servers)
        self.edge = self.envoy.listener_address

    def stop(self) -> None:
        self.mesh.stop()
        if self.redis is not None:
            self.redis.stop()
        if self.postgres is not None:
            self.postgres.stop()

    async def faults(self, deadline: float) -> None:
        """Every fault of the plan, in order, each once the previous one took
        effect and turns landed after it: a worker SIGKILLed (and a new one
        started), a server SIGKILLed and restarted, another worker, the router
        SIGKILLed during turns (turns keep landing without it) and started
        again; then more workers while time remains. Nothing waits on the
        clock: a slow machine stretches the run instead of skipping a fault."""
        start = time.monotonic()
        plan = ["worker", "server", "freeze", "worker", "router"]
        step = 0
        while step < len(plan) or time.monotonic() < deadline:
            await self._turns_land(LANDED_BETWEEN_FAULTS)
            fault = plan[step] if step < len(plan) else "worker"
            step += 1
            if fault == "worker":
                await self._replace_worker(step, start)
            elif fault == "server":
                await self._restart_server(self.servers[0], start)
            elif fault == "freeze":
                await self._freeze_server(self.servers[1], start)
            else:
                await self._router_outage(start)
            if step == len(plan):
                self.plan_done.set()

    async def _turns_land(self, count: int) -> None:
        """Wait until ``count`` more turns finished (the mesh works again)."""
        target = self.counts.turns_finished + count
        async with self.landed:
            await self.landed.wait_for(lambda: self.counts.turns_finished >= target)

    async def _router_outage(self, start: float) -> None:
        """SIGKILL the router while turns run; turns go on landing without it
        (servers serve what their leases hold and forward the rest); then a
        new router on the same address, and every member back in it."""
        assert self.mesh.router is not None
        port = int(self.mesh.router.address.rsplit(":", 1)[1])
        await asyncio.to_thread(self.mesh.kill, self.mesh.router)
        self.counts.faults.append(f"{time.monotonic() - start:.1f}s SIGKILL router")
        before = self.counts.turns_finished
        await self._turns_land(LANDED_BETWEEN_FAULTS)
        self.counts.turns_without_router += self.counts.turns_finished - before
        await asyncio.to_thread(
            self.mesh.start_router, port=port, name=f"router-{len(self.mesh.components)}"
        )
        await self._members_back(len(self.workers) + len(self.servers))
        self.counts.faults.append(f"{time.monotonic() - start:.1f}s restart router")

    async def _freeze_server(self, server: Component, start: float) -> None:
        """SIGSTOP a server while turns run: Envoy's keepalive finds its
        connections dead within 2 s and leaves it out; turns land meanwhile
        (its sessions move once their leases lapse). Then SIGCONT: it comes
        back, learns it lost its sessions, and registers again."""
        os.kill(server.pid, signal.SIGSTOP)
        self.counts.faults.append(f"{time.monotonic() - start:.1f}s SIGSTOP {server.name}")
        try:
            await self._turns_land(LANDED_BETWEEN_FAULTS)
        finally:
            os.kill(server.pid, signal.SIGCONT)
        self.counts.faults.append(f"{time.monotonic() - start:.1f}s SIGCONT {server.name}")
        await self._members_back(len(self.workers) + len(self.servers))

    async def _members_back(self, expected: int) -> None:
        assert self.mesh.router is not None
        async with insecure_channel(self.mesh.router.address) as channel:
            router = RouterServiceStub(channel)
            while True:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    listed = await router.ListMembers(rpb.ListMembersRequest())
                    if len(listed.members) >= expected:
                        return
                await asyncio.sleep(0.05)

    async def _replace_worker(self, generation: int, start: float) -> None:
        victim = self.rng.choice(self.workers)
        self.mesh.kill(victim, signal.SIGKILL)
        replacement = self.mesh.spawn_worker(f"worker-g{generation}", "echo")
        self.workers[self.workers.index(victim)] = replacement
        self.counts.faults.append(f"{time.monotonic() - start:.1f}s SIGKILL {victim.name}")
        await asyncio.to_thread(self.mesh.wait_ready, replacement)

    async def _restart_server(self, server: Component, start: float) -> None:
        port = int(server.address.rsplit(":", 1)[1])
        self.mesh.kill(server, signal.SIGKILL)
        self.counts.faults.append(f"{time.monotonic() - start:.1f}s SIGKILL {server.name}")
        # Same port: Envoy's upstream list is static.
        fresh = self.mesh.spawn(
            f"{server.name}-again",
            "server",
            "--router",
            self.mesh.router.address if self.mesh.router else "",
            "--store",
            self.store_url,
            "--grace-seconds",
            "2",
            port=port,
        )
        await asyncio.to_thread(self.mesh.wait_ready, fresh)
        self.servers[self.servers.index(server)] = fresh
        self.counts.faults.append(f"{time.monotonic() - start:.1f}s restarted {server.name}")

    # Conversations -------------------------------------------------------------

    async def run(self) -> Counts:
        deadline = time.monotonic() + self.seconds
        async with (
            httpx.AsyncClient(base_url=f"http://{self.edge}", timeout=REQUEST_TIMEOUT) as rest,
            AsyncClient(self.edge, timeout=REQUEST_TIMEOUT) as grpc_client,
        ):
            self.rest, self.grpc = rest, grpc_client
            conversations = [
                Conversation(i, f"chaos-{i}", via_rest=i % 2 == 0)
                for i in range(self.conversations)
            ]
            for c in conversations:
                await self._retry(lambda c=c: self.grpc.create_session(c.session_id, agent="echo"))
            faults = asyncio.create_task(self.faults(deadline))
            faults.add_done_callback(lambda _: self.plan_done.set())
            await asyncio.gather(*(self._converse(c, deadline) for c in conversations))
            faults.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await faults
            for c in conversations:
                await self._check(c)
        return self.counts

    async def _retry(self, call: Any) -> Any:
        for attempt in range(RESUME_ATTEMPTS):
            try:
                return await call()
            except (TurnmeshClientError, httpx.HTTPError):
                if attempt == RESUME_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(0.25)
        return None

    async def _converse(self, c: Conversation, deadline: float) -> None:
        turn = 0
        while time.monotonic() < deadline or not self.plan_done.is_set():
            turn += 1
            message = f"c{c.index} t{turn} alpha beta gamma"
            key = f"{c.session_id}-{turn}"
            self.counts.turns_attempted += 1
            try:
                outcome = await asyncio.wait_for(
                    self._one_turn(c, message, key), REQUEST_TIMEOUT * 3
                )
            except TimeoutError:
                self.counts.hung += 1
                continue
            if outcome is None:
                self.counts.turns_failed_cleanly += 1
            else:
                self.counts.turns_finished += 1
                c.finished.append(outcome)
                async with self.landed:
                    self.landed.notify_all()

    async def _one_turn(self, c: Conversation, message: str, key: str) -> str | None:
        """The turn id if it finished, None if it failed cleanly. Broken
        streams are resumed; a turn that never started is retried with the
        same idempotency key (which must not run it twice)."""
        for attempt in range(RESUME_ATTEMPTS):
            if attempt:
                self.counts.turns_retried_with_same_key += 1
                await asyncio.sleep(0.25)
            seen: list[dict[str, Any]] = []
            try:
                async for event in self._turn_events(c, message, key):
                    seen.append(event)
            except Broken as broken:
                if not seen:
                    self._account(broken.refusal, turn=True)
                    continue  # nothing started (or we never heard): same key again
                return await self._resume(c, seen)
            except (TurnmeshClientError, httpx.HTTPStatusError):
                continue
            if not seen or seen[-1]["type"] not in TERMINAL:
                if seen:
                    return await self._resume(c, seen)
                continue
            return seen[-1]["runId"] if seen[-1]["type"] == "RUN_FINISHED" else None
        return None

    async def _turn_events(
        self, c: Conversation, message: str, key: str
    ) -> AsyncIterator[dict[str, Any]]:
        body = {
            "message": message,
            "idempotencyKey": key,
            "policy": "TURN_POLICY_ENQUEUE",
            "metadata": {"delay_ms": 20},
        }
        if c.via_rest:
            try:
                async with aconnect_sse(
                    self.rest, "POST", f"/v1/sessions/{c.session_id}/turns", json=body
                ) as source:
                    if source.response.status_code != 200:
                        await source.response.aread()
                        refusal = _refusal_of_response(source.response)
                        raise Broken(str(source.response.status_code), refusal)
                    async for sse in source.aiter_sse():
                        event = json.loads(sse.data)
                        if event["type"] != "CUSTOM":
                            yield event
            except httpx.TransportError as exc:
                raise Broken(str(exc)) from exc
            return
        try:
            async with self.grpc.stream_turn(
                c.session_id,
                message,
                policy="enqueue",
                idempotency_key=key,
                metadata={"delay_ms": 20},
            ) as stream:
                async for e in stream:
                    if e.type != 11:  # CUSTOM keepalive
                        yield _event_dict(e)
        except TurnmeshClientError as exc:
            raise Broken(str(exc), _refusal_of_error(exc)) from exc

    def _account(self, refusal: Refusal | None, *, turn: bool) -> None:
        """Count a 503 by what explains it (Counts)."""
        if refusal is None:
            return
        if refusal.reason:
            self.counts.unavailable_with_reason += 1
        elif turn and "reset" in refusal.detail:
            self.counts.turns_cut_in_flight += 1
        else:
            self.counts.unexplained_503 += 1
            if len(self.counts.unexplained_details) < 20:
                self.counts.unexplained_details.append(refusal.detail)

    async def _resume(self, c: Conversation, seen: list[dict[str, Any]]) -> str | None:
        """Follow a broken turn to its end with SubscribeTurn; each seq once."""
        self.counts.streams_resumed += 1
        turn_id = seen[0]["runId"]
        last = seen[-1]["seq"]
        for _ in range(RESUME_ATTEMPTS):
            got = False
            try:
                async for event in self._subscribe(c, turn_id, last):
                    got = True
                    if event["seq"] != last + 1:
                        self.counts.resumed_seq_errors += 1
                    last = event["seq"]
                    if event["type"] in TERMINAL:
                        return turn_id if event["type"] == "RUN_FINISHED" else None
            except Broken as broken:
                if not got:
                    self._account(broken.refusal, turn=False)
            except TurnmeshClientError as error:
                if not got:
                    self._account(_refusal_of_error(error), turn=False)
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.25)
        return None

    async def _subscribe(
        self, c: Conversation, turn_id: str, after: int
    ) -> AsyncIterator[dict[str, Any]]:
        if c.via_rest:
            async with aconnect_sse(
                self.rest,
                "GET",
                f"/v1/sessions/{c.session_id}/turns/{turn_id}/events",
                params={"after_seq": after},
            ) as source:
                if source.response.status_code != 200:
                    await source.response.aread()
                    refusal = _refusal_of_response(source.response)
                    raise Broken(str(source.response.status_code), refusal)
                async for sse in source.aiter_sse():
                    event = json.loads(sse.data)
                    if event["type"] != "CUSTOM":
                        yield event
            return
        async with self.grpc.subscribe(c.session_id, turn_id, after) as stream:
            async for e in stream:
                if e.type != 11:
                    yield _event_dict(e)

    # Checks ----------------------------------------------------------------------

    async def _check(self, c: Conversation) -> None:
        history = await self._retry(lambda: self.grpc.history(c.session_id))
        turns: list[str] = []
        users: list[str] = []
        for message in history:
            if not turns or turns[-1] != message.turn_id:
                turns.append(message.turn_id)
            if message.role == "user":
                users.append(message.content)
        by_turn: dict[str, list[Any]] = {}
        for message in history:
            by_turn.setdefault(message.turn_id, []).append(message)
        # A turn appears once, as one block: [user, assistant echoing it].
        self.counts.duplicated += len(turns) - len(set(turns))
        self.counts.duplicated += len(users) - len(set(users))
        for messages in by_turn.values():
            roles = [m.role for m in messages]
            if roles != ["user", "assistant"] or messages[1].content != messages[0].content:
                self.counts.partial += 1
        # Every turn the client saw finish is there, in the order it finished.
        positions = [turns.index(t) for t in c.finished if t in turns]
        self.counts.lost += len(c.finished) - len(positions)
        if positions != sorted(positions):
            self.counts.lost += 1


def _event_dict(event: Any) -> dict[str, Any]:
    from turnmesh.v1 import event_pb2

    return {"type": event_pb2.EventType.Name(event.type), "seq": event.seq, "runId": event.run_id}


async def chaos(
    seconds: float, conversations: int, report: Path | None, store: str = "redis"
) -> Counts:
    with tempfile.TemporaryDirectory(prefix="turnmesh-chaos-") as tmp:
        run = ChaosRun(Path(tmp), seconds, conversations, store)
        try:
            await asyncio.to_thread(run.start)
            counts = await run.run()
        finally:
            await asyncio.to_thread(run.stop)
    if report is not None:
        text = json.dumps({**asdict(counts), "ok": counts.ok}, indent=2)
        await asyncio.to_thread(report.write_text, text)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description="turnmesh chaos run")
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--report", type=Path, default=Path("chaos-report.json"))
    parser.add_argument("--store", choices=["redis", "postgres"], default="redis")
    args = parser.parse_args()
    counts = asyncio.run(chaos(args.seconds, args.conversations, args.report, args.store))
    print(json.dumps({**asdict(counts), "ok": counts.ok}, indent=2))
    raise SystemExit(0 if counts.ok else 1)


if __name__ == "__main__":
    main()
