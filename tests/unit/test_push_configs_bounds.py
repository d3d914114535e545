"""The memory store's push configs under random writes, deletes and drops:
its counts stay true and its bounds hold (server/stores/push_configs.py)."""

from __future__ import annotations

import contextlib
import random

import pytest

from turnmesh.runtime.errors import ResourceExhausted
from turnmesh.runtime.principals import principal_of
from turnmesh.server.stores import push_configs
from turnmesh.server.stores.push_configs import MemoryPushConfigs


def _check(configs: MemoryPushConfigs, max_tasks: int, max_bytes: int) -> None:
    tasks = configs._tasks
    assert len(tasks) <= max_tasks
    assert configs._bytes == sum(t.size() for t in tasks.values()) <= max_bytes
    by_principal: dict[str, int] = {}
    for key, task in tasks.items():
        by_principal[principal_of(key[0])] = by_principal.get(principal_of(key[0]), 0) + task.size()
    assert configs._bytes_of == by_principal
    assert {k for mine in configs._mine.values() for k in mine} == set(tasks)
    assert {(s, t) for s, order in configs._of.items() for t in order} == set(tasks)


@pytest.mark.parametrize("seed", range(40))
async def test_counts_stay_true_and_bounds_hold(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(push_configs, "PUSH_TASKS_PER_SESSION", 4)
    rng = random.Random(seed)
    max_tasks, max_bytes = 12, 600
    configs = MemoryPushConfigs(lambda _: True, max_tasks=max_tasks, max_bytes=max_bytes)
    sessions = [f"{p}/s{n}" for p in ("alice", "bob", "carol") for n in range(2)]
    for _ in range(300):
        session, task = rng.choice(sessions), f"t{rng.randrange(8)}"
        roll = rng.random()
        if roll < 0.7:
            data = b"x" * rng.choice((5, 20, 90, 250))
            with contextlib.suppress(ResourceExhausted):
                config = f"c{rng.randrange(3)}"
                await configs.put(session, task, config, data, limit=2, ttl_seconds=600)
        elif roll < 0.9:
            await configs.delete(session, task, f"c{rng.randrange(3)}")
        else:
            configs.drop_session(session)
        _check(configs, max_tasks, max_bytes)
