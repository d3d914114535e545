"""The session server's settings: typed objects that own their defaults.

``turnmesh server`` (flags and ``TURNMESH_*`` variables), ``turnmesh up``
and embedding code all read the defaults from here; the descriptions are the
flags' help.

The settings marked ``up`` are flags of ``turnmesh up`` too, which passes
them to its servers when given. Not on `up`: what it sets itself (--agent and
--grace-seconds from its own --agent and drain_seconds, the members' common
flags), --advertise-host (its children bind loopback), --report-page-size (a
message size towards a restarted router, nothing a user sees) and
--metrics-principal-label (`up` serves no metrics port).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from turnmesh.runtime.config import Flag, MemberConfig
from turnmesh.runtime.receipts import DEFAULT_PER_PRINCIPAL
from turnmesh.server.sessions.eventlog import DEFAULT_MAX_BYTES as DEFAULT_EVENT_LOG_BYTES


class SessionLimits(BaseModel):
    """What one server holds and runs at most, and how long it keeps things."""

    model_config = ConfigDict(extra="forbid")

    session_ttl_seconds: Annotated[float, Flag("--session-ttl", env="session_ttl", up=True)] = (
        Field(
            default=1800.0, gt=0, description="seconds a session may be idle before it is deleted"
        )
    )
    event_log_max_events: int = Field(
        default=50_000, gt=0, description="events kept per turn for resuming"
    )
    event_log_max_turns: int = Field(
        default=32, gt=0, description="turns whose events are kept per session"
    )
    event_log_ttl_seconds: Annotated[float, Flag("--event-log-ttl", up=True)] = Field(
        default=600.0, gt=0, description="seconds a finished turn's events are kept for resuming"
    )
    event_log_max_bytes: Annotated[int, Flag("--max-event-log-bytes", up=True)] = Field(
        default=DEFAULT_EVENT_LOG_BYTES,
        gt=0,
        description=(
            "bytes the finished turns' events may hold on this server, packed; past it the"
            " oldest go first (a resume of them is 404, the history keeps the turn)"
        ),
    )
    turn_record_ttl_seconds: Annotated[float, Flag("--turn-record-ttl", up=True)] = Field(
        default=7 * 86_400.0,
        gt=0,
        description=(
            "seconds a background turn's record (GetTurn: its state, times, usage, error)"
            " is kept after it ends, at most 1,000 a session; deleted with its session"
        ),
    )
    pause_timeout_seconds: Annotated[float, Flag("--pause-timeout", up=True)] = Field(
        default=86_400.0,
        gt=0,
        description=(
            "seconds a turn's wait for the client (its tools' results, approvals, answers)"
            " lasts; after it the next turn tells the agent they went unanswered. A waiting"
            " session is not deleted as idle before its wait ends"
        ),
    )
    keepalive_seconds: Annotated[float, Flag("--keepalive", env="keepalive", up=True)] = Field(
        default=15.0, gt=0, description="seconds of silence before a turn stream gets a keepalive"
    )
    max_turns_in_flight: Annotated[int, Flag("--max-turns", env="max_turns", up=True)] = Field(
        default=512,
        gt=0,
        description="turns running at once before new ones get RESOURCE_EXHAUSTED (429)",
    )
    max_sessions: Annotated[int, Flag("--max-sessions", up=True)] = Field(
        default=100_000,
        gt=0,
        description=(
            "sessions held before new ones get RESOURCE_EXHAUSTED (429); with a Redis"
            " store, sessions in the whole mesh"
        ),
    )
    max_queued_per_session: int = Field(
        default=64,
        gt=0,
        description=(
            "messages waiting on one session (each of a coalesced batch counts) before"
            " new ones get 429"
        ),
    )
    max_pending_bytes_per_session: Annotated[int, Flag("--max-pending-bytes", up=True)] = Field(
        default=256 * 2**20,
        gt=0,
        description=(
            "bytes of messages and files one session's running and waiting turns may hold"
            " before new turns get 429 (coalesced ones included)"
        ),
    )
    max_pending_bytes_per_principal: Annotated[
        int, Flag("--max-pending-bytes-per-principal", up=True)
    ] = Field(
        default=512 * 2**20,
        gt=0,
        description=(
            "bytes of messages and files one principal's running and waiting turns may hold"
            " on a server before new ones get 429 TURN_QUOTA_EXCEEDED"
        ),
    )
    max_sessions_per_principal: Annotated[
        int | None, Flag("--max-sessions-per-principal", up=True)
    ] = Field(
        default=None,
        gt=0,
        description=(
            "sessions one principal may hold before its creates get 429"
            " SESSION_QUOTA_EXCEEDED; with a Redis store, in the whole mesh"
        ),
    )
    max_turns_per_principal: Annotated[int | None, Flag("--max-turns-per-principal", up=True)] = (
        Field(
            default=None,
            gt=0,
            description=(
                "turns one principal may have running or queued on a server before new"
                " ones get 429 TURN_QUOTA_EXCEEDED; with a Redis store, in the whole mesh"
            ),
        )
    )
    metrics_principal_label: Annotated[bool, Flag("--metrics-principal-label")] = Field(
        default=False,
        description=(
            "label turn metrics with the principal (one series per principal: only"
            " with a bounded number of them)"
        ),
    )


class ServerConfig(MemberConfig, SessionLimits):
    """Settings of one session server process (its limits included)."""

    router_address: str = Field(description="the router, host:port")
    default_agent: Annotated[str, Flag("--agent", env="agent")] = Field(
        default="demo", description="the agent of sessions that name none"
    )
    store: Annotated[str, Flag("--store", up=True)] = Field(
        default="memory",
        description=(
            "memory, sqlite:PATH, redis://HOST:PORT/DB, redis+cluster://HOST:PORT or"
            " postgresql://USER@HOST/DB"
        ),
    )
    lease_seconds: Annotated[float, Flag("--lease-seconds", up=True)] = Field(
        default=6.0,
        gt=0,
        description=(
            "with a shared store: how long a server's hold on its sessions outlasts its"
            " last renewal (a dead server's sessions move after this)"
        ),
    )
    # Public API keys (plain; kept hashed in memory) and/or a file of them.
    api_keys: list[str] = Field(default_factory=list)
    api_keys_file: Annotated[str | None, Flag("--api-keys-file", up=True)] = Field(
        default=None,
        description=(
            "public API keys, one per line: KEY, sha256:HEX, or NAME<TAB>KEY[<TAB>admin] to"
            " name the key's principal; re-read when it changes"
        ),
    )
    rate_limit: Annotated[float | None, Flag("--rate-limit", up=True)] = Field(
        default=None,
        gt=0,
        description=(
            "requests a second allowed per principal on each server (429 beyond it);"
            " with a Redis store, in the whole mesh"
        ),
    )
    rate_burst: Annotated[float | None, Flag("--rate-burst", up=True)] = Field(
        default=None,
        ge=1,
        description=(
            "requests a principal may make at once before --rate-limit paces it"
            " (default: one second's worth, at least 1)"
        ),
    )
    max_receiving_per_principal: Annotated[int, Flag("--max-receiving-per-principal", up=True)] = (
        Field(
            default=DEFAULT_PER_PRINCIPAL,
            ge=1,
            le=1_000,
            description=(
                "requests of one principal read at once; the others wait unread (their"
                " size is not in memory until they are read and checked against the budgets)"
            ),
        )
    )
    report_page_size: Annotated[int, Flag("--report-page-size")] = Field(
        default=5_000,
        gt=0,
        le=10_000,
        description="sessions per message when telling a restarted router what this server owns",
    )
    ws_port: Annotated[int | None, Flag("--ws-port")] = Field(
        default=None,
        ge=0,
        le=65535,
        description=(
            "serve AReaL's gateway WebSocket protocol (/ws) on this port, for the edge's"
            " /ws route (0: any free port; unset: off)"
        ),
    )
    ws_max_connections: Annotated[int, Flag("--ws-max-connections")] = Field(
        default=1_000,
        ge=1,
        description="WebSockets open at once on this server's /ws before new ones get 503",
    )
    advertise_host: Annotated[str | None, Flag("--advertise-host")] = Field(
        default=None, description="how other members reach this server, if not `host`"
    )
    grace_seconds: Annotated[float, Flag("--grace-seconds")] = Field(
        default=30.0, ge=0, description="how long SIGTERM waits for running turns"
    )
    turn_sweep_seconds: Annotated[float, Flag("--turn-sweep-seconds", up=True)] = Field(
        default=30.0,
        gt=0,
        description=(
            "how often the server settles recorded turns whose server died before"
            " recording their end (failed owner_lost, their webhooks sent); also once at start"
        ),
    )
    webhook_allow: Annotated[str | None, Flag("--webhook-allow", up=True)] = Field(
        default=None,
        description=(
            "comma-separated URL prefixes a turn's webhook_url may start with"
            " (https://hooks.example.com admits its paths on the default port, not"
            " hooks.example.com:6379 nor hooks.example.com.other), for principals whose"
            " API keys file lines name none of their own (webhooks=)"
        ),
    )
    webhook_secret_file: Annotated[str | None, Flag("--webhook-secret-file", up=True)] = Field(
        default=None,
        description=(
            "file holding the webhooks' signing secret, Standard Webhooks' whsec_<base64>,"
            " for principals without their own (webhook-secret=); given, webhooks are on"
            " (required with --webhook-allow)"
        ),
    )
    webhook_max_attempts: Annotated[int, Flag("--webhook-max-attempts", up=True)] = Field(
        default=8, ge=1, le=100, description="attempts to deliver a webhook before it is dropped"
    )
    webhook_timeout_seconds: Annotated[float, Flag("--webhook-timeout-seconds", up=True)] = Field(
        default=10.0,
        gt=0,
        le=300,
        description=(
            "how long one webhook delivery may take; a server that dies delivering one"
            " leaves it to be sent again after three times this"
        ),
    )
    webhook_retry_seconds: Annotated[float, Flag("--webhook-retry-seconds", up=True)] = Field(
        default=1.0,
        gt=0,
        description="wait before a webhook's first retry; doubled each time, at most 10 minutes",
    )

    @model_validator(mode="after")
    def _mesh_limits_need_redis(self) -> ServerConfig:
        """The limits that only Redis keeps for the whole mesh are refused on
        PostgreSQL, not quietly kept per server (``mesh.limits``)."""
        if self.store.startswith(("postgresql://", "postgres://")):
            given = [
                flag
                for flag, value in (
                    ("--rate-limit", self.rate_limit),
                    ("--max-turns-per-principal", self.max_turns_per_principal),
                )
                if value is not None
            ]
            if given:
                raise ValueError(
                    f"{' and '.join(given)}: kept for the whole mesh in Redis only, not yet"
                    " with a PostgreSQL store (use a Redis store, or leave them out)"
                )
        return self
