"""``turnmesh up``: router, workers, session servers and Envoy, in the foreground.

Start order: router, workers, servers, then Envoy in front of the servers; each
is waited on until healthy. Every child gets a fixed port chosen up front, so
a child that dies is restarted on the same address (peers and Envoy hold it)
after an exponential backoff, as ``--restart`` says (``on-failure`` by
default), while its budget lasts (``--restart-budget`` restarts within five
minutes). Past the budget, or with ``--restart never``, the whole mesh stops
with a message naming the child and its log: a child that keeps dying is
broken, and a partial mesh that looks healthy is worse than none.

Ctrl-C or SIGTERM stops the children in reverse order (Envoy stops taking
calls, servers drain their turns, workers, router) within five seconds.
SIGUSR1 prints a status table; ``status.json`` in the run directory holds the
same for ``turnmesh status``. The mesh key (given, or random per run) reaches
the children in their environment, never on a command line.
"""

from __future__ import annotations

import argparse
import functools
import os
import secrets
import shutil
import signal
import socket
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from turnmesh.cli._children import Child, ChildFailed
from turnmesh.cli._flags import given
from turnmesh.cli._ports import free_ports
from turnmesh.cli._restart import BUDGET_WINDOW, RestartBudget
from turnmesh.cli._status import STATUS_FILE, table, write_status
from turnmesh.cli._supervisor import Component, Launch, Ready, Supervisor
from turnmesh.cli._up_config import UP_SERVER_FLAGS, UpConfig, load
from turnmesh.runtime.exposure import check_up_exposure

READY_TIMEOUT = 60.0
TICK = 0.1
MESH_KEY_VARIABLE = "TURNMESH_MESH_KEY"
# The mesh key's old name; children get the key under the new one only.
KEY_VARIABLES = (MESH_KEY_VARIABLE, "TURNMESH_ADMIN_KEY")


class UpError(Exception):
    """A start-up failure reported as one line."""


def _api_keys_given(config: UpConfig) -> bool:
    # The servers also read TURNMESH_API_KEYS from the environment they inherit.
    return bool(config.api_keys_file) or any(os.environ.get("TURNMESH_API_KEYS", "").split(","))


def _preflight(config: UpConfig) -> None:
    if config.store.startswith("sqlite:") and config.servers > 1:
        # Each server would lock the file in turn: one owner per file, always.
        raise UpError(
            f"a SQLite store serves one server, not {config.servers}: use --servers 1, or"
            " Redis (--store redis://HOST:PORT/DB) for several"
        )
    if config.port:
        with socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET) as s:
            # As Envoy does: connections lingering in TIME_WAIT from a previous
            # run do not make the port busy; another listener does.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((config.host, config.port))
            except OSError as exc:
                raise UpError(
                    f"port {config.port} on {config.host} is not available ({exc.strerror}); "
                    "pass --port"
                ) from exc
    # A built-in name, package.module:Class or an agent file: load it here
    # once, so a bad one is one clear line before anything starts.
    from turnmesh.agent import AgentLoadError

    try:
        _agent_name(config.agent)
    except AgentLoadError as exc:
        raise UpError(str(exc)) from exc
    from turnmesh.envoy import EdgeConfig
    from turnmesh.envoy.process import EnvoyError, validate, write_config

    # Check the edge config (host, ports) before anything starts; the real
    # upstream addresses are known only once the servers run.
    with tempfile.TemporaryDirectory() as tmp:
        probe = EdgeConfig(
            upstreams=["127.0.0.1:1"],
            host=config.host,
            port=config.port,
            admin_port=config.admin_port,
            guards=config.edge_guards,
        )
        try:
            validate(write_config(probe, Path(tmp) / "envoy.json"))
        except EnvoyError as exc:
            raise UpError(str(exc)) from exc
    # A valid address, then: may it be public?
    check_up_exposure(config.host, api_keys=_api_keys_given(config), allow_open=config.allow_open)


