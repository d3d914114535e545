"""`turnmesh up` settings: defaults < environment < config file < flags.

The servers' settings among them (``ServerConfig`` fields whose ``Flag`` is
marked ``up``) have no default here: unset, `up` passes nothing and the
servers' own apply; given, they are checked as ``ServerConfig`` checks them
before anything starts, and passed as the same flag.
"""

from __future__ import annotations

import os
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ModelWrapValidatorHandler, PrivateAttr, ValidationError, model_validator

from turnmesh.cli._edge_settings import PublicEdge
from turnmesh.cli._flags import ENV_PREFIX, Setting, settings
from turnmesh.cli._restart import BUDGET_WINDOW, DEFAULT_BUDGET, RestartPolicy
from turnmesh.runtime.config import Flag
from turnmesh.runtime.tls import TlsFiles
from turnmesh.server.config import ServerConfig

# The server flags `up` takes, by their key in the config file.
UP_SERVER_FLAGS: dict[str, Setting] = {s.key: s for s in settings(ServerConfig).values() if s.up}
_BY_FIELD = {f.field: f for f in UP_SERVER_FLAGS.values()}


def _checked(given: dict[str, Any]) -> dict[str, Any]:
    """Server settings by key -> typed values by ServerConfig field, checked
    by ServerConfig itself (the one place their types and bounds live)."""
    fields = {UP_SERVER_FLAGS[key].field: value for key, value in given.items()}
    try:
        # router_address is required and `up` sets it: a stand-in.
        config = ServerConfig.model_validate({"router_address": "-", **fields})
    except ValidationError as exc:
        error = exc.errors()[0]
        f = _BY_FIELD[str(error["loc"][0])]
        where = f"{f.key} ({f.flag}, {f.variable})"
        raise ValueError(
            f"invalid setting {where}: {error['msg']} (got {error['input']!r})"
        ) from None
    return {name: getattr(config, name) for name in fields}


