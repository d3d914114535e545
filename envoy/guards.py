"""What one client, one connection and the whole edge may hold: the Envoy
fragments ``config.render`` puts into the bootstrap.

- Per client IP: a token bucket of requests (``local_ratelimit`` with one
  dynamic descriptor per ``remote_address``), answered 429 with Retry-After.
  Envoy 1.40 cannot count connections per IP (``connection_limit`` and the
  network ``local_ratelimit`` count per listener), so connections are bounded
  per connection (concurrent HTTP/2 streams, flow-control windows, the
  listener's buffer limit) and overall (``max_connections``).
- Overall: the overload manager sheds requests with 429 before the heap is at
  risk (never 503: a saturated edge must not look down), resets the HTTP/2
  streams holding the most buffers, answers and closes HTTP/1 connections
  still sending once the heap is full (bodies that never finish), and near the
  connection cap closes connections after each response and shortens idle
  timeouts, so idle connections cannot lock everyone else out for long.
- Browsers: a Host allow-list against DNS rebinding (421 for other names;
  health stays open to any), and a cross-origin POST that skipped CORS
  preflight (any body but JSON) is refused with 415.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from turnmesh.envoy import ext_authz
from turnmesh.envoy.edge_config import EdgeConfig, host_name
from turnmesh.v1 import compat_service_pb2, session_service_pb2

# Peers never limited per IP: a proxy or a benchmark on this machine speaks
# for many clients at once.
LOOPBACK_PEERS = ("127.0.0.1", "::1")
# Distinct client IPs with a bucket of their own; past it the least recently
# seen one starts over with a full bucket (Envoy's default is 20).
TRACKED_CLIENT_IPS = 100_000
RETRY_AFTER_SECONDS = 1
# Envoy answers overload with 503; the edge says 429 instead.
SHED_STATUS = 429
SHED_DETAIL = f"too many requests at the edge: retry after {RETRY_AFTER_SECONDS} s"
# Near the connection cap, an idle connection is closed after this long
# (scaled down from the configured idle timeout, never below).
PRESSED_IDLE_TIMEOUT = "10s"
# A stream silent this long (half-sent headers too) is cut under pressure; a
# turn's stream is never that silent (the servers' keepalive is every 15 s).
PRESSED_STREAM_IDLE_TIMEOUT = "60s"
# A request's headers (gRPC's count: names, values and 32 bytes a header; the
# request line included): past it 431, in each surface's shape (problem.lua).
# The transcoder copies the path into x-envoy-original-path and Envoy adds
# a few headers of its own (under 2 KiB), so what reaches a server stays
# under twice this plus 2 KiB, well within what the servers accept.
MAX_HEADER_BYTES = 16 * 1024
# Envoy's own limit, a backstop past the one above (names and values, the
# request line included; at most 100 headers): even with the path counted
# twice and gRPC's 32 bytes a header, under the servers' metadata limit.
CODEC_HEADER_KIB = 24
# Shares of --max-heap-mb: new requests are refused (429) from REFUSE_AT, and
# HTTP/1 connections still sending are answered 429 and closed from
# ABORT_HTTP1_AT (the heap then grows by at most what arrives in one refresh).
REFUSE_AT = 0.95
ABORT_HTTP1_AT = 0.98
# Free heap memory returned to the system a second, at most.
RELEASE_BYTES_PER_SECOND = 128 * 1024 * 1024

# The names any keyless edge answers to (ports are stripped before matching).
LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")
# Open to any Host: load balancers and Kubernetes probe by address. The
# transcoder turns GET /health into the RPC's path and routes again.
_SESSIONS = session_service_pb2.DESCRIPTOR.services_by_name["SessionService"].full_name
_COMPAT = compat_service_pb2.DESCRIPTOR.services_by_name["CompatService"].full_name
REST_HEALTH_PATHS = ("/health", "/ready", "/v1/chat/health", "/health/agent")
HEALTH_PATHS = (
    *REST_HEALTH_PATHS,
    f"/{_SESSIONS}/GetHealth",
    f"/{_SESSIONS}/GetReadiness",
    f"/{_COMPAT}/GetChatHealth",
)
GRPC_HEALTH_PREFIX = "/grpc.health.v1.Health/"
# Bodies a browser sends cross-origin only after a CORS preflight: JSON, and
# gRPC (also what the transcoder turns JSON into before routing again).
PREFLIGHTED_CONTENT_TYPE = r"(?i)^\s*application/(grpc|([a-z0-9.!#$&^_-]+\+)?json)\s*([;+].*)?$"


# -- per client IP and per connection ------------------------------------------


def _bucket(tokens_per_second: int, burst: int) -> dict[str, Any]:
    return {"max_tokens": burst, "tokens_per_fill": tokens_per_second, "fill_interval": "1s"}


def _percent(value: int) -> dict[str, Any]:
    return {"numerator": value, "denominator": "HUNDRED"}


def http_filters(config: EdgeConfig) -> list[dict[str, Any]]:
    """The per-IP rate limit, first: a refused request costs nothing more."""
    rate = config.guards.rate_limit_per_ip
    if rate <= 0:
        return []
    unlimited = 1_000_000_000
    exempt = [
        {
            "entries": [{"key": "remote_address", "value": peer}],
            "token_bucket": _bucket(unlimited, unlimited),
        }
        for peer in LOOPBACK_PEERS
    ]
    return [
        {
            "name": "envoy.filters.http.local_ratelimit",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3"
                ".LocalRateLimit",
                "stat_prefix": "per_client_ip",
                # Only the per-IP buckets count: the filter's own is never empty.
                "token_bucket": _bucket(unlimited, unlimited),
                "always_consume_default_token_bucket": False,
                # Runtime keys: an operator may turn it off without a restart.
                "filter_enabled": {
                    "runtime_key": "turnmesh.rate_limit_per_ip_enabled",
                    "default_value": _percent(100),
                },
                "filter_enforced": {
                    "runtime_key": "turnmesh.rate_limit_per_ip_enforced",
                    "default_value": _percent(100),
                },
                "rate_limits": [{"actions": [{"remote_address": {}}]}],
                # An empty value: one bucket per address seen (first match wins).
                "descriptors": [
                    *exempt,
                    {
                        "entries": [{"key": "remote_address"}],
                        "token_bucket": _bucket(rate, 2 * rate),
                    },
                ],
                "max_dynamic_descriptors": TRACKED_CLIENT_IPS,
                # REST callers get it from the 429 local-reply mapper; this one
                # reaches gRPC callers, as trailing metadata.
                "response_headers_to_add": [_retry_after()],
                # gRPC callers get the code a server's own limit gives.
                "rate_limited_as_resource_exhausted": True,
            },
        }
    ]


def connection_manager(config: EdgeConfig) -> dict[str, Any]:
    """Keys for the HTTP connection manager."""
    return {
        # Past this Envoy answers 431 before it knows the path (problem+json
        # whatever the surface); problem.lua answers past MAX_HEADER_BYTES in
        # each surface's shape.
        "max_request_headers_kb": CODEC_HEADER_KIB,
        # The client is the peer (or what trusted proxies say it is): a
        # client's own X-Forwarded-For must not pick its rate-limit bucket.
        "use_remote_address": True,
        "xff_num_trusted_hops": config.guards.trusted_proxy_hops,
        # Host names match without their port (the allow-list below).
        "strip_any_host_port": True,
        "http2_protocol_options": {
            "max_concurrent_streams": config.guards.max_streams_per_connection,
            # What a peer may send before Envoy reads it: per stream and per
            # connection, in line with the listener's 1 MiB buffer limit.
            "initial_stream_window_size": 1024 * 1024,
            "initial_connection_window_size": 4 * 1024 * 1024,
        },
    }


# -- overall: the overload manager ---------------------------------------------

HEAP = "envoy.resource_monitors.fixed_heap"
CONNECTIONS = "envoy.resource_monitors.global_downstream_max_connections"


def _threshold(monitor: str, value: float) -> dict[str, Any]:
    return {"name": monitor, "threshold": {"value": value}}


def _scaled(monitor: str, start: float, full: float) -> dict[str, Any]:
    return {"name": monitor, "scaled": {"scaling_threshold": start, "saturation_threshold": full}}


def overload_manager(config: EdgeConfig) -> dict[str, Any]:
    return {
        # What arrives between two refreshes is how far past a threshold the
        # heap can get before Envoy acts.
        "refresh_interval": "0.1s",
        "resource_monitors": [
            {
                "name": HEAP,
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.resource_monitors.fixed_heap"
                    ".v3.FixedHeapConfig",
                    "max_heap_size_bytes": config.guards.max_heap_mb * 1024 * 1024,
                },
            },
            {
                "name": CONNECTIONS,
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.resource_monitors"
                    ".downstream_connections.v3.DownstreamConnectionsConfig",
                    "max_active_downstream_connections": config.max_connections,
                },
            },
        ],
        "actions": [
            # New requests get 429 (Envoy's 503 "overload", mapped below).
            {
                "name": "envoy.overload_actions.stop_accepting_requests",
                "triggers": [_threshold(HEAP, REFUSE_AT)],
            },
            # The streams holding the most buffered bytes are reset first.
            {
                "name": "envoy.overload_actions.reset_high_memory_stream",
                "triggers": [_scaled(HEAP, 0.85, 0.95)],
            },
            # Connections close after their response: clients come back to a
            # fresh accept, and held connections cannot pile up.
            {
                "name": "envoy.overload_actions.disable_http_keepalive",
                "triggers": [_threshold(HEAP, 0.9), _threshold(CONNECTIONS, 0.9)],
            },
            # Idle connections and silent streams (slow headers, bodies that
            # stopped coming) are cut sooner; with the heap 90 % full, within
            # a minute: before stalled uploads can hold it past 95 % for long.
            {
                "name": "envoy.overload_actions.reduce_timeouts",
                "triggers": [_scaled(CONNECTIONS, 0.8, 0.95), _scaled(HEAP, 0.8, 0.9)],
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.config.overload.v3"
                    ".ScaleTimersOverloadActionConfig",
                    "timer_scale_factors": [
                        {
                            "timer": "HTTP_DOWNSTREAM_CONNECTION_IDLE",
                            "min_timeout": PRESSED_IDLE_TIMEOUT,
                        },
                        {
                            "timer": "HTTP_DOWNSTREAM_STREAM_IDLE",
                            "min_timeout": PRESSED_STREAM_IDLE_TIMEOUT,
                        },
                    ],
                },
            },
        ],
        "loadshed_points": [
            # HTTP/1 has no stream reset under memory pressure (Envoy resets
            # only HTTP/2 streams): a connection that sends more while the
            # heap is full is answered 429 and closed, its buffers freed.
            # Above where new requests are refused: this answer comes before
            # the path is read, so it cannot take an OpenAI path's shape.
            {
                "name": "envoy.load_shed_points.http1_server_abort_dispatch",
                "triggers": [_threshold(HEAP, ABORT_HTTP1_AT)],
            },
        ],
        # Streams buffering 1 MiB or more are tracked for reset_high_memory_stream.
        "buffer_factory_config": {"minimum_account_to_track_power_of_two": 20},
    }


def memory_allocator_manager() -> dict[str, Any]:
    """Free heap pages go back to the system (tcmalloc keeps them otherwise:
    Envoy's resident memory would stay at its peak after a burst)."""
    return {"bytes_to_release": RELEASE_BYTES_PER_SECOND, "memory_release_interval": "1s"}


def _retry_after() -> dict[str, Any]:
    return {
        "header": {"key": "retry-after", "value": str(RETRY_AFTER_SECONDS)},
        "append_action": "ADD_IF_ABSENT",
    }


def or_shed(status_filter: dict[str, Any], code: int) -> dict[str, Any]:
    """The local-reply filter for ``code``, widened for 429 to Envoy's
    overload replies (503; they carry no response flag, only their details)."""
    if code != SHED_STATUS:
        return status_filter
    overloaded = {
        "extension_filter": {
            "name": "envoy.access_loggers.extension_filters.cel",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3"
                ".ExpressionFilter",
                "expression": "response.code_details == 'overload'",
            },
        }
    }
    return {"or_filter": {"filters": [status_filter, overloaded]}}