@functools.cache
def _agent_name(spec: str) -> str:
    """The name workers register the agent under (a file or class names it);
    loaded once, by the preflight."""
    from turnmesh.agent import load_agent

    return load_agent(spec)[0]


@dataclass(frozen=True)
class Ports:
    """Every child's port, fixed for the run: a restart comes back on it."""

    router: int
    workers: list[int]
    servers: list[int]
    edge: int
    admin: int
    # Each server's WebSocket listener (AReaL's /ws), in the servers' order.
    websockets: list[int] = field(default_factory=list)

    @classmethod
    def choose(cls, config: UpConfig) -> Ports:
        w, s = config.workers, config.servers
        given = {config.port, config.admin_port} - {0}
        inner = free_ports(1 + w + 2 * s + 1, exclude=given)
        edge = config.port or free_ports(1, config.host, exclude=set(inner))[0]
        return cls(
            router=inner[0],
            workers=inner[1 : 1 + w],
            servers=inner[1 + w : 1 + w + s],
            edge=edge,
            admin=config.admin_port or inner[-1],
            websockets=inner[1 + w + s : 1 + w + 2 * s],
        )


def _component_args(config: UpConfig) -> list[str]:
    # Loopback only: Envoy is the one public door. No mesh key here: a
    # command line is world-readable (/proc/PID/cmdline).
    args = ["--host", "127.0.0.1"]
    if config.log_level:
        args += ["--log-level", config.log_level]
    if (tls := config.mesh_tls) is not None:
        args += ["--tls-ca", str(tls.ca_file), "--tls-cert", str(tls.cert_file)]
        args += ["--tls-key", str(tls.key_file)]
    if config.otlp_endpoint:
        args += ["--otlp-endpoint", config.otlp_endpoint]
    return args


def _server_args(config: UpConfig, router: str, agent: str) -> list[str]:
    # Only the settings given to `up`: the servers' own defaults do the rest.
    return [
        "--router", router, "--agent", agent,
        "--grace-seconds", str(config.drain_seconds),
        *config.server_args(),
        *_component_args(config),
    ]  # fmt: skip


def _child_env(mesh_key: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in KEY_VARIABLES}
    if mesh_key:
        env[MESH_KEY_VARIABLE] = mesh_key
    return env


def _turnmesh(*args: str) -> list[str]:
    return [sys.executable, "-m", "turnmesh", *args]


def _say(message: str) -> None:
    print(f"turnmesh up: {message}", file=sys.stderr, flush=True)


def _wait_http_ok(url: str, deadline: float, envoy: Child) -> None:
    # Readiness of the Envoy we just started, by its own address: its
    # certificate may name another host, and trust is not what is checked.
    context = ssl._create_unverified_context() if url.startswith("https:") else None
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if not envoy.running:
            raise ChildFailed(
                f"envoy exited with code {envoy.proc.returncode} (log: {envoy.log_path})"
            )
        if time.monotonic() > deadline:
            raise ChildFailed(f"the mesh did not become ready through Envoy at {url}")
        time.sleep(0.05)


