"""Relays: many turns' events on one worker-to-server stream, over a real
in-process gRPC server and channel (worker side) and the server's RelayLink
and TurnRunner (server side)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from tests.unit._server_fakes import spin, spin_until
from tests.unit.test_server_turnrunner import FakePool, FakeStore, pending, types
from tests.unit.test_worker_service import BlockingAgent, names, run_request, worker
from turnmesh.agent import AgentRequest, AgentResponse, EventEmitter
from turnmesh.agent.builtin.echo import EchoAgent
from turnmesh.runtime import metrics
from turnmesh.server.sessions.runner import TurnRunner
from turnmesh.server.workers import relay as server_relay
from turnmesh.server.workers.pool import WorkerRef
from turnmesh.server.workers.relay import RelayLink
from turnmesh.v1 import event_pb2, worker_service_pb2, worker_service_pb2_grpc
from turnmesh.worker import WorkerServicer
from turnmesh.worker import relay as worker_relay
from turnmesh.worker.relay import Relay, RelayClosed

ET = event_pb2.EventType


class TogetherAgent:
    """Every run waits until the test lets them all go, then emits its words
    at once (no await between them): the relay's writer wakes after all."""

    def __init__(self, runs: int, words: int = 5) -> None:
        self.go = asyncio.Event()
        self.waiting = 0
        self.runs = runs
        self.words = words

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        self.waiting += 1
        await self.go.wait()
        for i in range(self.words):
            await emitter.emit_delta(f"{request.message}-{i} ")
        return AgentResponse(text="")


async def open_link(stub: Any) -> RelayLink:
    link = RelayLink(stub, ())
    await spin_until(lambda: link.open or link.closed, max_spins=100_000)
    assert link.open
    return link


def relayed_request(link: RelayLink, key: int, *messages: str) -> worker_service_pb2.RunRequest:
    return run_request(*messages, relay_id=link.relay_id, relay_key=key)


def counter(metric: Any) -> float:
    return float(metric._value.get())


# --- the worker's relay, alone ------------------------------------------------------


def test_a_turns_events_stay_together_in_order_within_a_response() -> None:
    relay = Relay("r")
    for i in range(3):
        relay.put(1, [event_pb2.Event(type=ET.TEXT_MESSAGE_CONTENT, delta=f"a{i}")])
        relay.put(2, [event_pb2.Event(type=ET.TEXT_MESSAGE_CONTENT, delta=f"b{i}")])
    response = relay._outbox[0].response
    assert len(relay._outbox) == 1
    assert [t.relay_key for t in response.turns] == [1, 2]
    assert [e.delta for e in response.turns[0].events] == ["a0", "a1", "a2"]
    assert [e.delta for e in response.turns[1].events] == ["b0", "b1", "b2"]


def test_a_response_holds_at_most_its_byte_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_relay, "MAX_RESPONSE_BYTES", 100)
    relay = Relay("r")
    for i in range(10):
        relay.put(1, [event_pb2.Event(type=ET.TEXT_MESSAGE_CONTENT, delta=f"{i:040d}")])
    responses = [pending.response for pending in relay._outbox]
    assert len(responses) == 5  # two 45-byte events each
    assert all(r.ByteSize() < 150 for r in responses)
    deltas = [e.delta for r in responses for t in r.turns for e in t.events]
    assert deltas == [f"{i:040d}" for i in range(10)]
    # A single event larger than the bound goes alone.
    relay.put(1, [event_pb2.Event(type=ET.TEXT_MESSAGE_CONTENT, delta="x" * 500)])
    assert len(relay._outbox) == 6


async def test_a_server_that_stops_reading_closes_the_relay_at_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(worker_relay, "MAX_OUTBOX_BYTES", 1000)
    relay = Relay("r")
    task: asyncio.Task[object] = asyncio.create_task(asyncio.Event().wait())
    relay.attach(7, task)
    event = event_pb2.Event(type=ET.TEXT_MESSAGE_CONTENT, delta="y" * 100)
    for _ in range(10):  # nobody writes: the outbox only grows, past 1000 bytes
        relay.put(7, [event])
    with pytest.raises(RelayClosed):
        relay.put(7, [event])  # more, while already past the bound
    assert relay.closed
    assert not relay._outbox  # dropped, not kept
    await asyncio.sleep(0)
    assert task.cancelled()
    with pytest.raises(RelayClosed):
        relay.put(7, [event])


