"""``turnmesh router|server|worker|edge|up|status``: flags, with ``TURNMESH_*`` environment
variables as defaults (a flag wins over the environment).

A variable is a string default: argparse converts it only for the command that
runs, so a bad one is that command's usage error, never every command's traceback."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, cast, get_args

from pydantic import BaseModel, ValidationError

from turnmesh.runtime.tls import TlsConfigError, tls_files


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"TURNMESH_{name.upper()}", default)


def _scalar(annotation: Any) -> Callable[[str], Any]:
    """The type a flag's text is parsed as: the field's (``float | None`` -> float)."""
    for kind in (annotation, *get_args(annotation)):
        if kind in (int, float, str):
            return cast(Callable[[str], Any], kind)
    raise TypeError(f"no flag type for {annotation!r}")


def _edge_timeouts(parser: argparse.ArgumentParser) -> None:
    """--NAME-timeout for each of Envoy's timeouts (seconds; defaults from EdgeTimeouts)."""
    from turnmesh.envoy.timeouts import EdgeTimeouts

    for item in dataclasses.fields(EdgeTimeouts):
        flag = item.name.replace("_", "-")
        raw = _env(f"{item.name}_timeout")
        parser.add_argument(
            f"--{flag}-timeout",
            dest=f"{item.name}_timeout",
            type=float,
            default=raw or item.default,
            help=f"seconds (default {item.default:g}; README: Running in production)",
        )


def _setting(
    parser: argparse.ArgumentParser,
    flag: str,
    model: type[BaseModel],
    field: str,
    *,
    env: str | None = None,
    help: str | None = None,
    dest: str | None = None,
    read_env: bool = True,
) -> None:
    """A flag for one config field: its type, help and default come from the
    model (the one source of defaults); ``TURNMESH_<ENV>`` sets it too, and a
    flag wins over the environment. Unset, the model's default applies.
    ``read_env=False``: the caller reads the environment itself (`up` ranks
    its config file above it)."""
    info = model.model_fields[field]
    raw = _env(env or field) if read_env else None
    dest = dest or field
    if info.annotation is bool:  # a switch: on with the flag or TURNMESH_X=1|true|yes
        parser.add_argument(
            flag,
            dest=dest,
            action="store_const",
            const=True,
            default=True if (raw or "").lower() in ("1", "true", "yes") else None,
            help=help or info.description,
        )
        return
    parse = _scalar(info.annotation)
    default = info.get_default(call_default_factory=True)
    shown = "unset" if default is None else default
    parser.add_argument(
        flag,
        dest=dest,
        metavar=flag.removeprefix("--").upper().replace("-", "_"),
        type=parse,
        default=raw or None,
        help=f"{help or info.description} (default: {shown})",
    )


@dataclasses.dataclass(frozen=True)
class ServerFlag:
    """A ``turnmesh server`` flag for one ``ServerConfig`` field."""

    flag: str
    field: str
    env: str | None = None  # TURNMESH_<ENV>, when not TURNMESH_<FIELD>
    # `turnmesh up` takes it too and passes it to its servers when given.
    up: bool = False

    @property
    def key(self) -> str:
        """Its name in `up`'s TOML file: the flag's (session_ttl for --session-ttl)."""
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def env_name(self) -> str:
        return self.env or self.field


