"""Renewal: every interval, one warning while failing, on until stopped."""

from __future__ import annotations

import asyncio
import logging

import pytest

from turnmesh.runtime.renewal import Background, Renewal

log = logging.getLogger("tests.renewal")


async def test_a_failing_renewal_warns_once_keeps_going_and_says_when_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outcomes = [OSError("down"), OSError("still down"), OSError("still down"), None, None]
    calls = 0
    done = asyncio.Event()

    async def renew() -> None:
        nonlocal calls
        outcome = outcomes[calls]
        calls += 1
        if calls == len(outcomes):
            done.set()
        if outcome is not None:
            raise outcome

    renewal = Renewal(
        renew, 0.001, name="test", log=log, failing="cannot renew", recovered="renewed again"
    )
    caplog.set_level(logging.INFO, logger=log.name)
    renewal.start()
    async with asyncio.timeout(5):
        await done.wait()
    await renewal.stop()
    await renewal.stop()  # stopping twice is stopping once
    lines = [(r.levelno, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert lines == [
        (logging.WARNING, "cannot renew", True),  # once, with the first failure
        (logging.INFO, "renewed again", False),
    ]


async def test_the_first_renewal_waits_one_interval_and_stop_ends_the_task() -> None:
    renewed = asyncio.Event()

    async def renew() -> None:
        renewed.set()

    renewal = Renewal(renew, 60, name="slow", log=log, failing="cannot renew")
    renewal.start()
    await asyncio.sleep(0.01)
    assert not renewed.is_set()
    await renewal.stop()
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "slow"]


async def test_a_background_task_is_named_and_stopped_before_or_after_start() -> None:
    started = asyncio.Event()

    async def run() -> None:
        started.set()
        await asyncio.Event().wait()

    background = Background(run, name="loop")
    await background.stop()  # never started: nothing to do
    background.start()
    await started.wait()
    assert [t.get_name() for t in asyncio.all_tasks() if t.get_name() == "loop"] == ["loop"]
    await background.stop()
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "loop"]