async def test_past_the_high_water_mark_emits_wait_for_the_writer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(worker_relay, "HIGH_WATER_BYTES", 350)
    relay = Relay("r")
    event = event_pb2.Event(type=ET.TEXT_MESSAGE_CONTENT, delta="z" * 100)
    for _ in range(3):
        relay.put(1, [event])
    assert relay.room() is None  # 312 bytes: not past it yet
    relay.put(1, [event])
    wait = relay.room()
    assert wait is not None
    waiting = asyncio.ensure_future(wait)
    responses = relay.responses()
    await spin(5)
    assert not waiting.done()
    await anext(responses)  # the writer takes the outbox
    await spin_until(waiting.done)
    assert relay.room() is None
    flushed = asyncio.ensure_future(relay.flush())
    await spin(5)
    assert not flushed.done()  # written only once the transport took it
    relay.close()
    await spin_until(flushed.done)
    await responses.aclose()


# --- worker and link over gRPC ----------------------------------------------------


async def test_turns_that_emit_together_share_one_response() -> None:
    agent = TogetherAgent(runs=3)
    async with worker(agent) as (stub, _):
        link = await open_link(stub)
        got: dict[int, list[str]] = {}

        def collector(n: int) -> Callable[[worker_service_pb2.RelayedEvents], None]:
            return lambda entry: got.setdefault(n, []).extend(e.delta for e in entry.events)

        turns = [link.register(collector(n)) for n in range(3)]
        responses_before = counter(metrics.WORKER_RELAY_RESPONSES)
        calls = [stub.Run(relayed_request(link, t.key, f"t{n}")) for n, t in enumerate(turns)]
        await spin_until(lambda: agent.waiting == 3, max_spins=100_000)
        agent.go.set()
        finals = [[r async for r in call] for call in calls]
        for n, (turn, responses) in enumerate(zip(turns, finals, strict=True)):
            assert len(responses) == 1  # everything but the end went through the relay
            last = responses[0]
            assert last.relayed_events == 1 + agent.words  # TEXT_MESSAGE_START and the words
            assert names(list(last.events)) == ["TEXT_MESSAGE_END", "RUN_FINISHED"]
            assert await turn.wait_for(last.relayed_events)
            assert got[n] == [""] + [f"t{n}-{i} " for i in range(agent.words)]
        # Three turns' 18 events: one response (the writer woke once, after all).
        assert counter(metrics.WORKER_RELAY_RESPONSES) - responses_before == 1
        await link.close()


async def test_a_server_closing_its_relay_stops_the_turns_on_it() -> None:
    agent = BlockingAgent()
    async with worker(agent) as (stub, servicer):
        link = await open_link(stub)
        turn = link.register(lambda entry: None)
        call = stub.Run(relayed_request(link, turn.key, "wait"))
        async with asyncio.timeout(30):
            await agent.started.wait()
            await link.close()
            await agent.cancelled.wait()  # the worker stopped the agent
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await call.read()
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert turn.lost
        assert not await turn.wait_for(1)
        await spin_until(lambda: not len(servicer._relays), max_spins=100_000)


async def test_a_worker_ending_its_relays_fails_the_turns_on_them() -> None:
    agent = BlockingAgent()
    async with worker(agent) as (stub, servicer):
        link = await open_link(stub)
        turn = link.register(lambda entry: None)
        call = stub.Run(relayed_request(link, turn.key, "wait"))
        async with asyncio.timeout(30):
            await agent.started.wait()
            await servicer.close_relays_when_idle(0)  # as at shutdown, past its grace
            await agent.cancelled.wait()
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await call.read()
            await spin_until(lambda: link.closed, max_spins=100_000)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert turn.lost
        assert link.reopen_at > time.monotonic()  # not asked again at once


