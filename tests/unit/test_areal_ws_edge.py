"""The edge's /ws routes and cluster (envoy/ws_route.py), as rendered."""

from __future__ import annotations

import http
from typing import Any

from turnmesh.envoy import EdgeConfig, ws_route
from turnmesh.envoy.config import ACCESS_LOG_FORMAT, render
from turnmesh.server.compat.areal_ws import gateway


def _routes(config: EdgeConfig) -> list[dict[str, Any]]:
    manager = render(config)["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    routes: list[dict[str, Any]] = manager["typed_config"]["route_config"]["virtual_hosts"][0][
        "routes"
    ]
    return routes


def test_ws_upgrades_go_to_the_servers_websocket_listeners_past_the_rest_filters() -> None:
    config = EdgeConfig(upstreams=["127.0.0.1:1"], ws_upstreams=["127.0.0.1:2"])
    upgrade, plain = (r for r in _routes(config) if r["match"].get("path") == "/ws")
    assert upgrade["route"]["cluster"] == "session_websockets"
    assert upgrade["route"]["upgrade_configs"] == [{"upgrade_type": "websocket"}]
    assert upgrade["route"]["timeout"] == "0s"
    bypassed = upgrade["typed_per_filter_config"]
    for name in (
        "envoy.filters.http.grpc_json_transcoder",
        "envoy.filters.http.lua",
        "envoy.filters.http.buffer",
        "envoy.filters.http.ext_authz",
    ):
        assert bypassed[name]["disabled"] is True, name
    assert plain["direct_response"]["status"] == 426
    clusters = {c["name"]: c for c in render(config)["static_resources"]["clusters"]}
    ws = clusters["session_websockets"]
    # HTTP/1.1 (no explicit HTTP/2 options, unlike the gRPC cluster).
    assert "typed_extension_protocol_options" not in ws
    endpoint = ws["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"]["port_value"] == 2
    # Health-checked on the listener's own path (a frozen, full or draining
    # server is left out), with no panic routing, as the gRPC cluster is.
    (check,) = ws["health_checks"]
    assert check["http_health_check"] == {"path": gateway.HEALTH_PATH, "codec_client_type": "HTTP1"}
    assert ws_route.HEALTH_PATH == gateway.HEALTH_PATH
    assert ws["common_lb_config"] == {"healthy_panic_threshold": {"value": 0}}
    grpc_check = clusters["session_servers"]["health_checks"][0]
    assert {k: v for k, v in check.items() if k != "http_health_check"} == {
        k: v for k, v in grpc_check.items() if k != "grpc_health_check"
    }


def test_without_websocket_listeners_there_is_no_ws_route() -> None:
    config = EdgeConfig(upstreams=["127.0.0.1:1"])
    assert not [r for r in _routes(config) if r["match"].get("path") == "/ws"]
    assert "session_websockets" not in {
        c["name"] for c in render(config)["static_resources"]["clusters"]
    }


def test_the_access_log_prints_paths_without_their_query() -> None:
    assert "%PATH(NQ)%" in ACCESS_LOG_FORMAT
    assert "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%" not in ACCESS_LOG_FORMAT


def test_a_listener_is_healthy_only_while_it_takes_sockets() -> None:
    assert gateway.health(True, 0, 2)[0] == http.HTTPStatus.OK
    assert gateway.health(True, 1, 2)[0] == http.HTTPStatus.OK
    assert gateway.health(True, 2, 2) == (http.HTTPStatus.SERVICE_UNAVAILABLE, "full\n")
    # Starting or draining: no new sockets, whatever the room.
    assert gateway.health(False, 0, 2) == (http.HTTPStatus.SERVICE_UNAVAILABLE, "not ready\n")
