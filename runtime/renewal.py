"""Background loops that keep something alive: a member's lease, the turn
leases of a mesh-wide quota, a member's heartbeats.

``Background`` runs one coroutine as a named task from ``start`` until
``stop``; ``Renewal`` is the loop most of them are: renew every interval,
say once while renewals fail, keep trying.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

__all__ = ["Background", "Renewal"]


class Background:
    """``run()`` as one named task, from ``start`` until ``stop``."""

    def __init__(self, run: Callable[[], Coroutine[Any, Any, None]], *, name: str) -> None:
        self._run = run
        self._name = name
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        """Cancel the task and wait until it has ended; nothing if it is not running."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


class Renewal(Background):
    """``renew()`` every ``interval`` seconds, the first after one interval.

    A failure is logged once (``failing``, at WARNING with its traceback)
    however many renewals fail in a row, and renewing goes on; the first
    success after it logs ``recovered`` (at INFO) when given. ``log`` is the
    caller's logger, so the lines name the module whose renewal it is.
    """

    def __init__(
        self,
        renew: Callable[[], Awaitable[None]],
        interval: float,
        *,
        name: str,
        log: logging.Logger,
        failing: str,
        recovered: str | None = None,
    ) -> None:
        super().__init__(self._keep, name=name)
        self._renew = renew
        self._interval = interval
        self._log = log
        self._failing = failing
        self._recovered = recovered

    async def _keep(self) -> None:
        failing = False
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self._renew()
            except Exception:
                if not failing:
                    self._log.warning(self._failing, exc_info=True)
                failing = True
            else:
                if failing and self._recovered is not None:
                    self._log.info(self._recovered)
                failing = False
