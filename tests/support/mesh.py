"""Start real turnmesh processes on free loopback ports and stop them by PID."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc

from turnmesh.client import AsyncClient
from turnmesh.envoy import EdgeConfig, EdgeGuards
from turnmesh.envoy.process import RunningEnvoy, write_config
from turnmesh.envoy.process import start as start_envoy
from turnmesh.envoy.timeouts import EdgeTimeouts
from turnmesh.runtime.serving import insecure_channel
from turnmesh.runtime.tls import TlsFiles
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1.router_service_pb2_grpc import RouterServiceStub

SUPPORT_DIR = Path(__file__).resolve().parent
READY_TIMEOUT = 60.0
POLL = 0.02


@dataclass
class Component:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    ready_file: Path
    info: dict[str, object] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return str(self.info["address"])

    @property
    def member_id(self) -> str:
        return str(self.info.get("member_id", ""))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class Mesh:
    """A set of turnmesh processes owned by one test or test session."""

    def __init__(
        self, workdir: Path, heartbeat_interval: float = 0.3, common_args: tuple[str, ...] = ()
    ) -> None:
        self.workdir = workdir
        # Flags every component gets (the mesh key, TLS files).
        self.common_args = common_args
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.probe_dir = workdir / "probe"
        self.probe_dir.mkdir(exist_ok=True)
        self.heartbeat_interval = heartbeat_interval
        self.components: list[Component] = []
        self.envoys: list[RunningEnvoy] = []
        self.router: Component | None = None

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TURNMESH_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SUPPORT_DIR), env.get("PYTHONPATH")]))
        env["TURNMESH_PROBE_DIR"] = str(self.probe_dir)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def spawn(self, name: str, *args: str, port: int = 0) -> Component:
        ready = self.workdir / f"{name}.ready.json"
        ready.unlink(missing_ok=True)
        log_path = self.workdir / f"{name}.log"
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "turnmesh",
                    *args,
                    *self.common_args,
                    "--port",
                    str(port),
                    "--ready-file",
                    str(ready),
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._env(),
                start_new_session=True,
            )
        component = Component(name, proc, log_path, ready)
        self.components.append(component)
        return component

    def wait_ready(self, *components: Component, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        for c in components:
            while not c.ready_file.exists():
                if c.proc.poll() is not None:
                    raise RuntimeError(f"{c.name} exited with {c.proc.returncode}:\n{c.log()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{c.name} not ready after {timeout} s:\n{c.log()}")
                time.sleep(POLL)
            c.info = json.loads(c.ready_file.read_text())

    def start_router(self, *extra: str, port: int = 0, name: str = "router") -> Component:
        self.router = self.spawn(
            name,
            "router",
            "--heartbeat-interval",
            str(self.heartbeat_interval),
            "--heartbeat-timeout",
            str(self.heartbeat_interval * 8),  # slack for a loaded 2-core machine
            *extra,
            port=port,
        )
        self.wait_ready(self.router)
        return self.router

    def restart_router(self) -> Component:
        """SIGKILL the router and start a new one on the same address."""
        assert self.router is not None
        port = int(self.router.address.rsplit(":", 1)[1])
        self.kill(self.router)
        return self.start_router(port=port, name=f"router-{len(self.components)}")

    def spawn_worker(self, name: str, agent: str) -> Component:
        assert self.router is not None
        return self.spawn(name, "worker", "--router", self.router.address, "--agent", agent)

    def spawn_server(self, name: str, *extra: str) -> Component:
        assert self.router is not None
        return self.spawn(name, "server", "--router", self.router.address, *extra)

    def start_envoy(
        self,
        servers: list[Component],
        name: str = "envoy",
        *,
        listener_tls: tuple[Path, Path] | None = None,
        upstream_tls: TlsFiles | None = None,
        ca_file: Path | None = None,
        otlp_endpoint: str | None = None,
        cors_origins: tuple[str, ...] | None = None,
        guards: EdgeGuards | None = None,
        timeouts: EdgeTimeouts | None = None,
        api_keys: bool | None = None,
    ) -> RunningEnvoy:
        """Envoy on a free port in front of the given servers; waits until a
        REST health call succeeds through it (a server serves behind it; /ready
        would also wait for a worker of the servers' default agent) (over HTTPS trusting
        ``ca_file`` when the listener has TLS). It checks keys at the edge
        when the servers have them, as ``turnmesh up`` does."""
        config = EdgeConfig(
            upstreams=[s.address for s in servers],
            # Servers started with --ws-port: AReaL's /ws goes to them.
            ws_upstreams=[str(s.info["ws_address"]) for s in servers if s.info.get("ws_address")],
            port=0,
            admin_port=0,
            listener_tls=listener_tls,
            upstream_tls=upstream_tls,
            otlp_endpoint=otlp_endpoint,
            api_keys=any(_has_api_keys(s) for s in servers) if api_keys is None else api_keys,
            timeouts=timeouts or EdgeTimeouts(),
        )
        if cors_origins is not None:
            config = replace(config, cors_origins=cors_origins)
        if guards is not None:
            config = replace(config, guards=guards)
        scheme, context = "http", None
        if listener_tls is not None:
            scheme, context = "https", ssl.create_default_context(cafile=ca_file)
        path = write_config(config, self.workdir / f"{name}.json")
        log_path = self.workdir / f"{name}.log"
        with log_path.open("wb") as log_file:
            envoy = start_envoy(path, self.workdir, stdout=log_file)
        self.envoys.append(envoy)
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            try:
                with urllib.request.urlopen(
                    f"{scheme}://{envoy.listener_address}/health", timeout=5, context=context
                ) as response:
                    if response.status == 200:
                        return envoy
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not ready:\n{log_path.read_text()}")
            time.sleep(POLL)

    def kill(self, component: Component, sig: signal.Signals = signal.SIGKILL) -> None:
        if component.proc.poll() is None:
            os.kill(component.pid, sig)
        component.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM every process we started (by PID), SIGKILL what lingers."""
        for envoy in self.envoys:
            if envoy.proc.poll() is None:
                envoy.proc.terminate()
            try:
                envoy.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                envoy.proc.kill()
                envoy.proc.wait(timeout=10)
        for c in reversed(self.components):
            if c.proc.poll() is None:
                os.kill(c.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for c in reversed(self.components):
            remaining = max(0.1, deadline - time.monotonic())
            try:
                c.proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                os.kill(c.pid, signal.SIGKILL)
                c.proc.wait(timeout=10)


def start_keyed_mesh(
    mesh: Mesh,
    keys: Path,
    mesh_key: str,
    *,
    agent: str = "demo",
    servers: int = 2,
    server_flags: Sequence[str] = (),
) -> list[Component]:
    """A router, a worker and ``servers`` servers, all with the mesh key, the
    servers with the API keys file ``keys`` (and ``server_flags``); returns
    the servers, ready."""
    mesh.router = router = mesh.spawn("router", "router", "--mesh-key", mesh_key)
    mesh.wait_ready(router)
    worker = mesh.spawn(
        "worker", "worker", "--router", router.address, "--agent", agent, "--mesh-key", mesh_key
    )
    flags = (
        *("--router", router.address, "--mesh-key", mesh_key, "--api-keys-file", str(keys)),
        *server_flags,
    )
    started = [mesh.spawn(f"server-{i}", "server", *flags) for i in range(1, servers + 1)]
    mesh.wait_ready(worker, *started)
    return started


def _has_api_keys(server: Component) -> bool:
    # Spawned components get no TURNMESH_* variables: a file is the only way.
    args = server.proc.args
    return isinstance(args, list) and "--api-keys-file" in args


def wait_for(predicate: object, timeout: float = 20.0, what: str = "condition") -> None:
    """Poll a readiness condition until true (never a bare sleep)."""
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(POLL)


async def until(predicate: object, timeout: float = 20.0, what: str = "condition") -> None:
    """The asyncio form of wait_for: polls without blocking the event loop."""
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(POLL)


async def eventually(
    predicate: Callable[[], Awaitable[bool]], timeout: float = 20.0, what: str = "condition"
) -> None:
    """Poll an async readiness condition until true."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(POLL)


class RedisServer:
    """A throwaway redis-server on a free loopback port, no persistence."""

    def __init__(self, workdir: Path, *, port: int = 0, extra: list[str] | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is installed by `make install` (system-deps)")
        self.port = port or _free_port()
        self.log_path = workdir / f"redis-{self.port}.log"
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(workdir),
                "--logfile",
                str(self.log_path),
                *(extra or []),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + READY_TIMEOUT
        while not self._ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start: {self.log_path.read_text()}")
            time.sleep(POLL)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _free_port() -> int:
    # redis-server cannot bind port 0; the tiny window before it binds is
    # acceptable on loopback (a clash fails the start loudly, never silently).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def route_owner(mesh: Mesh, session_id: str, timeout: float = 60.0) -> str:
    """The member id the router names as the session's owner (a lookup). A
    restarted router answers UNAVAILABLE until its members have reported
    their sessions (registering comes first): asked again until it knows."""
    assert mesh.router is not None
    deadline = time.monotonic() + timeout
    async with insecure_channel(mesh.router.address) as channel:
        while True:
            try:
                route = await RouterServiceStub(channel).Route(
                    rpb.RouteRequest(session_id=session_id, lookup_only=True)
                )
            except grpc.aio.AioRpcError as exc:
                learning = exc.code() == grpc.StatusCode.UNAVAILABLE and "learning" in (
                    exc.details() or ""
                )
                if not learning or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(POLL)
                continue
            return route.owner.member_id


async def session_owned_by(client: AsyncClient, mesh: Mesh, server: Component, agent: str) -> str:
    """A new session whose owner is ``server`` (sessions are spread round-robin)."""
    while True:
        sid = (await client.create_session(agent=agent)).session_id
        if await route_owner(mesh, sid) == server.member_id:
            return sid