def shed(mapper: dict[str, Any], code: int) -> dict[str, Any]:
    """The local-reply mapper for ``code``; for 429, it answers overload
    replies as 429 and tells the client when to come back."""
    if code != SHED_STATUS:
        return mapper
    return {
        **mapper,
        "status_code": SHED_STATUS,
        "headers_to_add": [_retry_after()],
        "body": {"inline_string": SHED_DETAIL},
    }


# -- browsers: Host allow-list and cross-origin bodies -------------------------


def _checks_hosts(config: EdgeConfig) -> bool:
    hosts = config.guards.allowed_hosts
    if "*" in hosts:
        return False
    return bool(hosts) or not config.api_keys


def allowed_domains(config: EdgeConfig) -> list[str]:
    """The API's virtual host domains: every name, or the allowed ones."""
    if not _checks_hosts(config):
        return ["*"]
    names = [*LOCAL_HOSTS, *config.guards.allowed_hosts]
    if not _is_unspecified(config.host):  # 0.0.0.0 is no name a client uses
        names.append(config.host)
    return list(dict.fromkeys(host_name(n) for n in names))


def _is_unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def _no_body_filters() -> dict[str, Any]:
    """Per-route: answer at once, before the key check or the buffer filter
    reads a body."""
    return {
        **ext_authz.skipped(),
        "envoy.filters.http.buffer": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.BufferPerRoute",
            "disabled": True,
        },
        "envoy.filters.http.grpc_json_transcoder": {
            "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig",
            "disabled": True,
        },
    }


