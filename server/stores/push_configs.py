"""A2A tasks' push notification configs, as every store keeps them
(``PushConfigs``, a store's ``push_configs()``), and the memory store's.

A config is opaque here (a serialized ``lf.a2a.v1.TaskPushNotificationConfig``,
credentials included: they are sent with each push), keyed by its session,
its task and its id. A task has at most ``limit`` configs (the caller's
bound); a session keeps those of its ``PUSH_TASKS_PER_SESSION`` most recently
configured tasks (the oldest go first); each is kept ``ttl_seconds`` from
its last write (as long as a task's record) and deleted with its session.
Lists are in config id order in every store.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from turnmesh.runtime.errors import NotFound, ResourceExhausted
from turnmesh.runtime.principals import principal_of, public_id

# Tasks whose configs a session keeps, at most.
PUSH_TASKS_PER_SESSION = 100
# Tasks with configs the memory store keeps in all, and their configs'
# bytes (each at most a few configs of a few KiB: ``compat.a2a.push_configs``
# bounds them); past either, the biggest holder's least recently written go.
MAX_MEMORY_PUSH_TASKS = 10_000
MAX_MEMORY_PUSH_BYTES = 32 * 2**20


class PushConfigs(Protocol):
    async def put(
        self,
        session_id: str,
        task_id: str,
        config_id: str,
        config: bytes,
        *,
        limit: int,
        ttl_seconds: float,
    ) -> bool:
        """Write the config (one with its id is replaced); False (nothing
        written) if the task has ``limit`` others; NotFound if the session
        is gone."""

    async def of_task(self, session_id: str, task_id: str) -> list[bytes]:
        """The task's configs, in config id order."""

    async def delete(self, session_id: str, task_id: str, config_id: str) -> bool:
        """Remove one; False if there was none."""


def session_gone(session_id: str) -> NotFound:
    return NotFound(f"session {public_id(session_id)!r} not found")


@dataclass(slots=True)
class _Task:
    expires: float
    configs: dict[str, tuple[float, bytes]] = field(default_factory=dict)

    def size(self) -> int:
        return sum(len(data) for _, data in self.configs.values())


