"""`turnmesh up`'s watch over its children.

A child that dies is started again on the same address after a backoff, as
the restart policy says, while its component's budget lasts. Past the budget,
or when the policy restarts nothing, the mesh must stop: `tick` returns why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from turnmesh.cli._children import Child
from turnmesh.cli._restart import RestartBudget, RestartPolicy, exit_cause
from turnmesh.cli._status import ComponentStatus

# A (re)started child has this long to become ready; then it is killed and
# counts as a failure (a server waits for a worker, so this is generous).
READY_TIMEOUT = 60.0
STOP_BUDGET = 5.0
# Envoy first (no new calls), then servers drain, then workers, the router;
# each group's deadline, in seconds after the stop begins.
STOP_ORDER = (("envoy", 1.0), ("server", 3.5), ("worker", 4.2), ("router", STOP_BUDGET))

Launch = Callable[[bool], Child]  # starts the child; True: a restart (append to its log)
Ready = Callable[[Child], bool]


class Component:
    """One child of `up`: how to start it, how to tell it is ready, and what
    has happened to it."""

    def __init__(
        self,
        name: str,
        kind: str,
        address: str,
        launch: Launch,
        ready: Ready,
        budget: RestartBudget,
        log_path: Path,
    ) -> None:
        self.name = name
        self.kind = kind
        self.address = address
        self.budget = budget
        self.log_path = log_path
        self.child: Child | None = None
        self.state = "starting"
        self.last_exit = "-"
        self._launch = launch
        self._ready = ready
        self._restart_at = 0.0
        self._ready_by = 0.0
        self._timed_out = False

    def start(self, *, restart: bool = False) -> None:
        self.child = self._launch(restart)
        self.state = "starting"
        self._ready_by = time.monotonic() + READY_TIMEOUT
        self._timed_out = False

    def wait_ready(self, deadline: float) -> None:
        """The first start: block until ready (`up` has nothing else to do)."""
        assert self.child is not None
        while not self._ready(self.child):
            self.child.check_alive(deadline)
            time.sleep(0.02)
        self.state = "running"

    def became_ready(self, now: float) -> bool:
        """A restarted child is ready now; one that took too long is killed
        (its exit is then reported as the failure it is)."""
        assert self.child is not None
        if self.state != "starting":
            return False
        if self._ready(self.child):
            self.state = "running"
            return True
        if now > self._ready_by and not self._timed_out:
            self._timed_out = True
            self.child.kill()
        return False

    def exited(self) -> tuple[int, float] | None:
        """(exit code, seconds it ran) once the child is gone, else None."""
        assert self.child is not None
        returncode = self.child.proc.poll()
        if returncode is None:
            return None
        self.child.reap()
        self.last_exit = (
            f"not ready within {READY_TIMEOUT:g} s" if self._timed_out else exit_cause(returncode)
        )
        return returncode, time.monotonic() - self.child.started

    def restart_after(self, delay: float) -> None:
        self.state = "restarting"
        self._restart_at = time.monotonic() + delay

    def restart_due(self, now: float) -> bool:
        return self.state == "restarting" and now >= self._restart_at

    def status(self) -> ComponentStatus:
        # A dead child's pid is no one's business (it may be reused).
        child = self.child if self.state in ("starting", "running", "stopping") else None
        return ComponentStatus(
            name=self.name,
            pid=child.pid if child is not None else None,
            state=self.state,
            restarts=self.budget.total,
            started_at=child.started_at if child is not None else None,
            last_exit=self.last_exit,
            address=self.address,
            log=str(self.log_path),
        )


class Supervisor:
    def __init__(
        self,
        components: list[Component],
        policy: RestartPolicy,
        say: Callable[[str], None],
        changed: Callable[[], None],
    ) -> None:
        self.components = components
        self.policy = policy
        self._say = say
        self._changed = changed

    def tick(self) -> str | None:
        """One look at every child: start what is due, note what became
        ready, handle what died. Returns why the mesh must stop, if it must."""
        for c in self.components:
            now = time.monotonic()
            if c.state == "restarting":
                if c.restart_due(now):
                    c.start(restart=True)
                    self._changed()
                continue
            # The status file changes before a line says so: whoever reads
            # the line can read the file.
            if c.became_ready(now):
                assert c.child is not None
                self._changed()
                self._say(
                    f"{c.name} is back on {c.address} (pid {c.child.pid}, restart {c.budget.total})"
                )
            ended = c.exited()
            if ended is None:
                continue
            returncode, uptime = ended
            stop = self._after_exit(c, returncode, uptime, now)
            if stop is not None:
                self._changed()
                return stop
        return None

    def _after_exit(self, c: Component, returncode: int, uptime: float, now: float) -> str | None:
        cause, log = c.last_exit, c.log_path
        if not self.policy.restarts(returncode):
            c.state = "exited"
            if self.policy is RestartPolicy.NEVER:
                return f"{c.name} exited unexpectedly ({cause}); stopping the mesh (log: {log})"
            return (
                f"{c.name} exited ({cause}), which --restart {self.policy} does not restart; "
                f"stopping the mesh (log: {log})"
            )
        delay = c.budget.next_delay(now, uptime)
        if delay is None:
            c.state = "exited"
            b = c.budget
            return (
                f"{c.name} exited ({cause}) after {b.total} restart(s), and its budget is "
                f"{b.budget} within {b.window:g} s; stopping the mesh (log: {log})"
            )
        c.restart_after(delay)
        self._changed()
        self._say(
            f"{c.name} exited ({cause}); restart {c.budget.total} in {delay:g} s (log: {log})"
        )
        return None

    def stop(self) -> None:
        """Every child, in order, within STOP_BUDGET seconds."""
        started = time.monotonic()
        for c in self.components:
            if c.state != "exited":
                c.state = "stopping"
        self._changed()
        for kind, share in STOP_ORDER:
            group = [c.child for c in self.components if c.kind == kind and c.child is not None]
            for child in group:
                child.terminate()
            for child in group:
                child.wait_gone(started + share)
        for c in self.components:
            c.state = "exited"
