"""AReaL's gateway WebSocket (``GET /ws``) at the edge: upgrades go to the
session servers' WebSocket listeners (``EdgeConfig.ws_upstreams``, a
cluster of their own: HTTP/1.1, where the servers' gRPC cluster is HTTP/2).

The route bypasses what is for REST: the transcoder, the Lua filter, the
buffer and the key check (ext_authz forwards only ``authorization``, and a
browser's WebSocket cannot set it: the server checks the ``token`` query
parameter itself). No route timeout: the stream idle timeout and the
servers' pings bound a silent socket. A ``/ws`` request that is no upgrade
gets 426; with no WebSocket listeners behind the edge, ``/ws`` is 404."""

from __future__ import annotations

from typing import Any

from turnmesh.envoy import ext_authz
from turnmesh.envoy.edge_config import EdgeConfig
from turnmesh.envoy.outliers import health_check, outlier_detection
from turnmesh.envoy.sockets import address, is_ip, split, upstream_tls

PATH = "/ws"
# Each listener's own health check, answered by it (server/compat/areal_ws/
# gateway.py): 200 while it takes sockets. Envoy asks it directly; no route
# leads there.
HEALTH_PATH = "/ws/ready"
CLUSTER = "session_websockets"
_DISABLED = {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "disabled": True}


def _bypassed() -> dict[str, Any]:
    """typed_per_filter_config for a route none of the REST filters touch."""
    return {
        **ext_authz.skipped(),
        "envoy.filters.http.grpc_json_transcoder": _DISABLED,
        "envoy.filters.http.lua": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.LuaPerRoute",
            "disabled": True,
        },
    }


def routes(config: EdgeConfig) -> list[dict[str, Any]]:
    """The ``/ws`` routes (before any other: first match wins)."""
    if not config.ws_upstreams:
        return []
    upgrade = {"name": "upgrade", "string_match": {"exact": "websocket", "ignore_case": True}}
    get = {"name": ":method", "string_match": {"exact": "GET"}}
    return [
        {
            "match": {"path": PATH, "headers": [get, upgrade]},
            "route": {
                "cluster": CLUSTER,
                "timeout": "0s",
                "upgrade_configs": [{"upgrade_type": "websocket"}],
            },
            "typed_per_filter_config": _bypassed(),
        },
        {
            "match": {"path": PATH},
            "direct_response": {
                "status": 426,
                "body": {
                    "inline_string": f"{PATH} takes a WebSocket: GET with Upgrade: websocket\n"
                },
            },
            "response_headers_to_add": [
                {
                    "header": {"key": "upgrade", "value": "websocket"},
                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                }
            ],
            "typed_per_filter_config": _bypassed(),
        },
    ]


def cluster(config: EdgeConfig) -> dict[str, Any]:
    """The servers' WebSocket listeners: HTTP/1.1, round robin, a listener
    that refuses connections left out at once, one that stops answering its
    health check (frozen, full, stopping) after a few checks."""
    result: dict[str, Any] = {
        "name": CLUSTER,
        "type": "STATIC" if all(is_ip(split(a)[0]) for a in config.ws_upstreams) else "STRICT_DNS",
        "dns_lookup_family": "V4_PREFERRED",
        "connect_timeout": "2s",
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": {
            "cluster_name": CLUSTER,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {"endpoint": {"address": address(*split(a))}} for a in config.ws_upstreams
                    ]
                }
            ],
        },
        "health_checks": [
            health_check(
                config.health_check_interval_ms,
                {"http_health_check": {"path": HEALTH_PATH, "codec_client_type": "HTTP1"}},
            )
        ],
        # No panic routing: with every listener unhealthy, answer 503 at once.
        "common_lb_config": {"healthy_panic_threshold": {"value": 0}},
        "outlier_detection": outlier_detection(),
    }
    if config.upstream_tls is not None:
        # Mutual TLS as to the gRPC port, speaking HTTP/1.1.
        socket = upstream_tls(config.upstream_tls)
        socket["typed_config"]["common_tls_context"]["alpn_protocols"] = ["http/1.1"]
        result["transport_socket"] = socket
    return result
