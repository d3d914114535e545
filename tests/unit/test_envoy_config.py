"""Every rendered Envoy config variant passes `envoy --mode validate`."""

from __future__ import annotations

from pathlib import Path

import pytest

from turnmesh.envoy import EdgeConfig, EdgeGuards, render
from turnmesh.envoy.process import EnvoyError, validate, write_config

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
    assert len(forwarded) == 2
    for route in forwarded:
        assert route["route"]["timeout"] == "0s"
    transcoder = next(
        f for f in manager["http_filters"] if f["name"].endswith("grpc_json_transcoder")
    )["typed_config"]
    assert transcoder["print_options"]["stream_sse_style_delimited"] is True
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
