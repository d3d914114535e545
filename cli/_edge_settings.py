"""`turnmesh edge` settings, and the public side of the edge that `turnmesh up`
takes too: where Envoy listens, which origins and Host names it answers, and
its limits. The defaults are the edge's own (envoy/edge_config.py); the
descriptions are the flags' help."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from turnmesh.envoy.edge_config import (
    DEFAULT_ADMIN_PORT,
    DEFAULT_CORS_ORIGINS,
    DEFAULT_HOST,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_PORT,
    MAX_STREAMS,
    EdgeGuards,
)
from turnmesh.runtime.config import Flag

_GUARDS = EdgeGuards()  # the limits' defaults


class PublicEdge(BaseModel):
    """Envoy's public listener, as flags of `up` and `edge` alike (and keys of
    `up`'s config file); the limits are envoy/guards.py's."""

    model_config = ConfigDict(extra="forbid")

    host: Annotated[str, Flag("--host")] = Field(default=DEFAULT_HOST, description="public address")
    port: Annotated[int, Flag("--port")] = Field(
        default=DEFAULT_PORT, ge=0, le=65535, description="public port"
    )
    cors_origins: Annotated[str, Flag("--cors-origins")] = Field(
        default=",".join(DEFAULT_CORS_ORIGINS),
        description="browser origins allowed to call the API, comma-separated ('*' for any; "
        "the playground needs none)",
    )
    rate_limit_per_ip: Annotated[int, Flag("--rate-limit-per-ip")] = Field(
        default=_GUARDS.rate_limit_per_ip,
        ge=0,
        description="requests a second per client IP at Envoy, bursts of twice that "
        "(0: no limit; 127.0.0.1 and ::1 are never limited)",
    )
    max_streams_per_connection: Annotated[int, Flag("--max-streams-per-connection")] = Field(
        default=_GUARDS.max_streams_per_connection,
        ge=1,
        le=MAX_STREAMS,
        description="concurrent HTTP/2 streams (gRPC calls) on one client connection",
    )
    max_connections: Annotated[int, Flag("--max-connections")] = Field(
        default=DEFAULT_MAX_CONNECTIONS,
        ge=1,
        description="client connections Envoy holds at once; near it, idle ones close sooner",
    )
    max_heap_mb: Annotated[int, Flag("--max-heap-mb")] = Field(
        default=_GUARDS.max_heap_mb,
        ge=1,
        description="Envoy's heap in MiB; new requests get 429 at 95 percent of it",
    )
    allowed_hosts: Annotated[list[str], Flag("--allowed-host")] = Field(
        default_factory=list,
        description="a Host name the API answers to besides localhost and --host (repeat; "
        "'*': any); without API keys other names get 421",
    )
    trusted_proxy_hops: Annotated[int, Flag("--trusted-proxy-hops")] = Field(
        default=_GUARDS.trusted_proxy_hops,
        ge=0,
        description="proxies in front of Envoy whose X-Forwarded-For names the client",
    )

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _host_list(cls, value: object) -> object:
        # TURNMESH_ALLOWED_HOSTS=a,b as the environment gives it.
        if isinstance(value, str):
            return [h.strip() for h in value.split(",") if h.strip()]
        return value

    @property
    def origins(self) -> tuple[str, ...]:
        """``cors_origins`` as EdgeConfig takes them."""
        return tuple(o.strip() for o in self.cors_origins.split(",") if o.strip())

    @property
    def edge_guards(self) -> EdgeGuards:
        return EdgeGuards(
            rate_limit_per_ip=self.rate_limit_per_ip,
            max_streams_per_connection=self.max_streams_per_connection,
            max_heap_mb=self.max_heap_mb,
            allowed_hosts=tuple(self.allowed_hosts),
            trusted_proxy_hops=self.trusted_proxy_hops,
        )


class EdgeSettings(PublicEdge):
    """What `turnmesh edge` takes besides its servers (``--upstream``).

    Built from the flags as given, unchecked (``model_construct``): EdgeGuards,
    the edge's own checks and Envoy's validation of the rendered config refuse
    what is wrong, in words that name the flags."""

    admin_port: Annotated[int, Flag("--admin-port")] = Field(
        default=DEFAULT_ADMIN_PORT, description="Envoy's admin port, on 127.0.0.1"
    )
    tls_ca: Annotated[str | None, Flag("--tls-ca")] = Field(
        default=None, description="mesh CA: mTLS to the servers"
    )
    tls_cert: Annotated[str | None, Flag("--tls-cert")] = Field(
        default=None, description="Envoy's mesh certificate"
    )
    tls_key: Annotated[str | None, Flag("--tls-key")] = Field(
        default=None, description="Envoy's mesh private key"
    )
    edge_tls_cert: Annotated[str | None, Flag("--edge-tls-cert")] = Field(
        default=None, description="HTTPS: cert"
    )
    edge_tls_key: Annotated[str | None, Flag("--edge-tls-key")] = Field(
        default=None, description="HTTPS: key"
    )
    otlp_endpoint: Annotated[str | None, Flag("--otlp-endpoint")] = Field(
        default=None, description="OTLP/gRPC collector for Envoy's spans"
    )
    # These two have flags written out in cli/main.py: TURNMESH_ALLOW_OPEN
    # counts only as 1, and --api-keys-required / --no-key-check both set
    # api_keys (None: not known; see EdgeConfig.api_keys).
    allow_open: bool = Field(
        default=False,
        description="allow a non-loopback bind without HTTPS and mutual TLS to the servers "
        "(TLS ends in front of Envoy, on a trusted network)",
    )
    api_keys: bool | None = None
    config_dir: Annotated[str | None, Flag("--config-dir")] = Field(
        default=None, description="where envoy.json goes (unset: a new temporary directory)"
    )
    concurrency: Annotated[int | None, Flag("--concurrency")] = Field(
        default=None,
        description="Envoy worker threads (unset: one per CPU of the machine; set it to the pod's)",
    )
