"""``turnmesh up``: router, workers, session servers and Envoy, in the foreground.

Start order: router, workers, servers, then Envoy in front of the servers; each
is waited on until healthy. Ctrl-C or SIGTERM stops them in the reverse order
(Envoy stops taking calls, servers drain their turns, workers, router) within
five seconds. If any component dies unexpectedly the whole mesh stops with a
message naming it and its log: a partial mesh that looks healthy is worse than
none, and the log says why.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import signal
import socket
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from pydantic import ValidationError

from turnmesh.cli._children import Child, ChildFailed
from turnmesh.cli._up_config import UpConfig, load

READY_TIMEOUT = 60.0
STOP_BUDGET = 5.0


class UpError(Exception):
    """A start-up failure reported as one line."""


def _preflight(config: UpConfig) -> None:
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
        )
        try:
            validate(write_config(probe, Path(tmp) / "envoy.json"))
        except EnvoyError as exc:
            raise UpError(str(exc)) from exc


@functools.cache
def _agent_name(spec: str) -> str:
    """The name workers register the agent under (a file or class names it);
    loaded once, by the preflight."""
    from turnmesh.agent import load_agent

    return load_agent(spec)[0]


def _component_args(config: UpConfig) -> list[str]:
    args = ["--log-level", config.log_level]
    if config.mesh_key:
        args += ["--mesh-key", config.mesh_key]
    if (tls := config.mesh_tls) is not None:
        args += ["--tls-ca", str(tls.ca_file), "--tls-cert", str(tls.cert_file)]
        args += ["--tls-key", str(tls.key_file)]
    if config.otlp_endpoint:
        args += ["--otlp-endpoint", config.otlp_endpoint]
    return args


def _turnmesh(*args: str) -> list[str]:
    return [sys.executable, "-m", "turnmesh", *args]


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
    def __init__(self, config: UpConfig, run_dir: Path) -> None:
        self.config = config
        self.run_dir = run_dir
        self.router: list[Child] = []
        self.workers: list[Child] = []
        self.servers: list[Child] = []
        self.envoy: list[Child] = []
        self.edge_address = ""
        self.admin_address = ""

    @property
    def children(self) -> list[Child]:
        return [*self.router, *self.workers, *self.servers, *self.envoy]

    def _child(self, name: str, *args: str) -> Child:
        ready = self.run_dir / f"{name}.ready.json"
        ready.unlink(missing_ok=True)  # a reused run dir: never trust an old one
        argv = _turnmesh(*args, "--ready-file", str(ready))
        return Child(name, argv, self.run_dir, ready_file=ready)

    def start(self) -> None:
        c = self.config
        deadline = time.monotonic() + READY_TIMEOUT
        common = _component_args(c)
        self.router.append(self._child("router", "router", "--port", "0", *common))
        self.router[0].wait_ready(deadline)
        router = str(self.router[0].info["address"])
        for i in range(c.workers):
            self.workers.append(
                self._child(
                    f"worker-{i + 1}",
                    "worker",
                    "--port",
                    "0",
                    "--router",
                    router,
                    "--agent",
                    c.agent,
                    *common,
                )
            )
        agent = _agent_name(c.agent)
        for i in range(c.servers):
            self.servers.append(
                self._child(
                    f"server-{i + 1}",
                    "server",
                    "--port",
                    "0",
                    "--router",
                    router,
                    "--agent",
                    agent,
                    *(["--session-ttl", str(c.session_ttl)] if c.session_ttl else []),
                    "--grace-seconds",
                    str(c.drain_seconds),
                    "--store",
                    c.store,
                    *(["--api-keys-file", c.api_keys_file] if c.api_keys_file else []),
                    *common,
                )
            )
        for child in [*self.workers, *self.servers]:
            child.wait_ready(deadline)
        self._start_envoy(deadline)

    def _start_envoy(self, deadline: float) -> None:
        from turnmesh.envoy import EdgeConfig
        from turnmesh.envoy.process import EnvoyError, envoy_argv, validate, write_config

        c = self.config
        edge = EdgeConfig(
            upstreams=[str(s.info["address"]) for s in self.servers],
            host=c.host,
            port=c.port,
            admin_port=c.admin_port,
            listener_tls=c.edge_tls,
            upstream_tls=c.mesh_tls,
            otlp_endpoint=c.otlp_endpoint,
            cors_origins=tuple(o.strip() for o in c.cors_origins.split(",") if o.strip()),
        )
        path = write_config(edge, self.run_dir / "envoy.json")
        try:
            validate(path)
        except EnvoyError as exc:
            raise UpError(str(exc)) from exc
        admin_file = self.run_dir / "envoy-admin-address"
        admin_file.unlink(missing_ok=True)
        argv = envoy_argv(path, admin_file)
        envoy = Child("envoy", argv, self.run_dir)
        self.envoy.append(envoy)
        while not admin_file.exists() or not admin_file.read_text().strip():
            envoy.check_alive(deadline)
            time.sleep(0.02)
        self.admin_address = admin_file.read_text().strip()
        self.edge_address = self._listener_address(envoy, deadline)
        _wait_http_ok(f"{self.scheme}://{self.edge_address}/ready", deadline, envoy)

    @property
    def scheme(self) -> str:
        return "https" if self.config.edge_tls else "http"

    def _listener_address(self, envoy: Child, deadline: float) -> str:
        from turnmesh.envoy.process import bound_listener

        while (address := bound_listener(self.admin_address)) is None:
            envoy.check_alive(deadline)
            time.sleep(0.02)
        return address

    def failed_child(self) -> Child | None:
        return next((c for c in self.children if not c.running), None)

    def stop(self) -> None:
        deadline = time.monotonic() + STOP_BUDGET
        # Envoy first (no new calls), then servers drain, then workers, router.
        for group, share in (
            (self.envoy, 1.0),
            (self.servers, 3.5),
            (self.workers, 4.2),
            (self.router, 5.0),
        ):
            group_deadline = min(deadline, deadline - STOP_BUDGET + share)
            for child in group:
                child.terminate()
            for child in group:
                child.wait_gone(group_deadline)

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
                f"  router             {self.router[0].info['address']}",
                f"  logs               {self.run_dir}",
                "try:",
                f'  curl -s {edge}/v1/sessions -d \'{{"sessionId": "hello"}}\' && '
                f"curl -N {edge}/v1/sessions/hello/turns "
                f'-d \'{{"message": "What is 6*7?"}}\'',
                f'  {_grpcurl()} {grpcurl_tls}-d \'{{"session_id": "hello", "message": '
                f'"What did I ask first?"}}\' {self.edge_address} '
                "turnmesh.v1.SessionService/Turn",
                "Ctrl-C stops the mesh.",
            ]
        )


def run_up(args: argparse.Namespace) -> int:
    flags = {
        "agent": args.agent,
        "servers": args.servers,
        "workers": args.workers,
        "host": args.host,
        "port": args.port,
        "admin_port": args.admin_port,
        "run_dir": args.run_dir,
        "store": args.store,
        "api_keys_file": args.api_keys_file,
        "log_level": args.log_level,
        "tls_ca": args.tls_ca,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "edge_tls_cert": args.edge_tls_cert,
        "edge_tls_key": args.edge_tls_key,
        "otlp_endpoint": args.otlp_endpoint,
        "cors_origins": args.cors_origins,
    }
    try:
        config = load(args.config, flags)
        _preflight(config)
    except (UpError, ValidationError, OSError, ValueError) as exc:
        print(f"turnmesh up: {_one_line(exc)}", file=sys.stderr, flush=True)
        return 2

    stop_requested = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    run_dir = config.resolved_run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    mesh = Mesh(config, run_dir)
    started = time.monotonic()
    try:
        mesh.start()
        print(mesh.banner(time.monotonic() - started), flush=True)
        while not stop_requested:
            failed = mesh.failed_child()
            if failed is not None:
                print(
                    f"turnmesh up: {failed.name} exited unexpectedly with code "
                    f"{failed.proc.returncode}; stopping the mesh (log: {failed.log_path})",
                    file=sys.stderr,
                    flush=True,
                )
                return 1
            time.sleep(0.1)
        print("turnmesh up: stopping (Envoy, servers drain, workers, router)", flush=True)
        return 0
    except (UpError, ChildFailed) as exc:
        print(f"turnmesh up: {_one_line(exc)}", file=sys.stderr, flush=True)
        return 1
    finally:
        mesh.stop()


def _grpcurl() -> str:
    """grpcurl as the user can run it: the venv's copy may not be on PATH."""
    local = Path(sys.executable).parent / "grpcurl"
    if not local.exists() or shutil.which("grpcurl") == str(local):
        return "grpcurl"
    try:
        return str(local.relative_to(Path.cwd()))
    except ValueError:
        return str(local)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"invalid setting {where}: {first['msg']}"
    return " ".join(str(exc).split())