async def test_a_run_naming_a_relay_the_worker_lacks_streams_on_its_own_call() -> None:
    async with worker(EchoAgent(), "echo") as (stub, _):
        request = run_request("hello world", relay_id="gone", relay_key=1)
        responses = [r async for r in stub.Run(request)]
    events = [e for r in responses for e in r.events]
    assert names(events)[0] == "TEXT_MESSAGE_START"
    assert names(events)[-1] == "RUN_FINISHED"
    assert all(r.relayed_events == 0 for r in responses)


class OlderWorker(WorkerServicer):
    """A worker of a version before relays: the generated base's Relay
    answers UNIMPLEMENTED."""

    Relay = worker_service_pb2_grpc.WorkerServiceServicer.Relay  # type: ignore[assignment]


async def test_a_worker_without_relays_is_asked_again_only_much_later() -> None:
    servicer = OlderWorker(EchoAgent(), agent_name="echo", worker_id="old")
    server = grpc.aio.server()
    worker_service_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            link = RelayLink(worker_service_pb2_grpc.WorkerServiceStub(channel), ())
            await spin_until(lambda: link.closed, max_spins=100_000)
            assert not link.open
            assert link.reopen_at > time.monotonic() + server_relay.REOPEN_SECONDS
    finally:
        await server.stop(None)


# --- the runner over a relay ---------------------------------------------------------


class RelayPool(FakePool):
    """One real worker, reached through its relay while that is open."""

    def __init__(self, stub: Any, link: RelayLink) -> None:
        super().__init__()
        self.workers.append(WorkerRef("w1", "w1:1", "demo", stub))
        self.link = link

    def relay(self, worker: WorkerRef) -> RelayLink | None:  # type: ignore[override]
        return self.link if self.link.open else None


async def over_relay(stub: Any) -> tuple[RelayPool, FakeStore, TurnRunner]:
    """A runner whose one worker is reached through an open relay."""
    pool = RelayPool(stub, await open_link(stub))
    store = FakeStore()
    return pool, store, TurnRunner(store, pool)  # type: ignore[arg-type]


async def test_a_relayed_turn_is_logged_and_committed_like_any_other() -> None:
    async with worker(EchoAgent(), "demo") as (stub, _):
        pool, store, runner = await over_relay(stub)
        relayed_before = counter(metrics.WORKER_RELAYED_EVENTS)
        turn = pending("one two three")
        await runner.run("s1", "demo", turn)
        await pool.link.close()
    assert counter(metrics.WORKER_RELAYED_EVENTS) - relayed_before == 4  # START + 3 words
    assert types(turn.log) == [
        ET.RUN_STARTED,
        ET.TEXT_MESSAGE_START,
        *[ET.TEXT_MESSAGE_CONTENT] * 3,
        ET.TEXT_MESSAGE_END,
        ET.RUN_FINISHED,
    ]
    assert [e.seq for e in turn.log._events] == list(range(1, 8))
    assert [(m.role, m.content) for m in store.sessions["s1"]] == [
        ("user", "one two three"),
        ("assistant", "one two three"),
    ]
    assert pool.link.closed and not pool.link._turns  # nothing left registered


async def test_a_relay_lost_mid_turn_fails_the_turn_and_keeps_history() -> None:
    agent = BlockingAgent()
    async with worker(agent, "demo") as (stub, servicer):
        pool, store, runner = await over_relay(stub)
        turn = pending("wait")
        running = asyncio.create_task(runner.run("s1", "demo", turn))
        async with asyncio.timeout(30):
            await agent.started.wait()
            await servicer.close_relays_when_idle(0)
            await running
    assert turn.log.done
    assert turn.log._events[-1].type == ET.RUN_ERROR
    assert turn.log._events[-1].code == "worker_unavailable"  # nothing streamed: no retry target
    assert store.sessions["s1"] == []
    assert pool.failed == ["w1"]


async def test_a_relay_ending_after_a_turns_last_event_lost_nothing_of_it() -> None:
    turn = server_relay.RelayedTurn(1, lambda entry: None)
    entry = worker_service_pb2.RelayedEvents(relay_key=1)
    entry.events.add(type=ET.TEXT_MESSAGE_CONTENT, delta="all")
    turn.deliver(entry)
    turn.lose()  # the worker ended its relay once the turn was over
    assert await turn.wait_for(1)
    assert not await turn.wait_for(2)


