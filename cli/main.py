"""``turnmesh router|server|worker|edge|up|status|store``: flags, with ``TURNMESH_*`` environment
variables as defaults (a flag wins over the environment). Most flags are the
config models' fields (cli/_flags.py); the few written out here have rules of
their own (ports, an old name, files that come in threes)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeAlias

from pydantic import BaseModel, ValidationError

from turnmesh.cli._flags import add_flag, add_flags, env, given, settings
from turnmesh.cli.store import add_store_command
from turnmesh.runtime.config import MemberConfig
from turnmesh.runtime.memory import tune_allocator
from turnmesh.runtime.tls import TlsConfigError, tls_files

# The commands listen on well-known ports; the configs' own default (0, any
# free port) is for code that embeds a component.
PORTS = {"router": 7000, "server": 7100, "worker": 7200}
# Where `turnmesh router` listens unless told otherwise.
ROUTER = f"{MemberConfig.model_fields['host'].default}:{PORTS['router']}"

_Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line; given the arguments, only the command they name is
    built: each command's flags come from its component's config, and
    importing every component cost each member process a fifth of a second
    of CPU at start. ``turnmesh --help`` (or a wrong command) builds all."""
    parser = argparse.ArgumentParser(
        prog="turnmesh", description="A gRPC service mesh for stateful, multi-turn AI agents."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    named = argv[0] if argv else None
    for command, add in _COMMANDS.items():
        if named not in _COMMANDS or command == named:
            add(sub)
    return parser


def _member(
    sub: _Commands, command: str, model: type[MemberConfig], help: str
) -> argparse.ArgumentParser:
    """A member's command: the flags every member has, then its config's."""
    p = sub.add_parser(command, help=help)
    port = PORTS[command]
    p.add_argument(
        "--port",
        type=int,
        default=env("port", str(port)) or "0",
        help=f"port to bind, 0: any free (default: {port})",
    )
    p.add_argument(
        "--mesh-key",
        "--admin-key",  # the name before 0.2; kept so existing scripts work
        dest="mesh_key",
        default=env("mesh_key") or env("admin_key"),
        help=f"{model.model_fields['mesh_key'].description} (env TURNMESH_MESH_KEY)",
    )
    p.add_argument(
        "--allow-open",
        action="store_true",
        default=env("allow_open") == "1",
        help=model.model_fields["allow_open"].description,
    )
    p.add_argument("--tls-ca", default=env("tls_ca"), help="mesh CA (PEM): enables mutual TLS")
    p.add_argument("--tls-cert", default=env("tls_cert"), help="this member's certificate (PEM)")
    p.add_argument("--tls-key", default=env("tls_key"), help="this member's private key (PEM)")
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=env("log_format", "text"),
        help="json: one JSON object per line (TURNMESH_LOG_FORMAT)",
    )
    add_flags(p, model)
    return p


def _router_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--router",
        dest="router_address",
        default=env("router", ROUTER),
        help=f"the router, host:port (default: {ROUTER})",
    )


def _router_command(sub: _Commands) -> None:
    from turnmesh.router.app import RouterConfig

    _member(sub, "router", RouterConfig, "run the router (membership and session ownership)")


def _server_command(sub: _Commands) -> None:
    from turnmesh.server.config import ServerConfig

    server = _member(
        sub, "server", ServerConfig, "run a session server (the public SessionService)"
    )
    _router_flag(server)


def _worker_command(sub: _Commands) -> None:
    from turnmesh.worker.app import WorkerConfig

    worker = _member(sub, "worker", WorkerConfig, "run a worker that hosts one agent")
    _router_flag(worker)


def _edge_timeouts(parser: argparse.ArgumentParser) -> None:
    """--NAME-timeout for each of Envoy's timeouts (seconds; defaults from EdgeTimeouts)."""
    from turnmesh.envoy.timeouts import EdgeTimeouts

    for item in dataclasses.fields(EdgeTimeouts):
        flag = item.name.replace("_", "-")
        raw = env(f"{item.name}_timeout")
        parser.add_argument(
            f"--{flag}-timeout",
            dest=f"{item.name}_timeout",
            type=float,
            default=raw or item.default,
            help=f"seconds (default {item.default:g}; README: Running in production)",
        )


