"""``turnmesh edge``: render Envoy's config for the given session servers,
check it, and become Envoy (exec), so that signals reach Envoy directly: what
a container or a host of its own runs at the edge."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

from turnmesh.cli._up_config import EDGE_LIMITS
from turnmesh.envoy import EdgeConfig, EdgeGuards
from turnmesh.envoy.edge_config import DEFAULT_MAX_CONNECTIONS
from turnmesh.envoy.process import EnvoyError, envoy_argv, validate, write_config
from turnmesh.envoy.timeouts import EdgeTimeouts
from turnmesh.runtime.exposure import check_edge_exposure
from turnmesh.runtime.tls import TlsConfigError, tls_files


def edge_config(args: argparse.Namespace) -> EdgeConfig:
    if not args.upstream:
        raise ValueError("give at least one --upstream HOST:PORT (a session server)")
    if bool(args.edge_tls_cert) != bool(args.edge_tls_key):
        raise ValueError("HTTPS needs both --edge-tls-cert and --edge-tls-key")
    upstream_tls = tls_files(args.tls_ca, args.tls_cert, args.tls_key)
    check_edge_exposure(
        args.host,
        listener_tls=bool(args.edge_tls_cert),
        upstream_tls=upstream_tls is not None,
        upstreams=list(args.upstream),
        allow_open=args.allow_open,
    )
    return EdgeConfig(
        upstreams=list(args.upstream),
        host=args.host,
        port=args.port,
        admin_port=args.admin_port,
        listener_tls=(Path(args.edge_tls_cert), Path(args.edge_tls_key))
        if args.edge_tls_cert
        else None,
        upstream_tls=upstream_tls,
        otlp_endpoint=args.otlp_endpoint,
        cors_origins=_origins(args.cors_origins),
        api_keys=args.api_keys,
        max_connections=args.max_connections or DEFAULT_MAX_CONNECTIONS,
        guards=_guards(args),
        timeouts=EdgeTimeouts(
            **{f.name: getattr(args, f"{f.name}_timeout") for f in dataclasses.fields(EdgeTimeouts)}
        ),
    )


def _guards(args: argparse.Namespace) -> EdgeGuards:
    # Unset flags: EdgeGuards' own defaults (max_connections is EdgeConfig's).
    given = {name: getattr(args, name) for name in EDGE_LIMITS if name != "max_connections"}
    return EdgeGuards(
        **{k: v for k, v in given.items() if v is not None},
        allowed_hosts=tuple(args.allowed_hosts or ()),
    )


def _origins(value: str) -> tuple[str, ...]:
    return tuple(o.strip() for o in value.split(",") if o.strip())


def run_edge(args: argparse.Namespace) -> int:
    try:
        config = edge_config(args)
        directory = Path(args.config_dir or tempfile.mkdtemp(prefix="turnmesh-edge-"))
        directory.mkdir(parents=True, exist_ok=True)
        path = write_config(config, directory / "envoy.json")
        validate(path)
    except (ValueError, TlsConfigError, EnvoyError, OSError) as exc:
        print(f"turnmesh edge: {exc}", file=sys.stderr, flush=True)
        return 2
    argv = envoy_argv(path, directory / "envoy-admin-address", args.concurrency)
    print(
        f"turnmesh edge: Envoy on {args.host}:{args.port} in front of "
        f"{', '.join(config.upstreams)} (config {path})",
        flush=True,
    )
    os.execv(argv[0], argv)  # Envoy takes over this process