async def test_a_turn_whose_events_cannot_be_taken_is_lost_alone() -> None:
    def refuse(entry: worker_service_pb2.RelayedEvents) -> None:
        raise ValueError("a relay carries no turn's end")

    turn = server_relay.RelayedTurn(1, refuse)
    turn.deliver(worker_service_pb2.RelayedEvents(relay_key=1))
    assert turn.lost
    assert not await turn.wait_for(1)


class BurstAgent:
    """Once let go, emits ``n`` deltas of ``size`` bytes as fast as it can."""

    def __init__(self, n: int, size: int) -> None:
        self.go = asyncio.Event()
        self.started = asyncio.Event()
        self.n, self.size = n, size

    async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
        self.started.set()
        await self.go.wait()
        for i in range(self.n):
            await emitter.emit_delta(f"{i}" + "x" * self.size)
        return AgentResponse(text="")


async def test_a_stopping_worker_writes_a_finished_turns_events_before_ending_its_relay() -> None:
    agent = BurstAgent(n=80, size=128 * 1024)  # 10 MiB the writer is still behind on
    async with worker(agent, "demo") as (stub, servicer):
        pool, store, runner = await over_relay(stub)
        turn = pending("hi")
        running = asyncio.create_task(runner.run("s1", "demo", turn))
        async with asyncio.timeout(60):
            await agent.started.wait()
            closing = asyncio.create_task(servicer.close_relays_when_idle(60))  # SIGTERM
            await spin_until(lambda: servicer._relays_refused)
            agent.go.set()  # the turn ends during the drain
            await running
            await closing
    assert turn.log._events[-1].type == ET.RUN_FINISHED
    assert types(turn.log).count(ET.TEXT_MESSAGE_CONTENT) == 80
    assert [m.role for m in store.sessions["s1"]] == ["user", "assistant"]
    assert pool.failed == []


async def test_a_stopping_worker_refuses_new_relays() -> None:
    async with worker(EchoAgent(), "demo") as (stub, servicer):
        await servicer.close_relays_when_idle(0)
        link = RelayLink(stub, ())
        await spin_until(lambda: link.closed, max_spins=100_000)
        assert not link.open


async def test_one_turns_burst_slows_the_others_and_fails_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Bounds small enough that, without backpressure, the burst would pass
    # the outbox's bound and end the relay with every turn on it.
    monkeypatch.setattr(worker_relay, "HIGH_WATER_BYTES", 1024 * 1024)
    monkeypatch.setattr(worker_relay, "MAX_OUTBOX_BYTES", 4 * 1024 * 1024)
    burst = BurstAgent(n=40, size=256 * 1024)  # 10 MiB
    steady = TogetherAgent(runs=1, words=3)

    class Both:
        async def run(self, request: AgentRequest, *, emitter: EventEmitter) -> AgentResponse:
            agent: Any = burst if request.message == "burst" else steady
            response: AgentResponse = await agent.run(request, emitter=emitter)
            return response

    async with worker(Both(), "demo") as (stub, _):
        pool, store, runner = await over_relay(stub)
        store.sessions = {"acme/s": [], "beta/s": []}
        mine, other = pending("burst"), pending("steady")
        async with asyncio.timeout(60):
            runs = [
                asyncio.create_task(runner.run("acme/s", "demo", mine)),
                asyncio.create_task(runner.run("beta/s", "demo", other)),
            ]
            await burst.started.wait()
            await spin_until(lambda: steady.waiting == 1, max_spins=100_000)
            burst.go.set()
            steady.go.set()
            await asyncio.gather(*runs)
        assert not pool.link.closed
        await pool.link.close()
    assert mine.log._events[-1].type == ET.RUN_FINISHED
    assert types(mine.log).count(ET.TEXT_MESSAGE_CONTENT) == 40
    assert other.log._events[-1].type == ET.RUN_FINISHED
    assert pool.failed == []