# Every ServerConfig field the server has a flag for, defined once for
# `server` and `up`. Not on `up`: what `up` sets itself (--agent and
# --grace-seconds from its own --agent and drain_seconds, the members' common
# flags), --advertise-host (its children bind loopback), --report-page-size
# (a message size towards a restarted router, nothing a user sees) and
# --metrics-principal-label (`up` serves no metrics port).
SERVER_FLAGS = (
    ServerFlag("--agent", "default_agent", env="agent"),
    ServerFlag("--session-ttl", "session_ttl_seconds", env="session_ttl", up=True),
    ServerFlag("--event-log-ttl", "event_log_ttl_seconds", up=True),
    ServerFlag("--max-event-log-bytes", "event_log_max_bytes", up=True),
    ServerFlag("--turn-record-ttl", "turn_record_ttl_seconds", up=True),
    ServerFlag("--advertise-host", "advertise_host"),
    ServerFlag("--max-turns", "max_turns_in_flight", env="max_turns", up=True),
    ServerFlag("--max-sessions", "max_sessions", up=True),
    ServerFlag("--max-sessions-per-principal", "max_sessions_per_principal", up=True),
    ServerFlag("--max-turns-per-principal", "max_turns_per_principal", up=True),
    ServerFlag("--max-pending-bytes", "max_pending_bytes_per_session", up=True),
    ServerFlag("--max-pending-bytes-per-principal", "max_pending_bytes_per_principal", up=True),
    ServerFlag("--rate-limit", "rate_limit", up=True),
    ServerFlag("--rate-burst", "rate_burst", up=True),
    ServerFlag("--max-receiving-per-principal", "max_receiving_per_principal", up=True),
    ServerFlag("--api-keys-file", "api_keys_file", up=True),
    ServerFlag("--store", "store", up=True),
    ServerFlag("--lease-seconds", "lease_seconds", up=True),
    ServerFlag("--report-page-size", "report_page_size"),
    ServerFlag("--keepalive", "keepalive_seconds", env="keepalive", up=True),
    ServerFlag("--pause-timeout", "pause_timeout_seconds", up=True),
    ServerFlag("--metrics-principal-label", "metrics_principal_label"),
    ServerFlag("--grace-seconds", "grace_seconds"),
    ServerFlag("--turn-sweep-seconds", "turn_sweep_seconds", up=True),
    ServerFlag("--webhook-allow", "webhook_allow", up=True),
    ServerFlag("--webhook-secret-file", "webhook_secret_file", up=True),
    ServerFlag("--webhook-max-attempts", "webhook_max_attempts", up=True),
    ServerFlag("--webhook-retry-seconds", "webhook_retry_seconds", up=True),
    ServerFlag("--webhook-timeout-seconds", "webhook_timeout_seconds", up=True),
)


def _given(args: argparse.Namespace, model: type[BaseModel]) -> dict[str, Any]:
    """The model's fields that a flag or the environment set."""
    return {
        name: getattr(args, name)
        for name in model.model_fields
        if getattr(args, name, None) is not None
    }


def _common(p: argparse.ArgumentParser, model: type[BaseModel], default_port: int) -> None:
    # The commands listen on well-known ports; the config's own default (0,
    # any free port) is for code that embeds a component.
    p.add_argument(
        "--port",
        type=int,
        default=_env("port", str(default_port)) or "0",
        help=f"port to bind, 0: any free (default: {default_port})",
    )
    _setting(p, "--host", model, "host")
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
    _setting(p, "--otlp-endpoint", model, "otlp_endpoint")
    _setting(p, "--ready-file", model, "ready_file")
    _setting(p, "--metrics-port", model, "metrics_port")
    _setting(p, "--log-level", model, "log_level")
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=_env("log_format", "text"),
        help="json: one JSON object per line (TURNMESH_LOG_FORMAT)",
    )


def _router_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--router",
        dest="router_address",
        default=_env("router", "127.0.0.1:7000"),
        help="the router, host:port (default: 127.0.0.1:7000)",
    )


def _edge_limits(p: argparse.ArgumentParser, *, env: bool) -> None:
    """Envoy's limits (envoy/guards.py) as flags; help and defaults from UpConfig.
    ``env=False`` for `up`, which reads the environment below its config file."""
    from turnmesh.cli._up_config import EDGE_LIMITS, UpConfig

    for name in EDGE_LIMITS:
        _setting(p, "--" + name.replace("_", "-"), UpConfig, name, read_env=env)
    hosts = _env("allowed_hosts") if env else None
    p.add_argument(
        "--allowed-host",
        dest="allowed_hosts",
        action="append",
        default=[h.strip() for h in hosts.split(",") if h.strip()] if hosts else None,
        help=UpConfig.model_fields["allowed_hosts"].description,
    )


