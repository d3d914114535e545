"""The edge guards as rendered (envoy/guards.py) and as the commands set them;
tests/integration/test_edge_guards.py checks what Envoy does with them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from turnmesh.cli._up_config import load
from turnmesh.cli.edge import edge_config
from turnmesh.cli.main import build_parser
from turnmesh.envoy import EdgeConfig, EdgeGuards, render
from turnmesh.envoy.guards import CODEC_HEADER_KIB, LOCAL_HOSTS, MAX_HEADER_BYTES
from turnmesh.runtime.serving import MAX_METADATA_BYTES, SERVER_OPTIONS

UPSTREAMS = ["127.0.0.1:7100"]
HEAP = "envoy.resource_monitors.fixed_heap"


def _manager(config: EdgeConfig) -> dict[str, Any]:
    listener = render(config)["static_resources"]["listeners"][0]
    manager: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return manager


def _hosts(config: EdgeConfig) -> list[dict[str, Any]]:
    hosts: list[dict[str, Any]] = _manager(config)["route_config"]["virtual_hosts"]
    return hosts


def test_the_per_ip_limit_comes_first_and_keys_on_the_peer_not_its_headers() -> None:
    manager = _manager(EdgeConfig(upstreams=UPSTREAMS, guards=EdgeGuards(rate_limit_per_ip=50)))
    first = manager["http_filters"][0]
    assert first["name"] == "envoy.filters.http.local_ratelimit"
    limit = first["typed_config"]
    assert limit["rate_limits"] == [{"actions": [{"remote_address": {}}]}]
    *exempt, per_ip = limit["descriptors"]
    assert [d["entries"][0]["value"] for d in exempt] == ["127.0.0.1", "::1"]
    assert per_ip["entries"] == [{"key": "remote_address"}]  # one bucket per address
    assert per_ip["token_bucket"] == {
        "max_tokens": 100,
        "tokens_per_fill": 50,
        "fill_interval": "1s",
    }
    assert limit["rate_limited_as_resource_exhausted"] is True
    # A client's own X-Forwarded-For never picks its bucket.
    assert manager["use_remote_address"] is True
    assert manager["xff_num_trusted_hops"] == 0
    off = _manager(EdgeConfig(upstreams=UPSTREAMS, guards=EdgeGuards(rate_limit_per_ip=0)))
    assert all(f["name"] != "envoy.filters.http.local_ratelimit" for f in off["http_filters"])


def test_connections_are_bounded_per_connection_and_overall() -> None:
    config = EdgeConfig(
        upstreams=UPSTREAMS, max_connections=500, guards=EdgeGuards(max_streams_per_connection=7)
    )
    assert _manager(config)["http2_protocol_options"]["max_concurrent_streams"] == 7
    overload = render(config)["overload_manager"]
    monitors = {m["name"]: m["typed_config"] for m in overload["resource_monitors"]}
    connections = monitors["envoy.resource_monitors.global_downstream_max_connections"]
    assert connections["max_active_downstream_connections"] == 500
    assert monitors["envoy.resource_monitors.fixed_heap"]["max_heap_size_bytes"] == 1024 << 20
    triggers = {a["name"]: {t["name"] for t in a["triggers"]} for a in overload["actions"]}
    heap, conns = (
        "envoy.resource_monitors.fixed_heap",
        "envoy.resource_monitors.global_downstream_max_connections",
    )
    assert triggers == {
        "envoy.overload_actions.stop_accepting_requests": {heap},
        "envoy.overload_actions.reset_high_memory_stream": {heap},
        "envoy.overload_actions.disable_http_keepalive": {heap, conns},
        "envoy.overload_actions.reduce_timeouts": {heap, conns},
    }


def test_http1_bodies_are_bounded_by_the_heap_and_freed_memory_goes_back() -> None:
    """Envoy resets only HTTP/2 streams under memory pressure: an HTTP/1
    connection that sends more once the heap is full is answered and closed,
    a little above the level where new requests are refused (so those keep
    their surface's shape until then)."""
    bootstrap = render(EdgeConfig(upstreams=UPSTREAMS))
    overload = bootstrap["overload_manager"]
    (point,) = overload["loadshed_points"]
    assert point["name"] == "envoy.load_shed_points.http1_server_abort_dispatch"
    refused = next(a for a in overload["actions"] if a["name"].endswith("stop_accepting_requests"))
    assert point["triggers"] == [{"name": HEAP, "threshold": {"value": 0.98}}]
    assert refused["triggers"] == [{"name": HEAP, "threshold": {"value": 0.95}}]
    # A body that stopped coming is cut within a minute once the heap is 90 % full.
    reduce = next(a for a in overload["actions"] if a["name"].endswith("reduce_timeouts"))
    heap = next(t for t in reduce["triggers"] if t["name"].endswith("fixed_heap"))
    assert heap["scaled"]["saturation_threshold"] == 0.9
    assert bootstrap["memory_allocator_manager"]["bytes_to_release"] > 0


def test_headers_the_edge_lets_through_fit_what_the_servers_accept() -> None:
    """The path is sent twice (the transcoder's x-envoy-original-path), gRPC
    counts 32 bytes more a header (Envoy takes 100 at most) and Envoy adds a
    few of its own: still under the servers' metadata limit."""
    assert _manager(EdgeConfig(upstreams=UPSTREAMS))["max_request_headers_kb"] == CODEC_HEADER_KIB
    assert MAX_HEADER_BYTES < CODEC_HEADER_KIB * 1024
    assert 2 * CODEC_HEADER_KIB * 1024 + 100 * 32 + 2048 < MAX_METADATA_BYTES
    options = dict(SERVER_OPTIONS)
    assert options["grpc.max_metadata_size"] == MAX_METADATA_BYTES
    assert options["grpc.absolute_max_metadata_size"] == MAX_METADATA_BYTES


def test_overload_replies_take_the_429_row() -> None:
    mappers = _manager(EdgeConfig(upstreams=UPSTREAMS))["local_reply_config"]["mappers"]
    shed = [m for m in mappers if m.get("status_code") == 429]
    assert len(shed) == 4  # A2A JSON-RPC's shape, A2A's, the OpenAI shape and problem+json
    for mapper in shed:
        assert "response.code_details == 'overload'" in str(mapper["filter"])
        assert mapper["headers_to_add"][0]["header"] == {"key": "retry-after", "value": "1"}
    # Nothing else is rewritten to another status.
    assert all("status_code" not in m for m in mappers if m not in shed)


def test_a_keyless_mesh_answers_to_local_names_its_address_and_the_allowed_hosts() -> None:
    keyless = EdgeConfig(upstreams=UPSTREAMS, host="10.0.0.5", guards=EdgeGuards(
        allowed_hosts=("API.example.com:8443", "*.example.org", "[::1]:80")
    ))  # fmt: skip
    mesh, other = _hosts(keyless)
    assert mesh["domains"] == [*LOCAL_HOSTS, "api.example.com", "*.example.org", "10.0.0.5"]
    assert other["domains"] == ["*"]
    health = [r["match"].get("path") for r in other["routes"] if "route" in r]
    assert "/ready" in health and "/health" in health
    for route in other["routes"]:
        # Health needs neither a key nor a body; the check is never served.
        skip = route["typed_per_filter_config"]["envoy.filters.http.ext_authz"]
        assert skip["disabled"] is True, route
    assert other["routes"][0]["direct_response"]["status"] == 404
    assert other["routes"][-1]["direct_response"]["status"] == 421
    # A wildcard bind is no name anyone uses.
    assert "0.0.0.0" not in _hosts(EdgeConfig(upstreams=UPSTREAMS, host="0.0.0.0"))[0]["domains"]


@pytest.mark.parametrize(
    ("api_keys", "hosts", "checked"),
    [
        (False, (), True),
        (True, (), False),  # a keyed mesh answers to any Host by default
        (True, ("api.example.com",), True),
        (False, ("*",), False),
    ],
)
def test_which_meshes_check_the_host(api_keys: bool, hosts: tuple[str, ...], checked: bool) -> None:
    config = EdgeConfig(
        upstreams=UPSTREAMS, api_keys=api_keys, guards=EdgeGuards(allowed_hosts=hosts)
    )
    vhosts = _hosts(config)
    assert (vhosts[0]["domains"] != ["*"]) is checked
    assert len(vhosts) == (2 if checked else 1)


def test_what_is_no_host_name_is_refused() -> None:
    with pytest.raises(ValueError, match="--allowed-host 'evil host' is not a host name"):
        EdgeGuards(allowed_hosts=("evil host",))
    with pytest.raises(ValueError, match="--max-streams-per-connection"):
        EdgeGuards(max_streams_per_connection=0)


def test_a_cross_origin_post_without_json_is_answered_before_its_body_is_read() -> None:
    routes = _hosts(EdgeConfig(upstreams=UPSTREAMS, cors_origins=("https://app.example",)))[0][
        "routes"
    ]
    refused = [r for r in routes if r.get("direct_response", {}).get("status") == 415]
    assert len(refused) == 1
    matchers = {h["name"]: h for h in refused[0]["match"]["headers"]}
    assert matchers[":method"]["string_match"] == {"exact": "POST"}
    assert matchers["content-type"]["invert_match"] is True
    assert matchers["origin"]["string_match"]["safe_regex"]["regex"] == r"^(https://app\.example)$"
    disabled = refused[0]["typed_per_filter_config"]
    assert disabled["envoy.filters.http.buffer"]["disabled"] is True
    assert disabled["envoy.filters.http.grpc_json_transcoder"]["disabled"] is True
    any_origin = _hosts(EdgeConfig(upstreams=UPSTREAMS, cors_origins=("*",)))[0]["routes"]
    assert all(r.get("direct_response", {}).get("status") != 415 for r in any_origin)


def test_turnmesh_edge_flags_set_the_guards() -> None:
    args = build_parser().parse_args(
        ["edge", "--upstream", "127.0.0.1:7100", "--rate-limit-per-ip", "9",
         "--max-streams-per-connection", "3", "--max-connections", "40", "--max-heap-mb", "300",
         "--allowed-host", "a.example", "--allowed-host", "b.example",
         "--trusted-proxy-hops", "1", "--api-keys-required"]
    )  # fmt: skip
    config = edge_config(args)
    assert config.api_keys and config.max_connections == 40
    assert config.guards == EdgeGuards(
        rate_limit_per_ip=9,
        max_streams_per_connection=3,
        max_heap_mb=300,
        allowed_hosts=("a.example", "b.example"),
        trusted_proxy_hops=1,
    )
    defaults = edge_config(build_parser().parse_args(["edge", "--upstream", "127.0.0.1:7100"]))
    assert defaults.guards == EdgeGuards() and not defaults.api_keys


def test_turnmesh_up_takes_the_guards_from_toml_the_environment_and_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toml = tmp_path / "up.toml"
    toml.write_text('rate_limit_per_ip = 5\nallowed_hosts = ["a.example"]\nmax_heap_mb = 512\n')
    monkeypatch.setenv("TURNMESH_ALLOWED_HOSTS", "env.example, other.example")
    assert load(None, {}).allowed_hosts == ["env.example", "other.example"]
    config = load(toml, {"max_heap_mb": 640})
    assert config.edge_guards == EdgeGuards(
        rate_limit_per_ip=5, max_heap_mb=640, allowed_hosts=("a.example",)
    )
    args = build_parser().parse_args(
        ["up", "--allowed-host", "x.example", "--max-connections", "9"]
    )
    assert (args.allowed_hosts, args.max_connections, args.rate_limit_per_ip) == (
        ["x.example"],
        9,
        None,  # unset: the config file or the default decides
    )
