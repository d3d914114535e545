"""Prometheus metrics of every component, served on its metrics port.

Labels are outcomes, policies, roles and operation names: never a key, a
session id or message content; principals only when the operator asks
(``--metrics-principal-label``), since tenants can be many.
"""

from __future__ import annotations

import asyncio

from prometheus_client import Counter, Gauge, Histogram, start_http_server

# Session servers.
TURNS = Counter("turnmesh_turns", "Turns that ended, by outcome and policy", ["outcome", "policy"])
# Only with --metrics-principal-label: one series per principal and outcome.
PRINCIPAL_TURNS = Counter(
    "turnmesh_principal_turns",
    "Turns that ended, by principal and outcome",
    ["principal", "outcome"],
)
TURN_SECONDS = Histogram("turnmesh_turn_duration_seconds", "Turn wall time")
FIRST_EVENT_SECONDS = Histogram(
    "turnmesh_time_to_first_event_seconds",
    "From a turn's start to the agent's first event",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
TURNS_IN_FLIGHT = Gauge("turnmesh_turns_in_flight", "Turns running on this server")
ACTIVE_SESSIONS = Gauge("turnmesh_active_sessions", "Sessions held by this server's store")
SESSIONS_AVAILABLE = Gauge(
    "turnmesh_sessions_available",
    "Sessions that can still be created before creates get 429 (mesh-wide on Redis)",
)
WORKER_RETRIES = Counter(
    "turnmesh_worker_retries", "Turns moved to another worker after one failed before answering"
)
STORE_SECONDS = Histogram(
    "turnmesh_store_operation_seconds",
    "Session store latency",
    ["operation"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
)

PENDING_BYTES = Gauge(
    "turnmesh_pending_turn_bytes",
    "Bytes of messages and files held by turns running or waiting on this server",
)
EVENT_LOG_BYTES = Gauge(
    "turnmesh_event_log_bytes",
    "Bytes the finished turns' events kept for resuming hold, packed"
    " (at most --max-event-log-bytes)",
)
REQUESTS_WAITING_TO_BE_READ = Gauge(
    "turnmesh_requests_waiting_to_be_read",
    "Requests whose principal already has its most being read at once; each waits, unread",
)
RATE_LIMIT_FALLBACKS = Counter(
    "turnmesh_rate_limit_fallbacks",
    "Requests this server rate-limited alone because the shared limits (Redis) did not answer",
)
EVENT_LOOP_LAG = Gauge(
    "turnmesh_event_loop_lag_seconds",
    "How late the server's event loop woke a timer, at the last check (work that"
    " holds the loop delays every call on it)",
)

# Workers.
WEBHOOKS = Counter(
    "turnmesh_webhooks",
    "Webhook notices: queued, dropped (outbox full), unqueued (outbox failing: queued again"
    " later), delivered, retried, given_up",
    ["outcome"],
)
WORKER_RUNS = Counter("turnmesh_worker_runs", "Agent runs, by outcome", ["outcome"])
WORKER_RUN_SECONDS = Histogram("turnmesh_worker_run_duration_seconds", "Agent run wall time")
WORKER_RELAY_RESPONSES = Counter(
    "turnmesh_worker_relay_responses", "Responses written on servers' relays (each many events)"
)
WORKER_RELAYED_EVENTS = Counter(
    "turnmesh_worker_relayed_events", "Turn events sent through servers' relays"
)
FILE_QUEUE_SECONDS = Histogram(
    "turnmesh_file_queue_seconds",
    "How long an attached file waited for a reader slot (slots are shared fairly)",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
FILE_QUEUE_DEPTH = Gauge("turnmesh_file_queue_depth", "Attached files waiting for a reader slot")
FILE_QUEUE_REFUSED = Counter(
    "turnmesh_file_queue_refused",
    "Files refused a place in the reader queue, by the bound they hit (turn, principal, worker)",
    ["limit"],
)
WORKER_FILE_TEXT_CACHE = Counter(
    "turnmesh_worker_file_text_cache",
    "Attached files by where their text came from: the worker's cache of texts it read for"
    " the same principal (hit), a read of the same file already running (shared), a reader (miss)",
    ["result"],
)

# Router.
ROUTER_MEMBERS = Gauge("turnmesh_router_members", "Live mesh members", ["role"])


async def watch_loop_lag(interval: float = 0.5) -> None:
    """Set EVENT_LOOP_LAG forever: a timer's lateness, every ``interval``."""
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        await asyncio.sleep(interval)
        EVENT_LOOP_LAG.set(max(0.0, loop.time() - started - interval))


def serve_metrics(host: str, port: int | None) -> str | None:
    """Start the /metrics endpoint (port 0: any free port); its address."""
    if port is None:
        return None
    server, _thread = start_http_server(port, addr=host)
    return f"{'127.0.0.1' if host in ('', '0.0.0.0') else host}:{server.server_port}"