def build_parser() -> argparse.ArgumentParser:
    from turnmesh.cli._restart import BUDGET_WINDOW, DEFAULT_BUDGET, RestartPolicy
    from turnmesh.envoy.edge_config import DEFAULT_ADMIN_PORT, DEFAULT_CORS_ORIGINS, DEFAULT_PORT
    from turnmesh.router.app import RouterConfig
    from turnmesh.server.config import ServerConfig
    from turnmesh.worker.app import WorkerConfig

    parser = argparse.ArgumentParser(
        prog="turnmesh", description="A gRPC service mesh for stateful, multi-turn AI agents."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    router = sub.add_parser("router", help="run the router (membership and session ownership)")
    _common(router, RouterConfig, 7000)
    _setting(router, "--heartbeat-interval", RouterConfig, "heartbeat_interval")
    _setting(router, "--heartbeat-timeout", RouterConfig, "heartbeat_timeout")
    _setting(router, "--orphan-seconds", RouterConfig, "orphan_seconds")
    _setting(router, "--max-request-bytes", RouterConfig, "max_request_bytes")

    server = sub.add_parser("server", help="run a session server (the public SessionService)")
    _common(server, ServerConfig, 7100)
    _router_flag(server)
    for f in SERVER_FLAGS:
        _setting(server, f.flag, ServerConfig, f.field, env=f.env)

    worker = sub.add_parser("worker", help="run a worker that hosts one agent")
    _common(worker, WorkerConfig, 7200)
    _router_flag(worker)
    _setting(worker, "--agent", WorkerConfig, "agent")
    _setting(worker, "--advertise-host", WorkerConfig, "advertise_host")
    _setting(worker, "--grace-seconds", WorkerConfig, "grace_seconds")
    _setting(worker, "--file-concurrency", WorkerConfig, "file_concurrency")
    _setting(worker, "--file-timeout", WorkerConfig, "file_timeout_seconds", env="file_timeout")
    _setting(worker, "--file-memory-mb", WorkerConfig, "file_memory_mb")
    _setting(worker, "--file-queue", WorkerConfig, "file_queue")
    _setting(worker, "--file-queue-mb", WorkerConfig, "file_queue_mb")
    _setting(worker, "--history-cache-mb", WorkerConfig, "history_cache_mb")
    _setting(worker, "--file-text-cache-entries", WorkerConfig, "file_text_cache_entries")
    _setting(worker, "--file-text-cache-mb", WorkerConfig, "file_text_cache_mb")

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
    edge.add_argument("--port", type=int, default=_env("port") or str(DEFAULT_PORT))
    edge.add_argument(
        "--admin-port", type=int, default=_env("admin_port") or str(DEFAULT_ADMIN_PORT)
    )
    edge.add_argument("--tls-ca", default=_env("tls_ca"), help="mesh CA: mTLS to the servers")
    edge.add_argument("--tls-cert", default=_env("tls_cert"), help="Envoy's mesh certificate")
    edge.add_argument("--tls-key", default=_env("tls_key"), help="Envoy's mesh private key")
    edge.add_argument("--edge-tls-cert", default=_env("edge_tls_cert"), help="HTTPS: cert")
    edge.add_argument("--edge-tls-key", default=_env("edge_tls_key"), help="HTTPS: key")
    edge.add_argument("--otlp-endpoint", default=_env("otlp_endpoint"))
    edge.add_argument(
        "--allow-open",
        action="store_true",
        default=_env("allow_open") == "1",
        help="allow a non-loopback bind without HTTPS and mutual TLS to the servers "
        "(TLS ends in front of Envoy, on a trusted network)",
    )
    edge.add_argument(
        "--cors-origins",
        default=_env("cors_origins", ",".join(DEFAULT_CORS_ORIGINS)),
        help="browser origins allowed to call the API, comma-separated ('*' for any)",
    )
    # What the servers behind do about keys (unknown: Envoy checks keys before
    # bodies and answers only to allowed Host names, both).
    keys = edge.add_mutually_exclusive_group()
    keys.add_argument(
        "--api-keys-required",
        dest="api_keys",
        action="store_const",
        const=True,
        default=True if _env("api_keys_required") == "1" else None,
        help="the servers behind check API keys: Envoy checks each REST request's key before"
        " its body is read, and any Host is answered unless --allowed-host names some",
    )
    keys.add_argument(
        "--no-key-check",
        dest="api_keys",
        action="store_const",
        const=False,
        help="the servers have no API keys: skip asking them about each REST request's key"
        " (saves one call per request); only allowed Host names are answered",
    )
    _edge_limits(edge, env=True)
    edge.add_argument("--config-dir", default=_env("config_dir"), help="where envoy.json goes")
    _edge_timeouts(edge)
    concurrency = _env("concurrency")
    edge.add_argument(
        "--concurrency",
        type=int,
        default=concurrency or None,
        help="Envoy worker threads (default: one per CPU of the machine; set it to the pod's)",
    )

    up = sub.add_parser(
        "up", help="run router, servers, workers and Envoy together (foreground; Ctrl-C stops)"
    )
    _setting(
        up,
        "--agent",
        ServerConfig,
        "default_agent",
        dest="agent",
        read_env=False,
        help="the agent the workers run: demo, echo, openai, pkg.module:Class, or an agent file",
    )
    up.add_argument("--servers", type=int, default=None, help="session servers (default 1)")
    up.add_argument("--workers", type=int, default=None, help="workers (default 1)")
    up.add_argument("--host", default=None, help="public address (default 127.0.0.1)")
    up.add_argument("--port", type=int, default=None, help=f"public port (default {DEFAULT_PORT})")
    up.add_argument("--admin-port", type=int, default=None, help="Envoy admin (default: any)")
    # The servers' settings: unset, the servers' own defaults apply.
    for f in SERVER_FLAGS:
        if f.up:
            _setting(up, f.flag, ServerConfig, f.field, dest=f.key, read_env=False)
    up.add_argument(
        "--allow-open",
        action="store_true",
        default=None,
        help="allow a non-loopback --host without API keys (an open API)",
    )
    up.add_argument(
        "--restart",
        choices=[p.value for p in RestartPolicy],
        default=None,
        help="restart a child that exits: on a failure (default: on-failure, a non-zero exit "
        "or a signal), always (exit 0 too), or never (any exit stops the mesh)",
    )
    up.add_argument(
        "--restart-budget",
        type=int,
        default=None,
        help=f"restarts per component within {BUDGET_WINDOW:g} s before the mesh stops "
        f"(default {DEFAULT_BUDGET})",
    )
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
        f"default {','.join(DEFAULT_CORS_ORIGINS)}; the playground needs none)",
    )
    _edge_limits(up, env=False)
    up.add_argument("--config", type=Path, default=None, help="a TOML file with these settings")
    up.add_argument("--run-dir", type=Path, default=None, help="where logs go")
    _setting(up, "--log-level", ServerConfig, "log_level", read_env=False)

    status = sub.add_parser("status", help="the status table of a running `turnmesh up`")
    status.add_argument(
        "--run-dir",
        type=Path,
        default=_env("run_dir"),
        help="the run directory of `up` (default: the newest under .turnmesh/runs)",
    )
    status.add_argument("--json", action="store_true", help="the status file as it is")
    return parser