class Mesh:
    def __init__(self, config: UpConfig, run_dir: Path, ports: Ports, mesh_key: str) -> None:
        self.config = config
        self.run_dir = run_dir
        self.ports = ports
        self.state = "starting"
        self.components: list[Component] = []
        self.supervisor = Supervisor(self.components, config.restart, _say, self.write_status)
        self.edge_address = ""
        self.admin_address = f"127.0.0.1:{ports.admin}"
        self._env = _child_env(mesh_key)
        # Envoy calls only the servers' public API: it gets no mesh key.
        self._envoy_env = _child_env(None)

    def write_status(self) -> None:
        write_status(self.run_dir, self.state, [c.status() for c in self.components])

    def _add(self, name: str, kind: str, address: str, launch: Launch, ready: Ready) -> Component:
        component = Component(
            name,
            kind,
            address,
            launch,
            ready,
            RestartBudget(self.config.restart_budget),
            self.run_dir / f"{name}.log",
        )
        self.components.append(component)
        component.start()
        self.write_status()
        return component

    def _member(self, name: str, kind: str, port: int, *args: str) -> Component:
        ready = self.run_dir / f"{name}.ready.json"
        argv = _turnmesh(kind, "--port", str(port), *args, "--ready-file", str(ready))

        def launch(restart: bool) -> Child:
            ready.unlink(missing_ok=True)  # a reused run dir or a restart: never trust an old one
            return Child(
                name, argv, self.run_dir, ready_file=ready, env=self._env, append_log=restart
            )

        return self._add(name, kind, f"127.0.0.1:{port}", launch, Child.is_ready)

    def start(self) -> None:
        c, ports = self.config, self.ports
        deadline = time.monotonic() + READY_TIMEOUT
        common = _component_args(c)
        router = self._member("router", "router", ports.router, *common)
        router.wait_ready(deadline)
        worker_args = ["--router", router.address, "--agent", c.agent, *common]
        workers = [
            self._member(f"worker-{i + 1}", "worker", port, *worker_args)
            for i, port in enumerate(ports.workers)
        ]
        server_args = _server_args(c, router.address, _agent_name(c.agent))
        # Each server's /ws listener (AReaL's gateway protocol), on its fixed port.
        ws_flags = [["--ws-port", str(p)] for p in ports.websockets] or [[]] * len(ports.servers)
        servers = [
            self._member(f"server-{i + 1}", "server", port, *server_args, *ws_flags[i])
            for i, port in enumerate(ports.servers)
        ]
        ws_upstreams = [f"127.0.0.1:{ws}" for ws in ports.websockets]
        # The edge's config needs only the servers' addresses: it is written
        # and checked (an Envoy run of its own) while they start.
        pool = ThreadPoolExecutor(1, thread_name_prefix="edge-config")
        try:
            checked = pool.submit(self._edge_config, [s.address for s in servers], ws_upstreams)
            for member in [*workers, *servers]:
                member.wait_ready(deadline)
            config_path = checked.result()
        finally:
            pool.shutdown(wait=False)  # a member that failed is told at once
        self._start_envoy(config_path, deadline)
        self.state = "running"
        self.write_status()

    def _edge_config(self, upstreams: list[str], ws_upstreams: list[str]) -> Path:
        """The edge's config file, written and checked."""
        from turnmesh.envoy import EdgeConfig
        from turnmesh.envoy.process import EnvoyError, validate, write_config

        c = self.config
        edge = EdgeConfig(
            upstreams=upstreams,
            ws_upstreams=ws_upstreams,
            host=c.host,
            port=self.ports.edge,
            admin_port=self.ports.admin,
            listener_tls=c.edge_tls,
            upstream_tls=c.mesh_tls,
            otlp_endpoint=c.otlp_endpoint,
            cors_origins=c.origins,
            max_connections=c.max_connections,
            api_keys=_api_keys_given(c),
            guards=c.edge_guards,
        )
        path = write_config(edge, self.run_dir / "envoy.json")
        try:
            validate(path)
        except EnvoyError as exc:
            raise UpError(str(exc)) from exc
        return path

    def _start_envoy(self, path: Path, deadline: float) -> None:
        from turnmesh.envoy.process import bound_listener, envoy_argv

        c = self.config
        admin_file = self.run_dir / "envoy-admin-address"
        argv = envoy_argv(path, admin_file)

        def launch(restart: bool) -> Child:
            admin_file.unlink(missing_ok=True)
            return Child("envoy", argv, self.run_dir, env=self._envoy_env, append_log=restart)

        def ready(_: Child) -> bool:
            return bound_listener(self.admin_address) is not None

        envoy = self._add("envoy", "envoy", f"{c.host}:{self.ports.edge}", launch, ready)
        envoy.wait_ready(deadline)
        self.edge_address = bound_listener(self.admin_address) or envoy.address
        assert envoy.child is not None
        _wait_http_ok(f"{self.scheme}://{self.edge_address}/ready", deadline, envoy.child)

    @property
    def scheme(self) -> str:
        return "https" if self.config.edge_tls else "http"

    def stop(self) -> None:
        self.state = "stopping"
        self.supervisor.stop()
        self.state = "stopped"
        self.write_status()

    def status_table(self) -> str:
        return table([c.status() for c in self.components])

    def banner(self, elapsed: float) -> str:
        c = self.config
        edge = f"{self.scheme}://{self.edge_address}"
        grpcurl_tls = "" if c.edge_tls else "-plaintext "
        return "\n".join(
            [
                f"turnmesh is up in {elapsed:.1f} s: agent {c.agent!r}, "
                f"{c.servers} server(s), {c.workers} worker(s)",
                f"  playground         {edge}/  (open it in a browser)",
                f"  REST/SSE and gRPC  {edge}  (Envoy; reflection for grpcurl)",
                f"  Envoy admin        http://{self.admin_address}  (loopback only)",
                f"  router             {self.components[0].address}",
                f"  logs               {self.run_dir}",
                f"  status             {_local_command('turnmesh')} status --run-dir "
                f"{self.run_dir}  (or kill -USR1 {os.getpid()})",
                f"  restarts           --restart {c.restart}, at most {c.restart_budget} per "
                f"component within {BUDGET_WINDOW / 60:g} minutes",
                "try:",
                f'  curl -s {edge}/v1/sessions -d \'{{"sessionId": "hello"}}\' && '
                f"curl -N {edge}/v1/sessions/hello/turns "
                f'-d \'{{"message": "What is 6*7?"}}\'',
                f'  {_local_command("grpcurl")} {grpcurl_tls}-d \'{{"session_id": "hello", '
                f'"message": "What did I ask first?"}}\' {self.edge_address} '
                "turnmesh.v1.SessionService/Turn",
                "Ctrl-C stops the mesh.",
            ]
        )


