"""`turnmesh up` settings: defaults < environment < config file < flags."""

from __future__ import annotations

import os
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from turnmesh.cli._restart import DEFAULT_BUDGET, RestartPolicy
from turnmesh.envoy import guards
from turnmesh.envoy.config import DEFAULT_CORS_ORIGINS, DEFAULT_PORT
from turnmesh.runtime.tls import TlsFiles

ENV_PREFIX = "TURNMESH_"
# Envoy's limits with one number each: flags of `up` and `edge` alike.
EDGE_LIMITS = (
    "rate_limit_per_ip",
    "max_streams_per_connection",
    "max_connections",
    "max_heap_mb",
    "trusted_proxy_hops",
)


class UpConfig(BaseModel):
    """What `turnmesh up` starts. A TOML config file holds the same keys."""

    model_config = ConfigDict(extra="forbid")

    agent: str = "demo"
    servers: int = Field(default=1, ge=1, le=32)
    workers: int = Field(default=1, ge=1, le=64)
    host: str = "127.0.0.1"
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    admin_port: int = Field(default=0, ge=0, le=65535)
    # Unset: the servers' own default (ServerConfig.session_ttl_seconds).
    session_ttl: float | None = Field(default=None, gt=0)
    store: str = "memory"
    api_keys_file: str | None = None
    # Unset: a random key for this run. Children get it in their environment.
    mesh_key: str | None = None
    # Mutual TLS between the members (and from Envoy to the servers): the mesh
    # CA, and one certificate for every member, valid for 127.0.0.1 or --host.
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # OTLP/gRPC collector for every component's spans and Envoy's.
    otlp_endpoint: str | None = None
    # Browser origins allowed to call the API, comma-separated ("*": any).
    cors_origins: str = ",".join(DEFAULT_CORS_ORIGINS)
    # HTTPS (and gRPC over TLS) on Envoy's public listener.
    edge_tls_cert: Path | None = None
    edge_tls_key: Path | None = None
    # A public host without API keys is refused unless this is set.
    allow_open: bool = False
    # Envoy's limits (envoy/guards.py), flags of `up` and `edge` alike.
    rate_limit_per_ip: int = Field(
        default=guards.DEFAULT_RATE_LIMIT_PER_IP,
        ge=0,
        description="requests a second per client IP at Envoy, bursts of twice that "
        "(0: no limit; 127.0.0.1 and ::1 are never limited)",
    )
    max_streams_per_connection: int = Field(
        default=guards.DEFAULT_MAX_STREAMS_PER_CONNECTION,
        ge=1,
        le=guards.MAX_STREAMS,
        description="concurrent HTTP/2 streams (gRPC calls) on one client connection",
    )
    max_connections: int = Field(
        default=guards.DEFAULT_MAX_CONNECTIONS,
        ge=1,
        description="client connections Envoy holds at once; near it, idle ones close sooner",
    )
    max_heap_mb: int = Field(
        default=guards.DEFAULT_MAX_HEAP_MB,
        ge=1,
        description="Envoy's heap in MiB; new requests get 429 at 95 percent of it",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="a Host name the API answers to besides localhost and --host (repeat; "
        "'*': any); without API keys other names get 421",
    )
    trusted_proxy_hops: int = Field(
        default=0,
        ge=0,
        description="proxies in front of Envoy whose X-Forwarded-For names the client",
    )
    # Which exits of a child restart it, and how many restarts a component
    # gets within _restart.BUDGET_WINDOW before `up` gives up.
    restart: RestartPolicy = RestartPolicy.ON_FAILURE
    restart_budget: int = Field(default=DEFAULT_BUDGET, ge=0, le=1000)
    run_dir: Path | None = None
    log_level: str = "INFO"
    # Servers get this long to finish running turns on Ctrl-C; with the other
    # steps, everything is gone within 5 seconds.
    drain_seconds: float = Field(default=2.5, ge=0, le=30)

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _host_list(cls, value: object) -> object:
        # TURNMESH_ALLOWED_HOSTS=a,b as the environment gives it.
        if isinstance(value, str):
            return [h.strip() for h in value.split(",") if h.strip()]
        return value

    @model_validator(mode="after")
    def _tls_complete(self) -> UpConfig:
        mesh = [self.tls_ca, self.tls_cert, self.tls_key]
        if any(mesh) and not all(mesh):
            raise ValueError("mutual TLS needs all of tls_ca, tls_cert and tls_key")
        if bool(self.edge_tls_cert) != bool(self.edge_tls_key):
            raise ValueError("HTTPS at the edge needs both edge_tls_cert and edge_tls_key")
        return self

    @property
    def mesh_tls(self) -> TlsFiles | None:
        if self.tls_ca and self.tls_cert and self.tls_key:
            return TlsFiles(ca_file=self.tls_ca, cert_file=self.tls_cert, key_file=self.tls_key)
        return None

    @property
    def edge_guards(self) -> guards.EdgeGuards:
        return guards.EdgeGuards(
            rate_limit_per_ip=self.rate_limit_per_ip,
            max_streams_per_connection=self.max_streams_per_connection,
            max_heap_mb=self.max_heap_mb,
            allowed_hosts=tuple(self.allowed_hosts),
            trusted_proxy_hops=self.trusted_proxy_hops,
        )

    @property
    def edge_tls(self) -> tuple[Path, Path] | None:
        if self.edge_tls_cert and self.edge_tls_key:
            return (self.edge_tls_cert, self.edge_tls_key)
        return None

    def resolved_run_dir(self) -> Path:
        if self.run_dir is not None:
            return self.run_dir
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        return Path(".turnmesh") / "runs" / f"{stamp}-{os.getpid()}"


def load(config_file: Path | None, flags: dict[str, Any]) -> UpConfig:
    values: dict[str, Any] = {}
    for name in UpConfig.model_fields:
        env = os.environ.get(ENV_PREFIX + name.upper())
        if env is not None:
            values[name] = env
    if config_file is not None:
        with config_file.open("rb") as f:
            data = tomllib.load(f)
        values.update(data.get("up", data))
    values.update({k: v for k, v in flags.items() if v is not None})
    return UpConfig(**values)