def _edge_command(sub: _Commands) -> None:
    from turnmesh.cli._edge_settings import EdgeSettings

    edge = sub.add_parser(
        "edge", help="run Envoy in front of session servers (what a container runs)"
    )
    # The servers: what the edge is for, so no setting with a default.
    edge.add_argument(
        "--upstream",
        action="append",
        default=[u for u in (env("upstreams") or "").split(",") if u],
        help="a session server host:port (repeat; a DNS name gives every address it has)",
    )
    edge.add_argument(
        "--ws-upstream",
        action="append",
        default=[u for u in (env("ws_upstreams") or "").split(",") if u],
        help="a session server's WebSocket listener host:port (its --ws-port), for AReaL's"
        " /ws (repeat; none: no /ws)",
    )
    # An empty variable is an empty text here: TURNMESH_CORS_ORIGINS= allows no origin.
    add_flags(edge, EdgeSettings, keep_empty=True)
    edge.add_argument(
        "--allow-open",
        action="store_true",
        default=env("allow_open") == "1",
        help=EdgeSettings.model_fields["allow_open"].description,
    )
    # What the servers behind do about keys (unknown: Envoy checks keys before
    # bodies and answers only to allowed Host names, both).
    keys = edge.add_mutually_exclusive_group()
    keys.add_argument(
        "--api-keys-required",
        dest="api_keys",
        action="store_const",
        const=True,
        default=True if env("api_keys_required") == "1" else None,
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
    _edge_timeouts(edge)


def _up_command(sub: _Commands) -> None:
    from turnmesh.cli._up_config import UP_SERVER_FLAGS, UpConfig

    up = sub.add_parser(
        "up", help="run router, servers, workers and Envoy together (foreground; Ctrl-C stops)"
    )
    # `up` reads the environment itself, below its config file (_up_config.load).
    add_flags(up, UpConfig, read_env=False)
    # The servers' settings: unset, the servers' own defaults apply.
    for setting in UP_SERVER_FLAGS.values():
        add_flag(up, setting, dest=setting.key, read_env=False)
    # The members' own, passed to each of them.
    add_flag(up, settings(MemberConfig)["log_level"], read_env=False)
    up.add_argument("--config", type=Path, default=None, help="a TOML file with these settings")


def _status_command(sub: _Commands) -> None:
    status = sub.add_parser("status", help="the status table of a running `turnmesh up`")
    status.add_argument(
        "--run-dir",
        type=Path,
        default=env("run_dir"),
        help="the run directory of `up` (default: the newest under .turnmesh/runs)",
    )
    status.add_argument("--json", action="store_true", help="the status file as it is")


_COMMANDS: dict[str, Callable[[_Commands], None]] = {
    "router": _router_command,
    "server": _server_command,
    "worker": _worker_command,
    "edge": _edge_command,
    "up": _up_command,
    "status": _status_command,
    "store": add_store_command,
}


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

        config: BaseModel = RouterConfig(**{**given(args, RouterConfig), **common})
        return "router", config, serve_router
    if args.command == "server":
        from turnmesh.server import ServerConfig
        from turnmesh.server import serve as serve_server

        config = ServerConfig(
            **{**given(args, ServerConfig), **common},
            api_keys=[k for k in (env("api_keys") or "").split(",") if k],
        )
        return "server", config, serve_server
    from turnmesh.worker import WorkerConfig
    from turnmesh.worker import serve as serve_worker

    config = WorkerConfig(**{**given(args, WorkerConfig), **common})
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
    tune_allocator()
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
    given_args = sys.argv[1:] if argv is None else argv
    args = build_parser(given_args).parse_args(given_args)
    if args.command == "up":
        from turnmesh.cli.up import run_up

        sys.exit(run_up(args))
    if args.command == "status":
        from turnmesh.cli._status import run_status

        sys.exit(run_status(args))
    if args.command == "store":
        from turnmesh.cli.store import run_store

        sys.exit(run_store(args))
    if args.command == "edge":
        from turnmesh.cli.edge import run_edge

        sys.exit(run_edge(args))
    from turnmesh.runtime.logs import setup_logging

    # What a member says in one line and exits with (a server's store is
    # another server's: only a server imports the stores).
    refusals: tuple[type[Exception], ...] = (TlsConfigError,)
    if args.command == "server":
        from turnmesh.server.stores.base import StoreInUse

        refusals = (TlsConfigError, StoreInUse)
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
    except refusals as exc:  # a file named in the flags is unreadable, a store in use
        sys.exit(f"turnmesh {args.command}: {exc}")
