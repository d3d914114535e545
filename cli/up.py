"""``turnmesh up``: router, workers and session servers as child processes, in
the foreground. Ctrl-C (or SIGTERM) stops them in order: servers drain first,
then workers, then the router."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

READY_TIMEOUT = 60.0


class _Child:
    def __init__(self, name: str, args: list[str], ready_dir: Path) -> None:
        self.name = name
        self.ready_file = ready_dir / f"{name}.json"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "turnmesh", *args, "--ready-file", str(self.ready_file)],
            stdin=subprocess.DEVNULL,
            # Own process group: Ctrl-C reaches only us, and we stop children in order.
            start_new_session=True,
        )
        self.info: dict[str, object] = {}

    def wait_ready(self, deadline: float) -> None:
        while not self.ready_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} was not ready in {READY_TIMEOUT:.0f} s")
            time.sleep(0.05)
        self.info = json.loads(self.ready_file.read_text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)


def _stop_all(groups: list[list[_Child]]) -> None:
    for group in groups:
        for child in group:
            child.stop()
        for child in group:
            try:
                child.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()


def run_up(args: argparse.Namespace) -> int:
    stop_requested = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    common = ["--log-level", args.log_level]
    routers: list[_Child] = []
    workers: list[_Child] = []
    servers: list[_Child] = []
    with tempfile.TemporaryDirectory(prefix="turnmesh-up-") as tmp:
        ready_dir = Path(tmp)
        try:
            started = time.monotonic()
            deadline = started + READY_TIMEOUT
            routers.append(_Child("router", ["router", "--port", "0", *common], ready_dir))
            routers[0].wait_ready(deadline)
            router = str(routers[0].info["address"])
            for i in range(args.workers):
                workers.append(
                    _Child(
                        f"worker-{i + 1}",
                        [
                            "worker",
                            "--port",
                            "0",
                            "--router",
                            router,
                            "--agent",
                            args.agent,
                            *common,
                        ],
                        ready_dir,
                    )
                )
            for i in range(args.servers):
                port = args.port + i if args.port else 0
                servers.append(
                    _Child(
                        f"server-{i + 1}",
                        [
                            "server",
                            "--port",
                            str(port),
                            "--router",
                            router,
                            "--agent",
                            _agent_name(args.agent),
                            *common,
                        ],
                        ready_dir,
                    )
                )
            for child in [*workers, *servers]:
                child.wait_ready(deadline)
            elapsed = time.monotonic() - started
            addresses = ", ".join(str(s.info["address"]) for s in servers)
            print(
                f"turnmesh is up in {elapsed:.1f} s: agent {args.agent!r}, "
                f"SessionService on {addresses} (router {router}). Ctrl-C stops it.\n"
                f"  try: grpcurl -plaintext {servers[0].info['address']} list",
                flush=True,
            )
            while not stop_requested:
                for child in [*routers, *workers, *servers]:
                    if child.proc.poll() is not None:
                        print(f"{child.name} exited with code {child.proc.returncode}", flush=True)
                        return 1
                time.sleep(0.2)
            return 0
        except (RuntimeError, TimeoutError) as exc:
            print(f"turnmesh up: {exc}", file=sys.stderr, flush=True)
            return 1
        finally:
            print("stopping: draining servers, then workers, then the router", flush=True)
            _stop_all([servers, workers, routers])


def _agent_name(spec: str) -> str:
    """The name a worker registers for an agent spec (built-ins keep theirs)."""
    if ":" not in spec:
        return spec
    from turnmesh.agent import load_agent

    name, _ = load_agent(spec)
    return name


__all__ = ["run_up"]