def foreign_hosts(
    config: EdgeConfig, route: dict[str, Any], internal_headers: tuple[str, ...]
) -> list[dict[str, Any]]:
    """Requests naming any other Host: health checks pass (``route``), the
    rest get 421. 421 Misdirected Request, not 403: the name is not served
    here at all, and 403 already means a key that may not do something."""
    if not _checks_hosts(config):
        return []
    # Health never depends on keys (nor on the Host).
    # REST health is a GET; what the transcoder made of it routes again as
    # gRPC (the RPC paths). Neither may carry a body to buffer.
    get = {"name": ":method", "string_match": {"exact": "GET"}}
    health = [
        {
            "match": {
                "path": path,
                "headers": [get if path in REST_HEALTH_PATHS else ext_authz.grpc_content_type()],
            },
            "route": route,
            "typed_per_filter_config": (
                ext_authz.bodiless() if path in REST_HEALTH_PATHS else ext_authz.skipped()
            ),
        }
        for path in HEALTH_PATHS
    ]
    grpc_health = {
        "match": {"prefix": GRPC_HEALTH_PREFIX, "headers": [ext_authz.grpc_content_type()]},
        "route": route,
        "typed_per_filter_config": ext_authz.skipped(),
    }
    refused = {
        "match": {"prefix": "/"},
        "direct_response": {
            "status": 421,
            "body": {
                "inline_string": "this server does not answer to that Host; an operator "
                "allows a name with --allowed-host"
            },
        },
        "typed_per_filter_config": _no_body_filters(),
    }
    return [
        {
            "name": "other-hosts",
            "domains": ["*"],
            "request_headers_to_remove": list(internal_headers),
            "routes": [ext_authz.check_refused(), *health, grpc_health, refused],
        }
    ]