class UpConfig(PublicEdge):
    """What `turnmesh up` starts. A TOML config file holds the same keys.

    Envoy's address, origins, Host names and limits are ``PublicEdge``'s, as
    `turnmesh edge` has them."""

    agent: Annotated[str, Flag("--agent")] = Field(
        default=ServerConfig.model_fields["default_agent"].default,
        description="the agent the workers run: demo, echo, openai, pkg.module:Class, or an "
        "agent file",
    )
    servers: Annotated[int, Flag("--servers")] = Field(
        default=1, ge=1, le=32, description="session servers"
    )
    workers: Annotated[int, Flag("--workers")] = Field(
        default=1, ge=1, le=64, description="workers"
    )
    admin_port: Annotated[int, Flag("--admin-port")] = Field(
        default=0, ge=0, le=65535, description="Envoy's admin port (0: any free)"
    )
    # Unset: a random key for this run. Children get it in their environment.
    mesh_key: str | None = None
    # Mutual TLS between the members (and from Envoy to the servers): the mesh
    # CA, and one certificate for every member, valid for 127.0.0.1 or --host.
    tls_ca: Annotated[Path | None, Flag("--tls-ca")] = Field(
        default=None, description="mesh CA: mutual TLS inside"
    )
    tls_cert: Annotated[Path | None, Flag("--tls-cert")] = Field(
        default=None, description="the members' certificate"
    )
    tls_key: Annotated[Path | None, Flag("--tls-key")] = Field(
        default=None, description="the members' private key"
    )
    otlp_endpoint: Annotated[str | None, Flag("--otlp-endpoint")] = Field(
        default=None, description="OTLP/gRPC collector for traces (every component's and Envoy's)"
    )
    # HTTPS (and gRPC over TLS) on Envoy's public listener.
    edge_tls_cert: Annotated[Path | None, Flag("--edge-tls-cert")] = Field(
        default=None, description="HTTPS at Envoy: cert"
    )
    edge_tls_key: Annotated[Path | None, Flag("--edge-tls-key")] = Field(
        default=None, description="HTTPS at Envoy: key"
    )
    allow_open: Annotated[bool, Flag("--allow-open")] = Field(
        default=False, description="allow a non-loopback --host without API keys (an open API)"
    )
    restart: Annotated[RestartPolicy, Flag("--restart")] = Field(
        default=RestartPolicy.ON_FAILURE,
        description="restart a child that exits: on a failure (a non-zero exit or a signal), "
        "always (exit 0 too), or never (any exit stops the mesh)",
    )
    restart_budget: Annotated[int, Flag("--restart-budget")] = Field(
        default=DEFAULT_BUDGET,
        ge=0,
        le=1000,
        description=f"restarts per component within {BUDGET_WINDOW:g} s before the mesh stops",
    )
    run_dir: Annotated[Path | None, Flag("--run-dir")] = Field(
        default=None, description="where logs go (unset: a new directory under .turnmesh/runs)"
    )
    # Unset: the members' own default; `up` takes their --log-level flag.
    log_level: str | None = None
    # Servers get this long to finish running turns on Ctrl-C; with the other
    # steps, everything is gone within 5 seconds.
    drain_seconds: float = Field(default=2.5, ge=0, le=30)
    # The server settings given, by ServerConfig field (see _server_settings).
    _server: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _server_settings(cls, data: Any, handler: ModelWrapValidatorHandler[UpConfig]) -> UpConfig:
        # The servers' keys (session_ttl, store, ...) are no fields of this
        # model: none has a default here, so an unset one stays unset.
        if not isinstance(data, dict):
            return handler(data)
        rest = {k: v for k, v in data.items() if k not in UP_SERVER_FLAGS}
        server = _checked({k: v for k, v in data.items() if k in UP_SERVER_FLAGS})
        config = handler(rest)
        config._server = server
        return config

    @model_validator(mode="after")
    def _tls_complete(self) -> UpConfig:
        mesh = [self.tls_ca, self.tls_cert, self.tls_key]
        if any(mesh) and not all(mesh):
            raise ValueError("mutual TLS needs all of tls_ca, tls_cert and tls_key")
        if bool(self.edge_tls_cert) != bool(self.edge_tls_key):
            raise ValueError("HTTPS at the edge needs both edge_tls_cert and edge_tls_key")
        return self

    def server_setting(self, field: str) -> Any:
        """A ServerConfig field as the servers will have it: given, or their default."""
        if field in self._server:
            return self._server[field]
        return ServerConfig.model_fields[field].get_default(call_default_factory=True)

    @property
    def store(self) -> str:
        return str(self.server_setting("store"))

    @property
    def api_keys_file(self) -> str | None:
        value = self.server_setting("api_keys_file")
        return None if value is None else str(value)

    def server_args(self) -> list[str]:
        """The flags that give each server the settings given to `up`, and no other."""
        args: list[str] = []
        for field, f in _BY_FIELD.items():  # in the flags' order, whatever set them
            if field in self._server:
                args += [f.flag, str(self._server[field])]
        return args

    @property
    def mesh_tls(self) -> TlsFiles | None:
        if self.tls_ca and self.tls_cert and self.tls_key:
            return TlsFiles(ca_file=self.tls_ca, cert_file=self.tls_cert, key_file=self.tls_key)
        return None

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
    # A server setting's variable is the one `turnmesh server` reads.
    variables = {name: name for name in UpConfig.model_fields}
    variables |= {key: f.env_name for key, f in UP_SERVER_FLAGS.items()}
    values: dict[str, Any] = {}
    for key, variable in variables.items():
        env = os.environ.get(ENV_PREFIX + variable.upper())
        # Empty is unset for a server's variable, as `turnmesh server` reads it.
        if env is not None and (env or key not in UP_SERVER_FLAGS):
            values[key] = env
    if config_file is not None:
        with config_file.open("rb") as f:
            data = tomllib.load(f)
        values.update(data.get("up", data))
    values.update({k: v for k, v in flags.items() if v is not None})
    return UpConfig(**values)
