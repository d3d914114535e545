"""Where Envoy sends calls: the session servers (health-checked, round robin,
mutual TLS when the mesh has it) and, with tracing on, the OTLP collector."""

from __future__ import annotations

from typing import Any

from turnmesh.envoy import ext_authz, ws_route
from turnmesh.envoy.edge_config import EdgeConfig
from turnmesh.envoy.outliers import health_check, outlier_detection
from turnmesh.envoy.sockets import address, is_ip, split, upstream_tls

# The key check (ext_authz) asks the same cluster as the calls go to.
SESSION_SERVERS = ext_authz.CLUSTER
TRACE_COLLECTOR = "opentelemetry_collector"
# Retries in flight: up to this share of the calls in flight, and at least
# this many (a server's death retries everything it held at once).
RETRY_BUDGET_PERCENT = 100.0
MIN_RETRY_CONCURRENCY = 256


def clusters(config: EdgeConfig) -> list[dict[str, Any]]:
    found = [session_servers(config)]
    if config.ws_upstreams:
        found.append(ws_route.cluster(config))
    if config.otlp_endpoint:
        found.append(_collector(config.otlp_endpoint))
    return found


def session_servers(config: EdgeConfig) -> dict[str, Any]:
    cluster = {
        "name": SESSION_SERVERS,
        # Addresses as given; names (a Kubernetes headless Service) are
        # resolved, every address an endpoint, and re-resolved as pods change.
        "type": "STATIC" if all(is_ip(split(a)[0]) for a in config.upstreams) else "STRICT_DNS",
        "dns_lookup_family": "V4_PREFERRED",
        "connect_timeout": "2s",
        "lb_policy": "ROUND_ROBIN",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3"
                ".HttpProtocolOptions",
                "explicit_http_config": {
                    "http2_protocol_options": {
                        # A server that froze (SIGSTOP, a stalled node) or
                        # whose host vanished (no RST, no FIN) is found out
                        # within 2 s: its connections close, reads and key
                        # checks are asked again elsewhere, and the resets
                        # leave it out (outlier detection). gRPC core acks
                        # PINGs on its own threads, so a server whose Python
                        # loop is saturated still answers them: no flapping.
                        "connection_keepalive": {"interval": "1s", "timeout": "1s"}
                    }
                },
            }
        },
        "load_assignment": {
            "cluster_name": SESSION_SERVERS,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {"endpoint": {"address": address(*split(a))}} for a in config.upstreams
                    ]
                }
            ],
        },
        # A draining server answers NOT_SERVING and stops receiving new calls.
        "health_checks": [health_check(config.health_check_interval_ms, {"grpc_health_check": {}})],
        # No panic routing: with every server unhealthy, answer 503 at once.
        "common_lb_config": {"healthy_panic_threshold": {"value": 0}},
        "outlier_detection": outlier_detection(),
        # Retries at once are bounded by a budget, not Envoy's default of 3:
        # when a server dies, every call in flight to it and every key check
        # waiting on it is retried on another server at the same moment.
        "circuit_breakers": {
            "thresholds": [
                {
                    "priority": "DEFAULT",
                    "retry_budget": {
                        "budget_percent": {"value": RETRY_BUDGET_PERCENT},
                        "min_retry_concurrency": MIN_RETRY_CONCURRENCY,
                    },
                }
            ]
        },
    }
    if config.upstream_tls is not None:
        cluster["transport_socket"] = upstream_tls(config.upstream_tls)
    return cluster


# -- tracing ---------------------------------------------------------------------


def tracing() -> dict[str, Any]:
    """The connection manager's tracing: Envoy starts each request's trace (or
    continues the caller's ``traceparent``) and passes its span on to the
    session server."""
    return {
        "provider": {
            "name": "envoy.tracers.opentelemetry",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig",
                "grpc_service": {
                    "envoy_grpc": {"cluster_name": TRACE_COLLECTOR},
                    "timeout": "2s",
                },
                "service_name": "turnmesh-edge",
            },
        }
    }


def tracing_runtime() -> dict[str, Any]:
    """Spans leave every second (Envoy's default is 5 s)."""
    return {
        "layers": [
            {
                "name": "tracing",
                "static_layer": {"tracing.opentelemetry.flush_interval_ms": 1000},
            }
        ]
    }


def _collector(endpoint: str) -> dict[str, Any]:
    host, port = split(endpoint.split("://", 1)[-1].rstrip("/"))
    return {
        "name": TRACE_COLLECTOR,
        "type": "STRICT_DNS",  # an IP or a name (a collector Service)
        "connect_timeout": "2s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3"
                ".HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {
            "cluster_name": TRACE_COLLECTOR,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address(host, port)}}]}],
        },
    }
