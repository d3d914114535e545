"""The session server's settings: typed objects that own their defaults.

``turnmesh server`` (flags and ``TURNMESH_*`` variables), ``turnmesh up``
and embedding code all read the defaults from here; the descriptions are the
flags' help.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from turnmesh.runtime.config import MemberConfig
from turnmesh.runtime.receipts import DEFAULT_PER_PRINCIPAL
from turnmesh.server.sessions.eventlog import DEFAULT_MAX_BYTES as DEFAULT_EVENT_LOG_BYTES


class SessionLimits(BaseModel):
    """What one server holds and runs at most, and how long it keeps things."""

    model_config = ConfigDict(extra="forbid")

    session_ttl_seconds: float = Field(
        default=1800.0, gt=0, description="seconds a session may be idle before it is deleted"
    )
    event_log_max_events: int = Field(
        default=50_000, gt=0, description="events kept per turn for resuming"
    )
    event_log_max_turns: int = Field(
        default=32, gt=0, description="turns whose events are kept per session"
    )
    event_log_ttl_seconds: float = Field(
        default=600.0, gt=0, description="seconds a finished turn's events are kept for resuming"
    )
    event_log_max_bytes: int = Field(
        default=DEFAULT_EVENT_LOG_BYTES,
        gt=0,
        description=(
            "bytes the finished turns' events may hold on this server, packed; past it the"
            " oldest go first (a resume of them is 404, the history keeps the turn)"
        ),
    )
    turn_record_ttl_seconds: float = Field(
        default=7 * 86_400.0,
        gt=0,
        description=(
            "seconds a background turn's record (GetTurn: its state, times, usage, error)"
            " is kept after it ends, at most 1,000 a session; deleted with its session"
        ),
    )
    pause_timeout_seconds: float = Field(
        default=86_400.0,
        gt=0,
        description=(
            "seconds a turn's wait for the client (its tools' results, approvals, answers)"
            " lasts; after it the next turn tells the agent they went unanswered. A waiting"
            " session is not deleted as idle before its wait ends"
        ),
    )
    keepalive_seconds: float = Field(
        default=15.0, gt=0, description="seconds of silence before a turn stream gets a keepalive"
    )
    max_turns_in_flight: int = Field(
        default=512,
        gt=0,
        description="turns running at once before new ones get RESOURCE_EXHAUSTED (429)",
    )
    max_sessions: int = Field(
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
    max_pending_bytes_per_session: int = Field(
        default=256 * 2**20,
        gt=0,
        description=(
            "bytes of messages and files one session's running and waiting turns may hold"
            " before new turns get 429 (coalesced ones included)"
        ),
    )
    max_pending_bytes_per_principal: int = Field(
        default=512 * 2**20,
        gt=0,
        description=(
            "bytes of messages and files one principal's running and waiting turns may hold"
            " on a server before new ones get 429 TURN_QUOTA_EXCEEDED"
        ),
    )
    max_sessions_per_principal: int | None = Field(
        default=None,
        gt=0,
        description=(
            "sessions one principal may hold before its creates get 429"
            " SESSION_QUOTA_EXCEEDED; with a Redis store, in the whole mesh"
        ),
    )
    max_turns_per_principal: int | None = Field(
        default=None,
        gt=0,
        description=(
            "turns one principal may have running or queued on a server before new"
            " ones get 429 TURN_QUOTA_EXCEEDED; with a Redis store, in the whole mesh"
        ),
    )
    metrics_principal_label: bool = Field(
        default=False,
        description=(
            "label turn metrics with the principal (one series per principal: only"
            " with a bounded number of them)"
        ),
    )


class ServerConfig(MemberConfig, SessionLimits):
    """Settings of one session server process (its limits included)."""

    router_address: str = Field(description="the router, host:port")
    default_agent: str = Field(default="demo", description="the agent of sessions that name none")
    store: str = Field(
        default="memory",
        description="memory, sqlite:PATH, redis://HOST:PORT/DB or redis+cluster://HOST:PORT",
    )
    lease_seconds: float = Field(
        default=6.0,
        gt=0,
        description=(
            "with a shared store: how long a server's hold on its sessions outlasts its"
            " last renewal (a dead server's sessions move after this)"
        ),
    )
    # Public API keys (plain; kept hashed in memory) and/or a file of them.
    api_keys: list[str] = Field(default_factory=list)
    api_keys_file: str | None = Field(
        default=None,
        description=(
            "public API keys, one per line: KEY, sha256:HEX, or NAME<TAB>KEY[<TAB>admin] to"
            " name the key's principal; re-read when it changes"
        ),
    )
    rate_limit: float | None = Field(
        default=None,
        gt=0,
        description=(
            "requests a second allowed per principal on each server (429 beyond it);"
            " with a Redis store, in the whole mesh"
        ),
    )
    rate_burst: float | None = Field(
        default=None,
        ge=1,
        description=(
            "requests a principal may make at once before --rate-limit paces it"
            " (default: one second's worth, at least 1)"
        ),
    )
    max_receiving_per_principal: int = Field(
        default=DEFAULT_PER_PRINCIPAL,
        ge=1,
        le=1_000,
        description=(
            "requests of one principal read at once; the others wait unread (their"
            " size is not in memory until they are read and checked against the budgets)"
        ),
    )
    report_page_size: int = Field(
        default=5_000,
        gt=0,
        le=10_000,
        description="sessions per message when telling a restarted router what this server owns",
    )
    advertise_host: str | None = Field(
        default=None, description="how other members reach this server, if not `host`"
    )
    grace_seconds: float = Field(
        default=30.0, ge=0, description="how long SIGTERM waits for running turns"
    )
    turn_sweep_seconds: float = Field(
        default=30.0,
        gt=0,
        description=(
            "how often the server settles recorded turns whose server died before"
            " recording their end (failed owner_lost, their webhooks sent); also once at start"
        ),
    )
    webhook_allow: str | None = Field(
        default=None,
        description=(
            "comma-separated URL prefixes a turn's webhook_url may start with"
            " (https://hooks.example.com admits its paths on the default port, not"
            " hooks.example.com:6379 nor hooks.example.com.other); unset: no webhooks"
        ),
    )
    webhook_secret_file: str | None = Field(
        default=None,
        description=(
            "file holding the webhooks' signing secret, Standard Webhooks' whsec_<base64>"
            " (required with --webhook-allow)"
        ),
    )
    webhook_max_attempts: int = Field(
        default=8, ge=1, le=100, description="attempts to deliver a webhook before it is dropped"
    )
    webhook_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description=(
            "how long one webhook delivery may take; a server that dies delivering one"
            " leaves it to be sent again after three times this"
        ),
    )
    webhook_retry_seconds: float = Field(
        default=1.0,
        gt=0,
        description="wait before a webhook's first retry; doubled each time, at most 10 minutes",
    )
