"""What every mesh member's settings have in common (router, server, worker);
each component's config object adds its own and owns its defaults.

A field that the command line sets says so with ``Flag`` metadata; the flag's
type, default and help are the field's own (``cli/_flags.py`` builds them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from turnmesh.runtime.tls import TlsFiles


@dataclass(frozen=True)
class Flag:
    """A config field's command-line flag, as ``Annotated`` metadata
    (``Annotated[int, Flag("--max-turns", env="max_turns")]``)."""

    name: str
    # Its variable is TURNMESH_<ENV> (upper case); None: TURNMESH_<FIELD>.
    env: str | None = None
    # `turnmesh up` takes it too and passes it to its servers when given.
    up: bool = False


class MemberConfig(BaseModel):
    """Where a member listens, how it is secured, and what it reports."""

    model_config = ConfigDict(extra="forbid")

    host: Annotated[str, Flag("--host")] = Field(default="127.0.0.1", description="address to bind")
    # port, mesh_key, allow_open and tls have flags written out in cli/main.py
    # (a well-known port per command, an old name, three files).
    port: int = Field(default=0, ge=0, le=65535, description="port to bind (0: any free)")
    mesh_key: str | None = Field(default=None, description="key for mesh-internal calls")
    # Mutual TLS with the other members; plaintext when unset.
    tls: TlsFiles | None = None
    otlp_endpoint: Annotated[str | None, Flag("--otlp-endpoint")] = Field(
        default=None,
        description="send traces over OTLP/gRPC here (else OTEL_EXPORTER_OTLP_ENDPOINT; off "
        "when neither is set)",
    )
    allow_open: bool = Field(
        default=False, description="allow a non-loopback bind without a mesh key"
    )
    ready_file: Annotated[str | None, Flag("--ready-file")] = Field(
        default=None, description="write JSON here when ready"
    )
    metrics_port: Annotated[int | None, Flag("--metrics-port")] = Field(
        default=None, description="serve Prometheus /metrics on this port (0: any free port)"
    )
    log_level: Annotated[str, Flag("--log-level")] = Field(
        default="INFO", description="DEBUG, INFO, WARNING or ERROR"
    )
