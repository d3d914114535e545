"""`turnmesh up`'s supervision: restart policy, backoff and budget, the fixed
ports, the status table, and the bind rules of `up` and `edge`. The
supervisor runs real (tiny) child processes."""

from __future__ import annotations

import argparse
import io
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from turnmesh.cli._children import Child
from turnmesh.cli._ports import _ephemeral_low, free_ports
from turnmesh.cli._restart import (
    BUDGET_WINDOW,
    STABLE_SECONDS,
    RestartBudget,
    RestartPolicy,
    exit_cause,
)
from turnmesh.cli._status import ComponentStatus, run_status, table, write_status
from turnmesh.cli._supervisor import Component, Supervisor
from turnmesh.runtime.exposure import ExposureRefused, check_edge_exposure, check_up_exposure


def test_exit_causes_name_the_code_or_the_signal() -> None:
    assert exit_cause(0) == "exit code 0"
    assert exit_cause(3) == "exit code 3"
    assert exit_cause(-9) == "killed by SIGKILL"
    assert exit_cause(-15) == "killed by SIGTERM"
    assert exit_cause(-200) == "killed by signal 200"


def test_each_policy_restarts_what_it_says() -> None:
    assert [RestartPolicy.ALWAYS.restarts(c) for c in (0, 1, -9)] == [True, True, True]
    assert [RestartPolicy.ON_FAILURE.restarts(c) for c in (0, 1, -9)] == [False, True, True]
    assert [RestartPolicy.NEVER.restarts(c) for c in (0, 1, -9)] == [False, False, False]


def test_backoff_doubles_to_its_cap_and_the_budget_ends_it() -> None:
    budget = RestartBudget(9, window=1e9)
    delays = [budget.next_delay(now=float(i), uptime=1.0) for i in range(10)]
    assert delays == [0.5, 1, 2, 4, 8, 16, 30, 30, 30, None]
    assert budget.total == 9


def test_the_budget_counts_restarts_within_its_window_only() -> None:
    budget = RestartBudget(2)
    assert budget.next_delay(now=0.0, uptime=1.0) == 0.5
    assert budget.next_delay(now=1.0, uptime=1.0) == 1
    assert budget.next_delay(now=2.0, uptime=1.0) is None  # spent
    # The first restart leaves the window: one more is allowed.
    assert budget.next_delay(now=BUDGET_WINDOW + 0.5, uptime=1.0) == 2
    assert budget.total == 3


def test_a_child_that_stayed_up_starts_its_backoff_over() -> None:
    budget = RestartBudget(10)
    assert [budget.next_delay(now=float(i), uptime=1.0) for i in range(3)] == [0.5, 1, 2]
    assert budget.next_delay(now=3.0, uptime=STABLE_SECONDS) == 0.5


def test_zero_budget_restarts_nothing() -> None:
    assert RestartBudget(0).next_delay(now=0.0, uptime=1.0) is None


# -- the supervisor, with real child processes --------------------------------


def _component(tmp_path: Path, exit_code: int, budget: int) -> Component:
    """A child that exits with `exit_code` at once, never ready."""
    argv = [sys.executable, "-c", f"raise SystemExit({exit_code})"]

    def launch(restart: bool) -> Child:
        return Child("job", argv, tmp_path, io.StringIO(), tmp_path / "job.ready",
                     append_log=restart)  # fmt: skip

    log = tmp_path / "job.log"
    return Component(
        "job", "worker", "127.0.0.1:1", launch, Child.is_ready, RestartBudget(budget), log
    )


def _supervise(tmp_path: Path, policy: RestartPolicy, exit_code: int) -> tuple[str, list[str]]:
    said: list[str] = []
    component = _component(tmp_path, exit_code, budget=1)
    supervisor = Supervisor([component], policy, said.append, lambda: None)
    component.start()
    deadline = time.monotonic() + 60
    while (reason := supervisor.tick()) is None:
        assert time.monotonic() < deadline, said
        time.sleep(0.01)
    supervisor.stop()
    return reason, said


@pytest.mark.parametrize(
    ("policy", "code", "restarted"),
    [
        (RestartPolicy.ALWAYS, 0, True),
        (RestartPolicy.ON_FAILURE, 3, True),
        (RestartPolicy.ON_FAILURE, 0, False),
        (RestartPolicy.NEVER, 3, False),
    ],
)
def test_the_supervisor_restarts_as_the_policy_says_then_stops_at_the_budget(
    tmp_path: Path, policy: RestartPolicy, code: int, restarted: bool
) -> None:
    reason, said = _supervise(tmp_path, policy, code)
    log = tmp_path / "job.log"
    if restarted:
        assert said == [f"job exited (exit code {code}); restart 1 in 0.5 s (log: {log})"]
        assert reason == (
            f"job exited (exit code {code}) after 1 restart(s), and its budget is 1 within "
            f"300 s; stopping the mesh (log: {log})"
        )
    elif policy is RestartPolicy.NEVER:
        assert said == []
        assert reason == (
            f"job exited unexpectedly (exit code {code}); stopping the mesh (log: {log})"
        )
    else:
        assert said == []
        assert reason == (
            "job exited (exit code 0), which --restart on-failure does not restart; "
            f"stopping the mesh (log: {log})"
        )