def _component(
    args: argparse.Namespace,
) -> tuple[str, BaseModel, Callable[[Any], Coroutine[Any, Any, None]]]:
    common = {
        "port": args.port,
        "mesh_key": args.mesh_key or None,
        "tls": tls_files(args.tls_ca, args.tls_cert, args.tls_key),
        "allow_open": args.allow_open,
    }
    if args.command == "router":
        from turnmesh.router import RouterConfig
        from turnmesh.router import serve as serve_router

        config: BaseModel = RouterConfig(**{**_given(args, RouterConfig), **common})
        return "router", config, serve_router
    if args.command == "server":
        from turnmesh.server import ServerConfig
        from turnmesh.server import serve as serve_server

        config = ServerConfig(
            **{**_given(args, ServerConfig), **common},
            api_keys=[k for k in (_env("api_keys") or "").split(",") if k],
        )
        return "server", config, serve_server
    from turnmesh.worker import WorkerConfig
    from turnmesh.worker import serve as serve_worker

    config = WorkerConfig(**{**_given(args, WorkerConfig), **common})
    return "worker", config, serve_worker


def _tune_gc() -> None:
    """Fewer garbage collections in a long-lived component: relaying an event
    allocates dozens of short-lived objects, and the default first-generation
    threshold (700) ran a collection every few events (5% of a server's CPU
    at paced load, py-spy). What was loaded at start is frozen out of every
    collection; cycles still go, a little later."""
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """asyncio.run, on uvloop when it is installed (TURNMESH_UVLOOP=0 opts out):
    grpc.aio's callbacks run on the event loop, and uvloop runs them faster."""
    _tune_gc()
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
    if args.command == "status":
        from turnmesh.cli._status import run_status

        sys.exit(run_status(args))
    if args.command == "edge":
        from turnmesh.cli.edge import run_edge

        sys.exit(run_edge(args))
    from turnmesh.runtime.logs import setup_logging
    from turnmesh.server.stores.base import StoreInUse

    try:
        name, config, serve = _component(args)
    except ValidationError as exc:
        sys.exit(f"turnmesh {args.command}: invalid configuration:\n{exc}")
    except TlsConfigError as exc:
        sys.exit(f"turnmesh {args.command}: {exc}")
    # Components set up their own logging too; the format reaches them here.
    os.environ["TURNMESH_LOG_FORMAT"] = args.log_format
    setup_logging(name, getattr(config, "log_level", "INFO"))
    try:
        with contextlib.suppress(KeyboardInterrupt):
            run_event_loop(serve(config))
    except TlsConfigError as exc:  # a file named in the flags is unreadable
        sys.exit(f"turnmesh {args.command}: {exc}")
    except StoreInUse as exc:
        sys.exit(f"turnmesh {args.command}: {exc}")
