"""Shared helpers for the session-server unit tests: a fake clock, a
deterministic way to let the event loop run until something has happened, and
a fake TurnRunner."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from types import SimpleNamespace
from typing import Any

from turnmesh.server.sessions.turns import CancelReason, PendingTurn
from turnmesh.v1 import event_pb2
from turnmesh.v1 import session_service_pb2 as spb

ET = event_pb2.EventType


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def fake_time_module(clock: FakeClock) -> SimpleNamespace:
    """A stand-in for a module's ``time`` import: ``monotonic`` is the fake clock,
    ``time`` stays real. Patching the module attribute (not ``time.monotonic``
    itself) keeps the event loop's own clock untouched."""
    return SimpleNamespace(monotonic=clock, time=time.time, time_ns=time.time_ns)


async def spin_until(predicate: Callable[[], bool], *, max_spins: int = 1000) -> None:
    """Yield to the event loop until ``predicate()`` holds. Counts loop
    iterations, never wall time, so it is deterministic."""
    for _ in range(max_spins):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


async def spin(times: int = 20) -> None:
    """Let every ready callback run a few rounds (to show nothing else happens)."""
    for _ in range(times):
        await asyncio.sleep(0)


class FakeRunner:
    """Mirrors TurnRunner's contract with the turn log (the only part
    SessionTurns relies on): RUN_STARTED first, then, once the test opens the
    turn's gate, RUN_FINISHED; on cancellation a RUN_ERROR coded with
    ``turn.cancel_reason`` before re-raising."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.started: list[str] = []  # turn ids, in the order their run began
        self.messages: dict[str, list[str]] = {}  # what each turn ran with
        self.running = 0
        self.max_running = 0
        self.on_schedule: dict[str, Any] = {}  # turn id -> callback when its task is made

    @property
    def inflight(self) -> int:
        """What SessionCore reads for its turns-in-flight limit."""
        return self.running

    def gate(self, turn: PendingTurn) -> asyncio.Event:
        return self.gates.setdefault(turn.turn_id, asyncio.Event())

    def finish(self, turn: PendingTurn) -> None:
        self.gate(turn).set()

    def run(self, session_id: str, agent_name: str, turn: PendingTurn) -> Coroutine[Any, Any, None]:
        # A plain method returning the coroutine, so that a test can act in the
        # gap between SessionTurns creating the task and the task first running.
        callback = self.on_schedule.pop(turn.turn_id, None)
        if callback is not None:
            asyncio.get_running_loop().call_soon(callback)
        return self._run(turn)

    async def _run(self, turn: PendingTurn) -> None:
        tlog = turn.log
        tlog.set_state(spb.TURN_STATE_RUNNING)
        first = event_pb2.Event(type=ET.RUN_STARTED)
        if len(turn.messages) > 1:
            first.collected_messages = len(turn.messages)
        tlog.append(first)
        self.started.append(turn.turn_id)
        self.messages[turn.turn_id] = list(turn.messages)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await self.gate(turn).wait()
            tlog.append(event_pb2.Event(type=ET.RUN_FINISHED))
            tlog.set_state(spb.TURN_STATE_FINISHED)
        except asyncio.CancelledError:
            if not tlog.done:
                tlog.append((turn.cancel_reason or CancelReason.CANCELLED).event())
                tlog.set_state(spb.TURN_STATE_CANCELLED)
            raise
        finally:
            self.running -= 1