def up_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the command line gave (None: not given)."""
    return {**given(args, UpConfig), **{key: getattr(args, key) for key in UP_SERVER_FLAGS}}


def run_up(args: argparse.Namespace) -> int:
    status_requested = stop_requested = False

    def request_status(signum: int, frame: object) -> None:
        nonlocal status_requested
        status_requested = True

    # First: SIGUSR1's default action would kill `up`.
    signal.signal(signal.SIGUSR1, request_status)
    try:
        config = load(args.config, up_flags(args))
        _preflight(config)
        ports = Ports.choose(config)
    except (UpError, ValidationError, OSError, ValueError) as exc:
        print(f"turnmesh up: {_one_line(exc)}", file=sys.stderr, flush=True)
        return 2

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    run_dir = config.resolved_run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / STATUS_FILE).unlink(missing_ok=True)  # a reused run dir: not the last run's
    mesh_key = config.mesh_key or os.environ.get("TURNMESH_ADMIN_KEY") or secrets.token_urlsafe(32)
    mesh = Mesh(config, run_dir, ports, mesh_key)
    started = time.monotonic()
    try:
        mesh.start()
        print(mesh.banner(time.monotonic() - started), flush=True)
        while not stop_requested:
            reason = mesh.supervisor.tick()
            if reason is not None:
                _say(reason)
                return 1
            if status_requested:
                status_requested = False
                print(f"turnmesh up: status\n{mesh.status_table()}", flush=True)
            time.sleep(TICK)
        print("turnmesh up: stopping (Envoy, servers drain, workers, router)", flush=True)
        return 0
    except (UpError, ChildFailed) as exc:
        _say(_one_line(exc))
        return 1
    finally:
        mesh.stop()


def _local_command(name: str) -> str:
    """A command as the user can run it: the venv's copy may not be on PATH."""
    local = Path(sys.executable).parent / name
    if not local.exists() or shutil.which(name) == str(local):
        return name
    try:
        return str(local.relative_to(Path.cwd()))
    except ValueError:
        return str(local)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        if not first["loc"]:  # the model's own check: its message says it all
            return str(first["msg"]).removeprefix("Value error, ")
        where = ".".join(str(p) for p in first["loc"])
        return f"invalid setting {where}: {first['msg']}"
    return " ".join(str(exc).split())
