"""``turnmesh router|server|worker|up``: flags, with ``TURNMESH_*`` environment
variables as defaults (a flag wins over the environment)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from turnmesh.runtime.tls import TlsConfigError, tls_files


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"TURNMESH_{name.upper()}", default)


def _common(p: argparse.ArgumentParser, default_port: int) -> None:
    p.add_argument("--host", default=_env("host", "127.0.0.1"), help="address to bind")
    p.add_argument(
        "--port", type=int, default=int(_env("port", str(default_port)) or 0), help="0: any free"
    )
    p.add_argument(
        "--mesh-key",
        "--admin-key",  # the name before 0.2; kept so existing scripts work
        dest="mesh_key",
        default=_env("mesh_key") or _env("admin_key"),
        help="key for mesh-internal calls (env TURNMESH_MESH_KEY)",
    )
    p.add_argument(
        "--allow-open",
        action="store_true",
        default=_env("allow_open") == "1",
        help="allow a non-loopback bind without a mesh key",
    )
    p.add_argument("--tls-ca", default=_env("tls_ca"), help="mesh CA (PEM): enables mutual TLS")
    p.add_argument("--tls-cert", default=_env("tls_cert"), help="this member's certificate (PEM)")
    p.add_argument("--tls-key", default=_env("tls_key"), help="this member's private key (PEM)")
    p.add_argument(
        "--otlp-endpoint",
        default=_env("otlp_endpoint"),
        help="send traces over OTLP/gRPC here, e.g. http://127.0.0.1:4317 "
        "(default: OTEL_EXPORTER_OTLP_ENDPOINT; off when neither is set)",
    )
    p.add_argument("--ready-file", default=_env("ready_file"), help="write JSON here when ready")
    metrics_port = _env("metrics_port")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=int(metrics_port) if metrics_port else None,
        help="serve Prometheus /metrics on this port (0: any free port)",
    )
    p.add_argument("--log-level", default=_env("log_level", "INFO"))
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=_env("log_format", "text"),
        help="json: one JSON object per line (TURNMESH_LOG_FORMAT)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="turnmesh", description="A gRPC service mesh for stateful, multi-turn AI agents."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    router = sub.add_parser("router", help="run the router (membership and session ownership)")
    _common(router, 7000)
    router.add_argument(
        "--heartbeat-interval", type=float, default=float(_env("heartbeat_interval", "1.0") or 1)
    )
    router.add_argument(
        "--heartbeat-timeout", type=float, default=float(_env("heartbeat_timeout", "3.0") or 3)
    )

    server = sub.add_parser("server", help="run a session server (the public SessionService)")
    _common(server, 7100)
    server.add_argument("--router", default=_env("router", "127.0.0.1:7000"))
    server.add_argument("--agent", default=_env("agent", "demo"), help="the default agent")
    server.add_argument(
        "--session-ttl", type=float, default=float(_env("session_ttl", "1800") or 1800)
    )
    server.add_argument("--advertise-host", default=_env("advertise_host"))
    server.add_argument(
        "--max-turns",
        type=int,
        default=int(_env("max_turns", "256") or 256),
        help="turns running at once before new ones get RESOURCE_EXHAUSTED (429)",
    )
    server.add_argument(
        "--max-sessions",
        type=int,
        default=int(_env("max_sessions", "100000") or 100000),
        help="sessions held before new ones get RESOURCE_EXHAUSTED (429)",
    )
    rate = _env("rate_limit")
    server.add_argument(
        "--rate-limit",
        type=float,
        default=float(rate) if rate else None,
        help="requests a second allowed per API key (429 beyond it)",
    )
    server.add_argument(
        "--api-keys-file",
        default=_env("api_keys_file"),
        help="public API keys, one per line (or sha256:HEX); re-read when it changes",
    )
    server.add_argument(
        "--store",
        default=_env("store", "memory"),
        help="memory (default), sqlite:PATH, or redis://HOST:PORT/DB",
    )
    server.add_argument(
        "--keepalive",
        type=float,
        default=float(_env("keepalive", "15") or 15),
        help="seconds of silence before a turn stream gets a keepalive event",
    )
    server.add_argument(
        "--grace-seconds",
        type=float,
        default=float(_env("grace_seconds", "30") or 30),
        help="how long SIGTERM waits for running turns",
    )

    worker = sub.add_parser("worker", help="run a worker that hosts one agent")
    _common(worker, 7200)
    worker.add_argument("--router", default=_env("router", "127.0.0.1:7000"))
    worker.add_argument(
        "--agent",
        default=_env("agent", "demo"),
        help="a built-in agent (demo, echo, openai), package.module:Class, or an agent file",
    )
    worker.add_argument("--advertise-host", default=_env("advertise_host"))
    worker.add_argument(
        "--grace-seconds",
        type=float,
        default=float(_env("grace_seconds", "10") or 10),
        help="how long SIGTERM waits for running turns",
    )
    worker.add_argument(
        "--file-concurrency",
        type=int,
        default=int(_env("file_concurrency", "2") or 2),
        help="attached files read at once (each in its own process)",
    )
    worker.add_argument(
        "--file-timeout",
        type=float,
        default=float(_env("file_timeout", "30") or 30),
        help="seconds to read one attached file before it fails",
    )
    worker.add_argument(
        "--file-memory-mb",
        type=int,
        default=int(_env("file_memory_mb", "2048") or 2048),
        help="memory one file's reader process may use",
    )

    edge = sub.add_parser(
        "edge", help="run Envoy in front of session servers (what a container runs)"
    )
    edge.add_argument(
        "--upstream",
        action="append",
        default=[u for u in (_env("upstreams") or "").split(",") if u],
        help="a session server host:port (repeat; a DNS name gives every address it has)",
    )
    edge.add_argument("--host", default=_env("host", "127.0.0.1"), help="public address")
    edge.add_argument("--port", type=int, default=int(_env("port", "8080") or 8080))
    edge.add_argument("--admin-port", type=int, default=int(_env("admin_port", "9901") or 9901))
    edge.add_argument("--tls-ca", default=_env("tls_ca"), help="mesh CA: mTLS to the servers")
    edge.add_argument("--tls-cert", default=_env("tls_cert"), help="Envoy's mesh certificate")
    edge.add_argument("--tls-key", default=_env("tls_key"), help="Envoy's mesh private key")
    edge.add_argument("--edge-tls-cert", default=_env("edge_tls_cert"), help="HTTPS: cert")
    edge.add_argument("--edge-tls-key", default=_env("edge_tls_key"), help="HTTPS: key")
    edge.add_argument("--otlp-endpoint", default=_env("otlp_endpoint"))
    edge.add_argument(
        "--cors-origins",
        default=_env("cors_origins", "http://localhost:3000"),
        help="browser origins allowed to call the API, comma-separated ('*' for any)",
    )
    edge.add_argument("--config-dir", default=_env("config_dir"), help="where envoy.json goes")
    concurrency = _env("concurrency")
    edge.add_argument(
        "--concurrency",
        type=int,
        default=int(concurrency) if concurrency else None,
        help="Envoy worker threads (default: one per CPU of the machine; set it to the pod's)",
    )

    up = sub.add_parser(
        "up", help="run router, servers, workers and Envoy together (foreground; Ctrl-C stops)"
    )
    up.add_argument(
        "--agent",
        default=None,
        help="demo (default), echo, openai, pkg.module:Class, or an agent file (.yaml)",
    )
    up.add_argument("--servers", type=int, default=None, help="session servers (default 1)")
    up.add_argument("--workers", type=int, default=None, help="workers (default 1)")
    up.add_argument("--host", default=None, help="public address (default 127.0.0.1)")
    up.add_argument("--port", type=int, default=None, help="public port (default 8080)")
    up.add_argument("--admin-port", type=int, default=None, help="Envoy admin (default: any)")
    up.add_argument("--store", default=None, help="memory (default), sqlite:PATH, redis://...")
    up.add_argument("--api-keys-file", default=None, help="public API keys for the servers")
    up.add_argument("--tls-ca", type=Path, default=None, help="mesh CA: mutual TLS inside")
    up.add_argument("--tls-cert", type=Path, default=None, help="the members' certificate")
    up.add_argument("--tls-key", type=Path, default=None, help="the members' private key")
    up.add_argument("--edge-tls-cert", type=Path, default=None, help="HTTPS at Envoy: cert")
    up.add_argument("--edge-tls-key", type=Path, default=None, help="HTTPS at Envoy: key")
    up.add_argument("--otlp-endpoint", default=None, help="OTLP/gRPC collector for traces")
    up.add_argument(
        "--cors-origins",
        default=None,
        help="browser origins allowed to call the API, comma-separated ('*' for any; "
        "default http://localhost:3000; the playground needs none)",
    )
    up.add_argument("--config", type=Path, default=None, help="a TOML file with these settings")
    up.add_argument("--run-dir", type=Path, default=None, help="where logs go")
    up.add_argument("--log-level", default=None)
    return parser


def _base(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "host": args.host,
        "port": args.port,
        "mesh_key": args.mesh_key or None,
        "tls": tls_files(args.tls_ca, args.tls_cert, args.tls_key),
        "otlp_endpoint": args.otlp_endpoint,
        "allow_open": args.allow_open,
        "ready_file": args.ready_file,
        "metrics_port": args.metrics_port,
        "log_level": args.log_level,
    }


def _component(
    args: argparse.Namespace,
) -> tuple[str, BaseModel, Callable[[Any], Coroutine[Any, Any, None]]]:
    if args.command == "router":
        from turnmesh.router import RouterConfig
        from turnmesh.router import serve as serve_router

        config: BaseModel = RouterConfig(
            **_base(args),
            heartbeat_interval=args.heartbeat_interval,
            heartbeat_timeout=args.heartbeat_timeout,
        )
        return "router", config, serve_router
    if args.command == "server":
        from turnmesh.server import ServerConfig
        from turnmesh.server import serve as serve_server

        config = ServerConfig(
            **_base(args),
            router_address=args.router,
            default_agent=args.agent,
            session_ttl_seconds=args.session_ttl,
            advertise_host=args.advertise_host,
            keepalive_seconds=args.keepalive,
            store=args.store,
            api_keys=[k for k in (_env("api_keys") or "").split(",") if k],
            api_keys_file=args.api_keys_file,
            max_turns_in_flight=args.max_turns,
            max_sessions=args.max_sessions,
            rate_limit=args.rate_limit,
            grace_seconds=args.grace_seconds,
        )
        return "server", config, serve_server
    from turnmesh.worker import WorkerConfig
    from turnmesh.worker import serve as serve_worker

    config = WorkerConfig(
        **_base(args),
        router_address=args.router,
        agent=args.agent,
        advertise_host=args.advertise_host,
        file_timeout_seconds=args.file_timeout,
        file_memory_mb=args.file_memory_mb,
        file_concurrency=args.file_concurrency,
        grace_seconds=args.grace_seconds,
    )
    return "worker", config, serve_worker


def run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """asyncio.run, on uvloop when it is installed (TURNMESH_UVLOOP=0 opts out):
    grpc.aio's callbacks run on the event loop, and uvloop runs them faster."""
    if os.environ.get("TURNMESH_UVLOOP", "1") != "0":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            uvloop.run(main)
            return
    asyncio.run(main)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "up":
        from turnmesh.cli.up import run_up

        sys.exit(run_up(args))
    if args.command == "edge":
        from turnmesh.cli.edge import run_edge

        sys.exit(run_edge(args))
    from turnmesh.runtime.logs import setup_logging

    try:
        name, config, serve = _component(args)
    except ValidationError as exc:
        sys.exit(f"turnmesh {args.command}: invalid configuration:\n{exc}")
    except TlsConfigError as exc:
        sys.exit(f"turnmesh {args.command}: {exc}")
    # Components set up their own logging too; the format reaches them here.
    os.environ["TURNMESH_LOG_FORMAT"] = args.log_format
    setup_logging(name, args.log_level)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            run_event_loop(serve(config))
    except TlsConfigError as exc:  # a file named in the flags is unreadable
        sys.exit(f"turnmesh {args.command}: {exc}")