def cross_origin_routes(config: EdgeConfig) -> list[dict[str, Any]]:
    """A POST from an origin CORS does not allow, with a body that is not
    JSON (text/plain, a form, none: what a browser sends without a
    preflight), gets 415 before anything reads it. Requests with no Origin
    (curl, SDKs) and the playground (same origin, JSON) are unaffected. A
    route, not Lua: a Lua error fails open, a matcher cannot."""
    origins = config.cors_origins
    if "*" in origins:
        return []
    headers: list[dict[str, Any]] = [
        {"name": ":method", "string_match": {"exact": "POST"}},
        {"name": "origin", "present_match": True},
        {
            "name": "content-type",
            "string_match": {"safe_regex": {"regex": PREFLIGHTED_CONTENT_TYPE}},
            "invert_match": True,
            "treat_missing_header_as_empty": True,
        },
    ]
    if origins:
        allowed = "|".join(re.escape(o.rstrip("/")) for o in origins)
        headers.append(
            {
                "name": "origin",
                "string_match": {"safe_regex": {"regex": f"^({allowed})$"}},
                "invert_match": True,
            }
        )
    return [
        {
            "match": {"prefix": "/", "headers": headers},
            "direct_response": {
                "status": 415,
                "body": {
                    "inline_string": "a cross-origin request must send Content-Type: "
                    "application/json (the origin is not allowed by CORS)"
                },
            },
            "typed_per_filter_config": _no_body_filters(),
        }
    ]
