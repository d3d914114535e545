"""What every mesh member's settings have in common (router, server, worker);
each component's config object adds its own and owns its defaults."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from turnmesh.runtime.tls import TlsFiles


class MemberConfig(BaseModel):
    """Where a member listens, how it is secured, and what it reports."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(default="127.0.0.1", description="address to bind")
    port: int = Field(default=0, ge=0, le=65535, description="port to bind (0: any free)")
    mesh_key: str | None = Field(default=None, description="key for mesh-internal calls")
    # Mutual TLS with the other members; plaintext when unset.
    tls: TlsFiles | None = None
    otlp_endpoint: str | None = Field(
        default=None,
        description="send traces over OTLP/gRPC here (else OTEL_EXPORTER_OTLP_ENDPOINT; off "
        "when neither is set)",
    )
    allow_open: bool = Field(
        default=False, description="allow a non-loopback bind without a mesh key"
    )
    ready_file: str | None = Field(default=None, description="write JSON here when ready")
    metrics_port: int | None = Field(
        default=None, description="serve Prometheus /metrics on this port (0: any free port)"
    )
    log_level: str = Field(default="INFO", description="DEBUG, INFO, WARNING or ERROR")