class MemoryPushConfigs:
    """Configs in this process's memory, lost with it as the sessions are.

    Bounded in tasks and bytes for the whole server, shared between
    principals: a write past either bound makes room from the principal that
    holds the most tasks (past the bytes alone, the most bytes; its least
    recently written first), another's only while that one holds more than
    the writer will, else the writer's own. So a tenant's flood recycles its
    own configs and never keeps another tenant from its share, and nobody
    loses configs to a bigger holder. A write with nothing to take is
    refused (429), nothing dropped."""

    def __init__(
        self,
        exists: Callable[[str], bool],
        max_tasks: int = MAX_MEMORY_PUSH_TASKS,
        max_bytes: int = MAX_MEMORY_PUSH_BYTES,
    ) -> None:
        self._exists = exists
        self._max_tasks = max_tasks
        self._max_bytes = max_bytes
        self._bytes = 0
        # Least recently written first (so the first to expire).
        self._tasks: OrderedDict[tuple[str, str], _Task] = OrderedDict()
        self._of: dict[str, dict[str, None]] = {}
        # Each principal's tasks, least recently written first, and their bytes.
        self._mine: dict[str, OrderedDict[tuple[str, str], None]] = {}
        self._bytes_of: dict[str, int] = {}

    async def put(
        self,
        session_id: str,
        task_id: str,
        config_id: str,
        config: bytes,
        *,
        limit: int,
        ttl_seconds: float,
    ) -> bool:
        if not self._exists(session_id):
            raise session_gone(session_id)
        at = time.monotonic()
        self._expire(at)
        key = (session_id, task_id)
        task = self._live(key, at)
        configs = {k: v for k, v in task.configs.items() if v[0] > at} if task else {}
        if config_id not in configs and len(configs) >= limit:
            return False
        configs[config_id] = (at + ttl_seconds, config)
        size = sum(len(data) for _, data in configs.values())
        # A new task past the session's cap pushes out its oldest: room too.
        order = self._of.get(session_id, {})
        going = None
        if task_id not in order and len(order) >= PUSH_TASKS_PER_SESSION:
            going = (session_id, next(iter(order)))
        for victim in self._room(key, size, going):
            self._drop(victim)
        if task is None:
            task = _Task(at + ttl_seconds)
        writer = principal_of(session_id)
        self._bytes += size - task.size()
        self._bytes_of[writer] = self._bytes_of.get(writer, 0) + size - task.size()
        task.configs = configs
        task.expires = at + ttl_seconds
        self._tasks[key] = task
        self._tasks.move_to_end(key)
        mine = self._mine.setdefault(writer, OrderedDict())
        mine[key] = None
        mine.move_to_end(key)
        order = self._of.setdefault(session_id, {})
        order.pop(task_id, None)
        order[task_id] = None  # within the session's cap: its oldest went above
        return True

    def _room(
        self, key: tuple[str, str], size: int, going: tuple[str, str] | None
    ) -> list[tuple[str, str]]:
        """The tasks that go so that ``key``'s configs fit at ``size`` bytes
        (``going`` first, the session's oldest past its cap), taken as the
        class says: past the task bound from the principal holding the most
        tasks, past the bytes alone from the one holding the most bytes.
        ResourceExhausted when there is not enough to take (nothing is
        dropped then)."""
        held = self._tasks.get(key)
        grows = size - (held.size() if held else 0)
        victims = [going] if going is not None else []
        freed = sum(self._tasks[v].size() for v in victims)
        tasks = len(self._tasks) + (held is None) - len(victims)
        needed = self._bytes + grows - freed
        if tasks <= self._max_tasks and needed <= self._max_bytes:
            return victims
        writer = principal_of(key[0])
        taken = {key, *victims}
        # What each principal holds (the writer's after its write), and what
        # it may give, read lazily, least recently written first.
        holds = {p: len(mine) for p, mine in self._mine.items()}
        holds[writer] = holds.get(writer, 0) + (held is None) - len(victims)
        weighs = dict(self._bytes_of)
        weighs[writer] = weighs.get(writer, 0) + grows - freed
        givable = {p: len(mine) - sum(k in mine for k in taken) for p, mine in self._mine.items()}
        queues = {p: (k for k in mine if k not in taken) for p, mine in self._mine.items()}
        while tasks > self._max_tasks or needed > self._max_bytes:
            measure = holds if tasks > self._max_tasks else weighs
            others = (p for p in givable if p != writer and givable[p])
            biggest = max(others, key=lambda p: measure.get(p, 0), default=None)
            if biggest is not None and measure.get(biggest, 0) > measure.get(writer, 0):
                giver = biggest
            elif givable.get(writer):
                giver = writer
            else:
                raise ResourceExhausted(
                    "this server holds as many push notification configs as it may; "
                    "delete some of yours, or retry when older ones expire",
                    retry_after=60,
                )
            victim = next(queues[giver])
            weight = self._tasks[victim].size()
            holds[giver] -= 1
            weighs[giver] = weighs.get(giver, 0) - weight
            givable[giver] -= 1
            victims.append(victim)
            tasks -= 1
            needed -= weight
        return victims

    def _expire(self, at: float) -> None:
        # Written least recently first, with one TTL: the expired are in front.
        while self._tasks:
            oldest, first = next(iter(self._tasks.items()))
            if first.expires > at:
                return
            self._drop(oldest)

    async def of_task(self, session_id: str, task_id: str) -> list[bytes]:
        at = time.monotonic()
        task = self._live((session_id, task_id), at)
        if task is None:
            return []
        return [data for _, (until, data) in sorted(task.configs.items()) if until > at]

    async def delete(self, session_id: str, task_id: str, config_id: str) -> bool:
        task = self._live((session_id, task_id), time.monotonic())
        if task is None or (gone := task.configs.pop(config_id, None)) is None:
            return False
        self._bytes -= len(gone[1])
        self._bytes_of[principal_of(session_id)] -= len(gone[1])
        return True

    def drop_session(self, session_id: str) -> None:
        for task_id in list(self._of.get(session_id, {})):
            self._drop((session_id, task_id))

    def _live(self, key: tuple[str, str], at: float) -> _Task | None:
        task = self._tasks.get(key)
        if task is not None and task.expires <= at:
            self._drop(key)
            return None
        return task

    def _drop(self, key: tuple[str, str]) -> None:
        principal = principal_of(key[0])
        if (gone := self._tasks.pop(key, None)) is not None:
            self._bytes -= gone.size()
            self._bytes_of[principal] -= gone.size()
        mine = self._mine.get(principal)
        if mine is not None:
            mine.pop(key, None)
            if not mine:
                del self._mine[principal]
                self._bytes_of.pop(principal, None)
        order = self._of.get(key[0])
        if order is not None:
            order.pop(key[1], None)
            if not order:
                del self._of[key[0]]
