"""When `turnmesh up` restarts a child that died: the policy, exponential
backoff, and a restart budget per component. Pure logic, no processes."""

from __future__ import annotations

import signal
from collections import deque
from enum import StrEnum

INITIAL_BACKOFF = 0.5
MAX_BACKOFF = 30.0
# A child up this long was healthy: its next failure starts from the initial
# delay again, so one crash a day never waits 30 s.
STABLE_SECONDS = 60.0
# A component restarted more than its budget within this window is broken,
# not unlucky: `up` stops the mesh instead of looping.
BUDGET_WINDOW = 300.0
DEFAULT_BUDGET = 5


class RestartPolicy(StrEnum):
    ALWAYS = "always"  # also after a clean exit (code 0)
    ON_FAILURE = "on-failure"  # a non-zero exit or a signal
    NEVER = "never"  # any exit stops the whole mesh

    def restarts(self, returncode: int) -> bool:
        if self is RestartPolicy.NEVER:
            return False
        return self is RestartPolicy.ALWAYS or returncode != 0


def exit_cause(returncode: int) -> str:
    """'exit code 1' or 'killed by SIGKILL' (Popen: -N is signal N)."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


class RestartBudget:
    """One component's restarts: the delay before the next, or None once
    `budget` restarts happened within `window` seconds."""

    def __init__(self, budget: int, window: float = BUDGET_WINDOW) -> None:
        self.budget = budget
        self.window = window
        self.total = 0
        self._recent: deque[float] = deque()
        self._consecutive = 0

    def next_delay(self, now: float, uptime: float) -> float | None:
        while self._recent and now - self._recent[0] > self.window:
            self._recent.popleft()
        if len(self._recent) >= self.budget:
            return None
        if uptime >= STABLE_SECONDS:
            self._consecutive = 0
        delay: float = min(MAX_BACKOFF, INITIAL_BACKOFF * 2.0**self._consecutive)
        self._consecutive += 1
        self._recent.append(now)
        self.total += 1
        return delay
