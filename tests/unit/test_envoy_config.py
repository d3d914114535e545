"""Every rendered Envoy config variant passes `envoy --mode validate`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from turnmesh.envoy import EdgeConfig, EdgeGuards, render
from turnmesh.envoy.config import AGENT_CARD_REST, MAX_REQUEST_BODY_BYTES, READ_PATHS
from turnmesh.envoy.ext_authz import BODILESS_BYTES, GRPC_CONTENT_TYPE
from turnmesh.envoy.process import EnvoyError, validate, write_config
from turnmesh.envoy.timeouts import EdgeTimeouts

VARIANTS = {
    "one-server": EdgeConfig(upstreams=["127.0.0.1:7100"]),
    "three-servers": EdgeConfig(
        upstreams=["127.0.0.1:7100", "127.0.0.1:7101", "127.0.0.1:7102"], port=9090
    ),
    "exposed": EdgeConfig(upstreams=["10.0.0.5:7100"], host="0.0.0.0", port=8080),
    "ephemeral-ports": EdgeConfig(upstreams=["[::1]:7100"], port=0, admin_port=0),
    "dns-upstream": EdgeConfig(upstreams=["turnmesh-server-headless:7100"], host="0.0.0.0"),
    "traced-ip": EdgeConfig(upstreams=["127.0.0.1:7100"], otlp_endpoint="http://127.0.0.1:4317"),
    "traced-name": EdgeConfig(upstreams=["127.0.0.1:7100"], otlp_endpoint="otel-collector:4317"),
    "any-origin": EdgeConfig(upstreams=["127.0.0.1:7100"], cors_origins=("*",)),
    "guarded-keyless": EdgeConfig(
        upstreams=["127.0.0.1:7100"],
        host="10.0.0.5",
        cors_origins=("https://a.example", "https://b.example"),
        guards=EdgeGuards(allowed_hosts=("api.example.com", "*.example.org", "[::1]:80")),
    ),
    "guarded-keyed": EdgeConfig(
        upstreams=["127.0.0.1:7100"],
        api_keys=True,
        cors_origins=("*",),
        guards=EdgeGuards(rate_limit_per_ip=0, trusted_proxy_hops=2, max_heap_mb=64),
    ),
    "keyless": EdgeConfig(upstreams=["127.0.0.1:7100"], api_keys=False),
    "short-timeouts": EdgeConfig(
        upstreams=["127.0.0.1:7100"],
        timeouts=EdgeTimeouts(request_headers=0.5, request=1.5, stream_idle=2, connection_idle=3),
    ),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_rendered_config_validates(name: str, tmp_path: Path) -> None:
    validate(write_config(VARIANTS[name], tmp_path / "envoy.json"))


def test_a_broken_config_is_reported(tmp_path: Path) -> None:
    config = EdgeConfig(upstreams=["127.0.0.1:7100"], descriptor_set=tmp_path / "missing.binpb")
    with pytest.raises(EnvoyError, match="invalid Envoy config"):
        validate(write_config(config, tmp_path / "envoy.json"))


def test_streams_are_never_cut_and_admin_is_loopback() -> None:
    config = render(EdgeConfig(upstreams=["127.0.0.1:7100"], host="0.0.0.0"))
    assert config["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
    listener = config["static_resources"]["listeners"][0]
    assert listener["address"]["socket_address"]["address"] == "0.0.0.0"
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    assert manager["codec_type"] == "AUTO"
    host = manager["route_config"]["virtual_hosts"][0]
    # Every mesh-internal header a server trusts is stripped from outside calls.
    assert set(host["request_headers_to_remove"]) == {
        "x-turnmesh-forwarded",
        "x-turnmesh-mesh-key",
        "x-turnmesh-internal",
        "x-turnmesh-unreachable",
        "x-turnmesh-principal",
    }
    routes = host["routes"]
    assert "direct_response" in routes[0]  # the playground page
    forwarded = [r for r in routes if "route" in r]  # the rest answer at the edge
    # The reads by their gRPC path, native gRPC, /health, /ready and
    # /v1/chat/health and /health/agent (no key check), A2A's agent cards (no key check
    # either), simple chat's multipart forms (a transcoder of their own), the
    # REST event streams (EventStreamService), simple chat's stream (set
    # fields only), and the rest.
    assert len(forwarded) == 10 + len(READ_PATHS)
    for route in forwarded:
        assert route["route"]["timeout"] == "0s"
    transcoder = next(
        f for f in manager["http_filters"] if f["name"].endswith("grpc_json_transcoder")
    )["typed_config"]
    assert transcoder["print_options"]["stream_sse_style_delimited"] is True
    # Unary answers print zero fields; streamed events only what they set.
    assert transcoder["print_options"]["always_print_primitive_fields"] is True
    upload, events, streamed = [
        r
        for r in forwarded
        if "safe_regex" in r["match"]
        and "envoy.filters.http.grpc_json_transcoder" in r.get("typed_per_filter_config", {})
    ]
    # Multipart chat requests (by content type) reach ChatUploadService only.
    (content_type,) = upload["match"]["headers"]
    assert "multipart/form-data" in content_type["string_match"]["safe_regex"]["regex"]
    upload_options = upload["typed_per_filter_config"]["envoy.filters.http.grpc_json_transcoder"]
    assert upload_options["services"] == ["turnmesh.v1.ChatUploadService"]
    assert "turnmesh.v1.ChatUploadService" not in transcoder["services"]
    # The REST event streams reach EventStreamService only, and only there.
    event_options = events["typed_per_filter_config"]["envoy.filters.http.grpc_json_transcoder"]
    assert event_options["services"] == ["turnmesh.v1.EventStreamService"]
    assert "turnmesh.v1.EventStreamService" not in transcoder["services"]
    options = streamed["typed_per_filter_config"]["envoy.filters.http.grpc_json_transcoder"]
    assert options["print_options"]["always_print_primitive_fields"] is False
    assert options["print_options"]["stream_sse_style_delimited"] is True
    assert transcoder["request_validation_options"] == {
        "reject_unknown_method": True,
        "reject_unknown_query_parameters": True,
    }


def test_tls_on_the_listener_and_to_the_servers(tmp_path: Path) -> None:
    from turnmesh.runtime.tls import TlsFiles

    files = TlsFiles(ca_file=tmp_path / "ca.pem", cert_file=tmp_path / "c", key_file=tmp_path / "k")
    config = render(
        EdgeConfig(
            upstreams=["127.0.0.1:7100"],
            listener_tls=(tmp_path / "edge.crt", tmp_path / "edge.key"),
            upstream_tls=files,
        )
    )
    listener = config["static_resources"]["listeners"][0]["filter_chains"][0]
    assert listener["transport_socket_connect_timeout"] == "10.000s"
    downstream = listener["transport_socket"]["typed_config"]["common_tls_context"]
    assert downstream["tls_certificates"][0]["certificate_chain"]["filename"].endswith("edge.crt")
    assert downstream["alpn_protocols"] == ["h2", "http/1.1"]
    cluster = config["static_resources"]["clusters"][0]
    upstream = cluster["transport_socket"]["typed_config"]["common_tls_context"]
    assert upstream["validation_context"]["trusted_ca"]["filename"] == str(files.ca_file)
    assert upstream["alpn_protocols"] == ["h2"]
    # Without TLS settings there is no transport socket at all.
    plain = render(EdgeConfig(upstreams=["127.0.0.1:7100"]))
    assert "transport_socket" not in plain["static_resources"]["clusters"][0]


def test_names_are_resolved_and_addresses_are_static() -> None:
    static = render(EdgeConfig(upstreams=["10.0.0.5:7100", "[::1]:7100"]))
    assert static["static_resources"]["clusters"][0]["type"] == "STATIC"
    named = render(EdgeConfig(upstreams=["turnmesh-server-headless:7100"]))
    assert named["static_resources"]["clusters"][0]["type"] == "STRICT_DNS"


def _manager(config: EdgeConfig) -> dict[str, Any]:
    listener = render(config)["static_resources"]["listeners"][0]
    manager: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return manager


def test_the_key_is_checked_on_headers_before_any_body_is_buffered() -> None:
    manager = _manager(EdgeConfig(upstreams=["127.0.0.1:7100"]))
    names = [f["name"].removeprefix("envoy.filters.http.") for f in manager["http_filters"]]
    assert names == [
        "local_ratelimit",
        "cors",
        "lua",
        "ext_authz",
        "buffer",
        "grpc_json_transcoder",
        "router",
    ]
    check = manager["http_filters"][3]["typed_config"]
    assert check["failure_mode_allow"] is False
    assert "with_request_body" not in check  # headers only: no body is read for it
    service = check["grpc_service"]
    # The servers' cluster, so its health checks and mutual TLS apply.
    assert service["envoy_grpc"]["cluster_name"] == "session_servers"
    assert service["timeout"] == "5.000s"
    assert check["allowed_headers"] == {"patterns": [{"exact": "authorization"}]}
    # Skipped by native gRPC (the servers check it; Envoy buffers no gRPC),
    # health, readiness, A2A's agent cards and the playground, and by nothing else that reaches
    # a server (refusals at the edge, such as cross-origin bodies, answer first).
    host = manager["route_config"]["virtual_hosts"][0]
    skipping = [
        r["match"]
        for r in host["routes"]
        if "envoy.filters.http.ext_authz" in r.get("typed_per_filter_config", {})
        and ("route" in r or r["match"].get("path") == "/")
    ]
    get = [{"name": ":method", "string_match": {"exact": "GET"}}]
    grpc = [{"name": "content-type", "string_match": {"safe_regex": {"regex": GRPC_CONTENT_TYPE}}}]
    assert skipping == [
        {"path": "/", "headers": get},
        *({"path": path, "headers": grpc} for path in READ_PATHS),
        {"prefix": "/", "headers": grpc},
        {"path": "/health", "headers": get},
        {"path": "/ready", "headers": get},
        {"path": "/v1/chat/health", "headers": get},
        {"path": "/health/agent", "headers": get},
        {"safe_regex": {"regex": AGENT_CARD_REST}, "headers": get},
    ]
    # Envoy's gRPC is application/grpc or application/grpc+NAME: grpc-web
    # is transcoded (and buffered) as REST, so it is checked as REST.
    assert re.match(GRPC_CONTENT_TYPE, "application/grpc")
    assert re.match(GRPC_CONTENT_TYPE, "application/grpc+proto")
    for other in ("application/grpc-web", "application/grpcx", "application/grpc; x"):
        assert not re.match(GRPC_CONTENT_TYPE, other)
    # Routes that need no key take no body beyond a few KiB.
    for route in host["routes"]:
        if route["match"].get("path") in ("/", "/health", "/ready"):
            limit = route["typed_per_filter_config"]["envoy.filters.http.buffer"]
            assert limit["buffer"]["max_request_bytes"] == BODILESS_BYTES
    assert host["routes"][-1] == {"match": {"prefix": "/"}, "route": host["routes"][-1]["route"]}
    # Its denials read as the servers' own 401s (the first mappers after those
    # of A2A's JSON-RPC endpoints, which answer every reply there as JSON-RPC).
    mappers = manager["local_reply_config"]["mappers"]
    jsonrpc = ["jsonrpc" in m["body_format_override"]["json_format"] for m in mappers]
    rest = mappers[jsonrpc.index(False) :]
    assert not any(jsonrpc[jsonrpc.index(False) :])
    flags = [m["filter"]["and_filter"]["filters"][0] for m in rest[:4]]
    assert flags == [{"response_flag_filter": {"flags": ["UAEX"]}}] * 4
    assert "principal=%DYNAMIC_METADATA(envoy.filters.http.ext_authz:principal)%" in str(manager)


def test_a_mesh_without_keys_has_no_check() -> None:
    manager = _manager(EdgeConfig(upstreams=["127.0.0.1:7100"], api_keys=False))
    assert "envoy.filters.http.ext_authz" not in [f["name"] for f in manager["http_filters"]]


def test_slow_clients_are_bounded() -> None:
    manager = _manager(EdgeConfig(upstreams=["127.0.0.1:7100"]))
    assert manager["request_headers_timeout"] == "10.000s"
    assert manager["request_timeout"] == "300.000s"
    assert manager["stream_idle_timeout"] == "3600.000s"
    assert manager["common_http_protocol_options"] == {"idle_timeout": "60.000s"}
    transcoder = next(
        f for f in manager["http_filters"] if f["name"].endswith("grpc_json_transcoder")
    )["typed_config"]
    assert transcoder["max_request_body_size"] == MAX_REQUEST_BODY_BYTES
    short = _manager(
        EdgeConfig(upstreams=["127.0.0.1:7100"], timeouts=EdgeTimeouts(request_headers=0.5))
    )
    assert short["request_headers_timeout"] == "0.500s"


def test_turnmesh_edge_sets_the_check_and_the_timeouts() -> None:
    from turnmesh.cli.edge import edge_config
    from turnmesh.cli.main import build_parser

    args = build_parser().parse_args(["edge", "--upstream", "127.0.0.1:7100"])
    assert edge_config(args).api_keys is None  # not known: checks keys and Host names
    assert edge_config(args).authenticate is True
    assert edge_config(args).timeouts == EdgeTimeouts()
    args = build_parser().parse_args(
        ["edge", "--upstream", "127.0.0.1:7100", "--api-keys-required"]
    )
    assert edge_config(args).api_keys is True and edge_config(args).authenticate is True
    with pytest.raises(SystemExit):
        build_parser().parse_args(["edge", "--api-keys-required", "--no-key-check"])
    args = build_parser().parse_args(
        ["edge", "--upstream", "127.0.0.1:7100", "--no-key-check", "--request-timeout", "30"]
    )
    assert edge_config(args).authenticate is False
    assert edge_config(args).api_keys is False
    assert edge_config(args).timeouts == EdgeTimeouts(request=30)


def test_an_edge_that_does_not_know_about_keys_checks_both_and_health_needs_neither() -> None:
    config = EdgeConfig(upstreams=["127.0.0.1:7100"])  # turnmesh edge, told nothing
    manager = _manager(config)
    assert "envoy.filters.http.ext_authz" in [f["name"] for f in manager["http_filters"]]
    hosts = manager["route_config"]["virtual_hosts"]
    assert [h["name"] for h in hosts] == ["mesh", "other-hosts"]  # Host names checked
    for host in hosts:
        for route in host["routes"]:
            path = route["match"].get("path", "")
            if path in ("/health", "/ready") or "direct_response" in route:
                # Health never waits on a key; refusals answer before any check.
                skip = route["typed_per_filter_config"]["envoy.filters.http.ext_authz"]
                assert skip["disabled"] is True, route


def test_every_streamed_path_keeps_events_to_the_fields_they_set() -> None:
    """The native event streams go to EventStreamService (their servers
    print the events); simple chat's stream keeps the transcoder, printing
    set fields only."""
    from turnmesh.envoy.config import EVENT_STREAM_PATHS, STREAMED_PATHS

    events, streamed = re.compile(EVENT_STREAM_PATHS), re.compile(STREAMED_PATHS)
    for path in (
        "/v1/sessions/s1/turns",
        "/v1/sessions/s1/turns/",
        "/v1/sessions/s1/turns/t1/events",
        "/v1/sessions/s1/turns/t1/events/",
    ):
        assert events.search(path) and not streamed.search(path), path
    for path in ("/v1/chat:stream", "/v1/chat:stream/", "/agent/a/chat/stream"):
        assert streamed.search(path) and not events.search(path), path
    for path in ("/v1/sessions/s1", "/v1/sessions/s1/turns/t1:cancel", "/v1/chat", "/health"):
        assert not streamed.search(path) and not events.search(path), path
    config = render(EdgeConfig(upstreams=["127.0.0.1:7100"]))
    routes = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]["route_config"]["virtual_hosts"][0]["routes"]
    (route,) = [
        r for r in routes if r["match"].get("safe_regex", {}).get("regex") == EVENT_STREAM_PATHS
    ]
    transcoder = route["typed_per_filter_config"]["envoy.filters.http.grpc_json_transcoder"]
    assert transcoder["services"] == ["turnmesh.v1.EventStreamService"]


def test_a_servers_death_is_retried_elsewhere_within_a_budget() -> None:
    """Retries are bounded by a budget, not Envoy's default of 3 at once;
    the key check retries through headers (its retry_policy is xDS-only);
    reads, and only reads, are retried after a reset; a server refusing
    connections is left out before its health checks fail."""
    config = render(EdgeConfig(upstreams=["127.0.0.1:7100", "127.0.0.1:7101"], api_keys=True))
    cluster = config["static_resources"]["clusters"][0]
    (threshold,) = cluster["circuit_breakers"]["thresholds"]
    assert threshold["retry_budget"]["min_retry_concurrency"] >= 64
    outliers = cluster["outlier_detection"]
    assert outliers["split_external_local_origin_errors"] is True
    assert outliers["enforcing_consecutive_5xx"] == 0  # a slow or failing answer never ejects
    assert outliers["max_ejection_percent"] == 50  # one server alone is never left out
    manager = _manager(EdgeConfig(upstreams=["127.0.0.1:7100"], api_keys=True))
    check = next(f for f in manager["http_filters"] if f["name"].endswith("ext_authz"))
    metadata = {
        m["key"]: m["value"] for m in check["typed_config"]["grpc_service"]["initial_metadata"]
    }
    assert "reset" in metadata["x-envoy-retry-on"].split(",")
    assert int(metadata["x-envoy-max-retries"]) >= 2
    routes = manager["route_config"]["virtual_hosts"][0]["routes"]
    reads = {r["match"].get("path"): r for r in routes if r["match"].get("path") in READ_PATHS}
    assert set(reads) == set(READ_PATHS)
    assert "/turnmesh.v1.SessionService/GetHistory" in reads
    # REST's resume of a turn is a read (its SSE form), as SubscribeTurn is.
    assert "/turnmesh.v1.EventStreamService/StreamSubscribeTurn" in reads
    assert "/turnmesh.v1.EventStreamService/StreamTurn" not in reads
    assert not any(p.rsplit("/", 1)[1] == "Turn" or "Create" in p for p in READ_PATHS)
    for route in reads.values():
        assert "reset" in route["route"]["retry_policy"]["retry_on"].split(",")
    others = [r for r in routes if "route" in r and r["match"].get("path") not in READ_PATHS]
    for route in others:
        assert "reset" not in route["route"]["retry_policy"]["retry_on"].split(",")


def test_a_frozen_server_is_found_out_before_a_key_check_runs_out() -> None:
    """A key check sent to a frozen server ends with a reset when the
    keepalive finds the connection dead, and is asked again elsewhere: only
    if that happens within the check's own time (else: 503, key not checked)."""
    config = render(EdgeConfig(upstreams=["127.0.0.1:7100"], api_keys=True))
    cluster = next(
        c for c in config["static_resources"]["clusters"] if c["name"] == "session_servers"
    )
    options = cluster["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ]
    keepalive = options["explicit_http_config"]["http2_protocol_options"]["connection_keepalive"]
    found_out = float(keepalive["interval"].rstrip("s")) + float(keepalive["timeout"].rstrip("s"))
    assert found_out < EdgeTimeouts().auth
    assert found_out <= 2.0  # the bound docs/deploy.md states