# -- fixed ports ----------------------------------------------------------------


def test_fixed_ports_are_distinct_free_and_outside_the_ephemeral_range() -> None:
    ports = free_ports(8)
    assert len(set(ports)) == 8
    assert all(1024 <= p < _ephemeral_low() for p in ports)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    again = free_ports(4, exclude=set(ports))
    assert not set(again) & set(ports)


# -- the status table and `turnmesh status` --------------------------------------


def _rows(now: float) -> list[ComponentStatus]:
    return [
        ComponentStatus("router", 101, "running", 0, now - 5, "-", "127.0.0.1:20001", "r.log"),
        ComponentStatus("worker-1", 202, "running", 2, now - 125, "killed by SIGKILL",
                        "127.0.0.1:20002", "w.log"),
        ComponentStatus("server-1", 303, "restarting", 1, now - 9, "exit code 1",
                        "127.0.0.1:20003", "s.log"),
    ]  # fmt: skip


def test_the_status_table_has_a_row_per_component() -> None:
    now = 1_000_000.0
    lines = table(_rows(now), now=now).splitlines()
    assert lines[0].split() == ["component", "pid", "state", "restarts", "uptime", "last",
                                "exit", "address"]  # fmt: skip
    assert lines[1].split() == ["router", "101", "running", "0", "5s", "-", "127.0.0.1:20001"]
    assert lines[2].split() == ["worker-1", "202", "running", "2", "2m05s", "killed", "by",
                                "SIGKILL", "127.0.0.1:20002"]  # fmt: skip
    # Waiting to restart: no process, no uptime.
    assert lines[3].split() == ["server-1", "-", "restarting", "1", "-", "exit", "code", "1",
                                "127.0.0.1:20003"]  # fmt: skip


def test_status_reads_the_file_of_a_running_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_status(tmp_path, "running", _rows(time.time()))  # this process plays `up`
    assert run_status(argparse.Namespace(run_dir=tmp_path, json=False)) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"turnmesh up (pid {os.getpid()}) in {tmp_path}: running"
    assert "worker-1" in out and "killed by SIGKILL" in out
    write_status(tmp_path, "stopped", _rows(time.time()))
    assert run_status(argparse.Namespace(run_dir=tmp_path, json=False)) == 1
    assert run_status(argparse.Namespace(run_dir=tmp_path / "none", json=False)) == 1


# -- who may bind a public address --------------------------------------------------


def test_up_needs_api_keys_or_allow_open_on_a_public_host() -> None:
    for host in ("127.0.0.1", "localhost", "::1"):
        check_up_exposure(host, api_keys=False, allow_open=False)
    check_up_exposure("0.0.0.0", api_keys=True, allow_open=False)
    check_up_exposure("0.0.0.0", api_keys=False, allow_open=True)
    with pytest.raises(ExposureRefused, match=r"^refusing to serve on 10\.0\.0\.1 without API"):
        check_up_exposure("10.0.0.1", api_keys=False, allow_open=False)


def test_a_public_edge_needs_https_and_mutual_tls_to_remote_servers() -> None:
    far, near = ["10.0.0.2:7100"], ["127.0.0.1:7100", "[::1]:7100", "localhost:7100"]

    def check(host: str, listener: bool, upstream: bool, upstreams: list[str],
              allow_open: bool = False) -> None:  # fmt: skip
        check_edge_exposure(host, listener_tls=listener, upstream_tls=upstream,
                            upstreams=upstreams, allow_open=allow_open)  # fmt: skip

    check("127.0.0.1", False, False, far)
    check("0.0.0.0", True, True, far)
    check("0.0.0.0", True, False, near)
    check("0.0.0.0", False, False, far, allow_open=True)
    with pytest.raises(ExposureRefused, match=r"without HTTPS \(--edge-tls-cert"):
        check("0.0.0.0", False, True, far)
    with pytest.raises(ExposureRefused, match=r"without mutual TLS to the servers"):
        check("0.0.0.0", True, False, far)
    with pytest.raises(ExposureRefused, match=r"without HTTPS .* and mutual TLS"):
        check("0.0.0.0", False, False, [*near, *far])
