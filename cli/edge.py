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

from turnmesh.cli._edge_settings import EdgeSettings
from turnmesh.cli._flags import given
from turnmesh.envoy import EdgeConfig
from turnmesh.envoy.edge_config import DEFAULT_MAX_CONNECTIONS
from turnmesh.envoy.process import EnvoyError, envoy_argv, validate, write_config
from turnmesh.envoy.timeouts import EdgeTimeouts
from turnmesh.runtime.exposure import check_edge_exposure
from turnmesh.runtime.tls import TlsConfigError, tls_files


def edge_config(args: argparse.Namespace) -> EdgeConfig:
    if not args.upstream:
        raise ValueError("give at least one --upstream HOST:PORT (a session server)")
    settings = EdgeSettings.model_construct(**given(args, EdgeSettings))
    cert, key = settings.edge_tls_cert, settings.edge_tls_key
    if bool(cert) != bool(key):
        raise ValueError("HTTPS needs both --edge-tls-cert and --edge-tls-key")
    upstream_tls = tls_files(settings.tls_ca, settings.tls_cert, settings.tls_key)
    check_edge_exposure(
        settings.host,
        listener_tls=bool(cert),
        upstream_tls=upstream_tls is not None,
        upstreams=list(args.upstream),
        allow_open=settings.allow_open,
    )
    return EdgeConfig(
        upstreams=list(args.upstream),
        ws_upstreams=list(args.ws_upstream),
        host=settings.host,
        port=settings.port,
        admin_port=settings.admin_port,
        listener_tls=(Path(cert), Path(key)) if cert and key else None,
        upstream_tls=upstream_tls,
        otlp_endpoint=settings.otlp_endpoint,
        cors_origins=settings.origins,
        api_keys=settings.api_keys,
        # 0, as ever: the default.
        max_connections=settings.max_connections or DEFAULT_MAX_CONNECTIONS,
        guards=settings.edge_guards,
        timeouts=EdgeTimeouts(
            **{f.name: getattr(args, f"{f.name}_timeout") for f in dataclasses.fields(EdgeTimeouts)}
        ),
    )


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
        f"turnmesh edge: Envoy on {config.host}:{config.port} in front of "
        f"{', '.join(config.upstreams)} (config {path})",
        flush=True,
    )
    os.execv(argv[0], argv)  # Envoy takes over this process
