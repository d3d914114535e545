"""Envoy's configuration for the public edge, rendered for one mesh.

One listener serves REST/JSON, SSE and native gRPC (``codec_type: AUTO``). The
JSON transcoder turns the annotated SessionService RPCs into REST; streaming
RPCs come out as SSE. Errors a REST client can get are all
``application/problem+json``: converted gRPC errors are reshaped by
``problem.lua``, Envoy's own replies by ``local_reply_config``.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any

from turnmesh.envoy import ext_authz, guards
from turnmesh.envoy.edge_config import EdgeConfig
from turnmesh.envoy.timeouts import manager_timeouts
from turnmesh.runtime import errors
from turnmesh.runtime.tls import TlsFiles
from turnmesh.v1 import compat_service_pb2, session_service_pb2

HERE = Path(__file__).resolve().parent
SESSION_SERVICE = session_service_pb2.DESCRIPTOR.services_by_name["SessionService"].full_name
COMPAT_SERVICE = compat_service_pb2.DESCRIPTOR.services_by_name["CompatService"].full_name

# 100 MiB of files as base64 (4/3: 133.4 MiB) in JSON, plus the rest of the
# request (a 10,000-character message, 64 KiB of metadata, names): 135 MiB.
MAX_REQUEST_BODY_BYTES = 135 * 1024 * 1024

# What a browser client may send and read (X-Session-Id: the OpenAI surfaces'
# session header; Retry-After on 409/429; traceparent to join a trace).
CORS_ALLOW_HEADERS = (
    "authorization, content-type, x-session-id, last-event-id, traceparent, "
    "x-turnmesh-on-disconnect"
)
CORS_EXPOSE_HEADERS = (
    "x-session-id, retry-after, www-authenticate, content-type, x-request-id, x-should-retry"
)
INTERNAL_HEADERS = (
    "x-turnmesh-forwarded",
    "x-turnmesh-mesh-key",
    "x-turnmesh-internal",
    "x-turnmesh-unreachable",
    "x-turnmesh-principal",
)
# OpenAI's APIs turnmesh does not serve: OpenAI's 404 (its SDKs raise
# NotFoundError), where any other unknown path keeps problem+json.
OPENAI_UNSERVED = (
    "/v1/completions",
    "/v1/embeddings",
    "/v1/files",
    "/v1/images",
    "/v1/audio",
    "/v1/moderations",
    "/v1/assistants",
    "/v1/threads",
    "/v1/batches",
)
OPENAI_SERVED = ("/v1/chat/completions", "/v1/responses", "/v1/models")

# Envoy's id of a request from outside: in the access log, a problem's
# `instance`, the X-Request-Id response header and the turn's log line.
REQUEST_ID = "%REQ(X-REQUEST-ID)%"
ACCESS_LOG_FORMAT = (
    '[%START_TIME%] "%REQ(X-TURNMESH-ORIGINAL-METHOD?:METHOD)% '
    '%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" '
    "%RESPONSE_CODE% grpc=%GRPC_STATUS% %DURATION%ms up=%UPSTREAM_HOST% "
    f"flags=%RESPONSE_FLAGS% principal={ext_authz.PRINCIPAL} rid=%REQ(X-REQUEST-ID)%\n"
)


HEALTH_CHECK_TIMEOUT = "5s"
UNHEALTHY_THRESHOLD = 3


TLS_SOCKET = "envoy.transport_sockets.tls"
TLS_TYPES = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."


def _certificate(cert: Path, key: Path) -> dict[str, Any]:
    return {
        "certificate_chain": {"filename": str(cert)},
        "private_key": {"filename": str(key)},
    }


TRACE_COLLECTOR = "opentelemetry_collector"


def _tracing() -> dict[str, Any]:
    """Envoy starts each request's trace (or continues the caller's
    ``traceparent``) and passes its span on to the session server."""
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


def _collector_cluster(endpoint: str) -> dict[str, Any]:
    host, port = _split(endpoint.split("://", 1)[-1].rstrip("/"))
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
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(host, port)}}]}],
        },
    }


def _cors(config: EdgeConfig) -> dict[str, Any]:
    origins = (
        [{"safe_regex": {"regex": ".+"}}]  # Envoy refuses an empty prefix
        if "*" in config.cors_origins
        else [{"exact": origin.rstrip("/")} for origin in config.cors_origins]
    )
    return {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy",
        "allow_origin_string_match": origins,
        "allow_methods": "GET, POST, DELETE, OPTIONS",
        "allow_headers": CORS_ALLOW_HEADERS,
        "expose_headers": CORS_EXPOSE_HEADERS,
        "max_age": "600",
        "allow_credentials": False,
    }


def _method(name: str) -> dict[str, Any]:
    return {"name": ":method", "string_match": {"exact": name}}


def _openai_unserved_routes() -> list[dict[str, Any]]:
    served = ", ".join(OPENAI_SERVED)
    return [
        {
            "match": {"path_separated_prefix": path},
            "direct_response": {
                "status": 404,
                "body": {"inline_string": f"turnmesh does not serve {path}; it serves {served}"},
            },
            # Answered before any key check, as the edge's other refusals are.
            "typed_per_filter_config": {
                "envoy.filters.http.grpc_json_transcoder": {
                    "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig",
                    "disabled": True,
                },
                **ext_authz.bodiless(),
            },
        }
        for path in OPENAI_UNSERVED
    ]


# The REST paths whose answer is a stream of Events (Turn, SubscribeTurn,
# ChatStream). With every zero field printed an event would carry `role: ""`
# and the like, which the real AG-UI client rejects (AGUI-NOTES.md).
STREAMED_PATHS = r"^/v1/sessions/[^/]+/turns(/[^/]+/events)?/?$|^/v1/chat:stream/?$"


def _streamed_routes(route: dict[str, Any], transcoder: dict[str, Any]) -> list[dict[str, Any]]:
    """The streamed routes, with the transcoder printing only set fields
    (its print options are filter-wide: overridden per route)."""
    streamed = {
        **transcoder,
        "print_options": {**transcoder["print_options"], "always_print_primitive_fields": False},
    }
    return [
        {
            "match": {"safe_regex": {"regex": STREAMED_PATHS}},
            "route": route,
            "typed_per_filter_config": {"envoy.filters.http.grpc_json_transcoder": streamed},
        }
    ]


def _playground_routes(config: EdgeConfig) -> list[dict[str, Any]]:
    if config.playground is None:
        return []
    return [
        {
            "match": {
                "path": "/",
                "headers": [{"name": ":method", "string_match": {"exact": "GET"}}],
            },
            "direct_response": {"status": 200, "body": {"filename": str(config.playground)}},
            "response_headers_to_add": [
                {"header": {"key": k, "value": v}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}
                for k, v in (
                    ("content-type", "text/html; charset=utf-8"),
                    ("cache-control", "no-cache"),
                    # The page talks to this origin only, loads nothing else, and
                    # is never framed by another page (clickjacking its key field).
                    (
                        "content-security-policy",
                        "default-src 'none'; script-src 'unsafe-inline'; "
                        "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; "
                        "frame-ancestors 'none'",
                    ),
                    ("x-frame-options", "DENY"),
                    ("x-content-type-options", "nosniff"),
                )
            ],
            # Not a gRPC method: the transcoder must let it through.
            "typed_per_filter_config": {
                "envoy.filters.http.grpc_json_transcoder": {
                    "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig",
                    "disabled": True,
                },
                **ext_authz.bodiless(),
            },
        }
    ]


def _listener_tls(cert: Path, key: Path) -> dict[str, Any]:
    return {
        "name": TLS_SOCKET,
        "typed_config": {
            "@type": TLS_TYPES + "DownstreamTlsContext",
            "common_tls_context": {
                "tls_certificates": [_certificate(cert, key)],
                # gRPC clients need h2 by ALPN; curl and browsers take either.
                "alpn_protocols": ["h2", "http/1.1"],
            },
        },
    }


def _upstream_tls(files: TlsFiles) -> dict[str, Any]:
    return {
        "name": TLS_SOCKET,
        "typed_config": {
            "@type": TLS_TYPES + "UpstreamTlsContext",
            "common_tls_context": {
                "tls_certificates": [_certificate(files.cert_file, files.key_file)],
                # Only servers with a certificate from the mesh CA are trusted.
                "validation_context": {"trusted_ca": {"filename": str(files.ca_file)}},
                "alpn_protocols": ["h2"],
            },
        },
    }


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _problem_mappers() -> list[dict[str, Any]]:
    """Envoy's own replies to REST callers as problem+json; native gRPC callers
    (content-type application/grpc...) keep their plain statuses."""
    not_grpc = {
        "header_filter": {
            "header": {
                "name": "content-type",
                "string_match": {"prefix": "application/grpc"},
                "invert_match": True,
                "treat_missing_header_as_empty": True,
            }
        }
    }
    # The transcoder rewrites a REST request's content type to gRPC before the
    # router replies, but leaves this header behind.
    transcoded = {
        "header_filter": {"header": {"name": "x-envoy-original-path", "present_match": True}}
    }
    rest_caller = {"or_filter": {"filters": [not_grpc, transcoded]}}

    def mapper(status_filter: dict[str, Any], title: str, slug: str) -> dict[str, Any]:
        return {
            "filter": {"and_filter": {"filters": [rest_caller, status_filter]}},
            "body_format_override": {
                "json_format": {
                    "type": errors.PROBLEM_BASE + slug,
                    "title": title,
                    "status": "%RESPONSE_CODE%",
                    "detail": "%LOCAL_REPLY_BODY%",
                    "instance": REQUEST_ID,
                },
                "content_type": "application/problem+json",
            },
        }

    def status(op: str, code: int) -> dict[str, Any]:
        value = {"default_value": code, "runtime_key": f"turnmesh.problem_{op}_{code}"}
        found = {"status_code_filter": {"comparison": {"op": op, "value": value}}}
        # Envoy's overload replies are answered as 429 (envoy/guards.py).
        return guards.or_shed(found, code) if op == "EQ" else found

    def openai_mapper(status_filter: dict[str, Any], error_type: str) -> dict[str, Any]:
        return {
            "filter": {"and_filter": {"filters": [_openai_paths(), status_filter]}},
            "body_format_override": {
                "json_format": {
                    "error": {
                        "message": "%LOCAL_REPLY_BODY%",
                        "type": error_type,
                        "param": None,
                        "code": None,
                    }
                },
                "content_type": "application/json",
            },
        }

    # OpenAI's clients get OpenAI's error shape for Envoy's own replies too;
    # everyone's problem type and title come from the one error table.
    problems = errors.edge_problems()
    mappers = [
        guards.shed(openai_mapper(status("EQ", code), error_type), code)
        for code, (_, _, error_type) in problems.items()
    ]
    mappers += [
        openai_mapper(status("GE", 500), "server_error"),
        openai_mapper(status("GE", 400), "invalid_request_error"),
    ]
    mappers += [
        guards.shed(mapper(status("EQ", code), title, slug), code)
        for code, (slug, title, _) in problems.items()
    ]
    mappers.append(mapper(status("GE", 400), errors.EDGE_FALLBACK[1], errors.EDGE_FALLBACK[0]))
    return mappers


def lua_error_table() -> str:
    """The error table as Lua for ``problem.lua``: rows by gRPC code, and the
    rows of their own that some reasons have."""

    def row(r: errors.Row) -> str:
        return f'"{r.slug}", "{r.title}", "{r.openai_type}", {r.code.value[0]}'

    return "\n".join(
        [
            f'local BASE = "{errors.PROBLEM_BASE}"',
            "local BY_CODE = {",
            *(f"  [{r.code.value[0]}] = {{{row(r)}}}," for r in errors.code_rows()),
            "}",
            "local BY_REASON = {",
            *(f"  {r.reason} = {{{row(r)}}}," for r in errors.reason_rows()),
            "}",
        ]
    )


def _openai_paths() -> dict[str, Any]:
    """Requests to OpenAI's paths, before or after the transcoder rewrote :path."""
    # For the unserved ones a path segment (or the query) ends the prefix:
    # /v1/embeddingsx is no OpenAI path, and keeps problem+json. One regex
    # each (RE2 refuses a program over 100 instructions).
    matchers: list[dict[str, Any]] = [{"prefix": prefix} for prefix in OPENAI_SERVED]
    matchers += [
        {"safe_regex": {"regex": f"^{re.escape(prefix)}([/?].*)?$"}} for prefix in OPENAI_UNSERVED
    ]
    filters = [
        {"header_filter": {"header": {"name": name, "string_match": matcher}}}
        for name in (":path", "x-envoy-original-path")
        for matcher in matchers
    ]
    return {"or_filter": {"filters": filters}}


def render(config: EdgeConfig) -> dict[str, Any]:
    """The whole Envoy bootstrap as a dict (JSON is valid Envoy YAML)."""
    lua_source = (
        (HERE / "problem.lua")
        .read_text()
        .replace("__MAX_REQUEST_BYTES__", str(MAX_REQUEST_BODY_BYTES))
        .replace("__ERROR_TABLE__", lua_error_table())
    )
    transcoder = {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.grpc_json_transcoder.v3"
        ".GrpcJsonTranscoder",
        "proto_descriptor": str(config.descriptor_set),
        "services": [SESSION_SERVICE, COMPAT_SERVICE],
        "print_options": {
            "add_whitespace": False,
            # Unary answers print zero and empty fields (`activeSessions: 0`,
            # `deleted: false`, `tool_calls: []`): clients typed on the shapes
            # need them. Streamed events keep AG-UI's shapes: `_streamed_routes`.
            "always_print_primitive_fields": True,
            "always_print_enums_as_ints": False,
            "preserve_proto_field_names": False,
            # One `data: <json>` frame per event, flushed as it is produced.
            "stream_sse_style_delimited": True,
        },
        "convert_grpc_status": True,
        # Whole bodies for unary REST (the buffer filter before it has them).
        "max_request_body_size": MAX_REQUEST_BODY_BYTES,
        "request_validation_options": {
            "reject_unknown_method": True,
            "reject_unknown_query_parameters": True,
        },
    }
    route = {
        "cluster": "session_servers",
        "timeout": "0s",  # never cut a long turn
        # Safe retries only: the call never reached a server, or a server
        # refused it before doing anything (UNAVAILABLE: draining, no worker).
        # Envoy never retries once it has forwarded part of a response.
        "retry_policy": {
            "retry_on": "connect-failure,refused-stream,unavailable,reset-before-request",
            "num_retries": 2,
            "retry_host_predicate": [
                {
                    "name": "envoy.retry_host_predicates.previous_hosts",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.retry.host"
                        ".previous_hosts.v3.PreviousHostsPredicate"
                    },
                }
            ],
        },
    }
    manager = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager"
        ".v3.HttpConnectionManager",
        "stat_prefix": "public",
        "codec_type": "AUTO",
        # Clients get the id to quote: the same as the problem's `instance`.
        "always_set_request_id_in_response": True,
        **manager_timeouts(config.timeouts),
        "access_log": [
            {
                "name": "envoy.access_loggers.stdout",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.access_loggers.stream.v3"
                    ".StdoutAccessLog",
                    "log_format": {"text_format_source": {"inline_string": ACCESS_LOG_FORMAT}},
                },
            }
        ],
        "local_reply_config": {
            "mappers": [*ext_authz.reply_mappers(_openai_paths()), *_problem_mappers()]
        },
        "route_config": {
            "name": "public",
            # The playground page is served from memory (Envoy's default cap is 4 KiB).
            "max_direct_response_body_size_bytes": 1024 * 1024,
            "virtual_hosts": [
                {
                    "name": "mesh",
                    "domains": guards.allowed_domains(config),
                    # Mesh-internal headers never come from outside.
                    "request_headers_to_remove": list(INTERNAL_HEADERS),
                    "typed_per_filter_config": {"envoy.filters.http.cors": _cors(config)},
                    "routes": [
                        ext_authz.check_refused(),
                        *_playground_routes(config),
                        *guards.cross_origin_routes(config),
                        {
                            # Native gRPC (reflection is a bidi stream) must not
                            # be buffered; gRPC's own message limits apply, and
                            # the servers refuse a call without a key unread.
                            "match": {"prefix": "/", "headers": [ext_authz.grpc_content_type()]},
                            "route": route,
                            "typed_per_filter_config": ext_authz.skipped(),
                        },
                        # Health and readiness never depend on keys (GET: no body).
                        *(
                            {
                                "match": {"path": path, "headers": [_method("GET")]},
                                "route": route,
                                "typed_per_filter_config": ext_authz.bodiless(),
                            }
                            for path in guards.REST_HEALTH_PATHS
                        ),
                        *_openai_unserved_routes(),
                        *_streamed_routes(route, transcoder),
                        {"match": {"prefix": "/"}, "route": route},
                    ],
                },
                *guards.foreign_hosts(config, route, INTERNAL_HEADERS),
            ],
        },
        "http_filters": [
            *guards.http_filters(config),
            {
                # Answers preflights for allowed origins, before anything else.
                "name": "envoy.filters.http.cors",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors"
                },
            },
            {
                "name": "envoy.filters.http.lua",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                    "default_source_code": {"inline_string": lua_source},
                },
            },
            # The key, checked on the headers before any body is read.
            *([ext_authz.ext_authz_filter(config.timeouts.auth)] if config.authenticate else []),
            {
                # REST bodies over the attachment limits get 413 here, before
                # anything reaches a server.
                "name": "envoy.filters.http.buffer",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
                    "max_request_bytes": MAX_REQUEST_BODY_BYTES,
                },
            },
            {"name": "envoy.filters.http.grpc_json_transcoder", "typed_config": transcoder},
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            },
        ],
    }
    manager.update(guards.connection_manager(config))
    cluster = {
        "name": "session_servers",
        # Addresses as given; names (a Kubernetes headless Service) are
        # resolved, every address an endpoint, and re-resolved as pods change.
        "type": "STATIC" if all(_is_ip(_split(a)[0]) for a in config.upstreams) else "STRICT_DNS",
        "dns_lookup_family": "V4_PREFERRED",
        "connect_timeout": "2s",
        "lb_policy": "ROUND_ROBIN",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3"
                ".HttpProtocolOptions",
                "explicit_http_config": {
                    "http2_protocol_options": {
                        # A server whose host vanished (no RST, no FIN) is
                        # found out in seconds: its streams end, callers retry.
                        "connection_keepalive": {"interval": "5s", "timeout": "3s"}
                    }
                },
            }
        },
        "load_assignment": {
            "cluster_name": "session_servers",
            "endpoints": [
                {
                    "lb_endpoints": [
                        {"endpoint": {"address": _address(*_split(a))}} for a in config.upstreams
                    ]
                }
            ],
        },
        # A draining server answers NOT_SERVING and stops receiving new calls.
        # A slow answer is not a dead server: a check may take HEALTH_CHECK_TIMEOUT
        # and a server is removed only after UNHEALTHY_THRESHOLD failures in a
        # row, so one check lost on a saturated server (the only one, maybe)
        # never turns every call into "no healthy upstream".
        "health_checks": [
            {
                "timeout": HEALTH_CHECK_TIMEOUT,
                "interval": f"{config.health_check_interval_ms / 1000:.3f}s",
                "unhealthy_threshold": UNHEALTHY_THRESHOLD,
                "healthy_threshold": 1,
                "grpc_health_check": {},
                # Keep checking at full rate while no traffic flows (default 60 s),
                # so a server that just started is used at once.
                "no_traffic_interval": f"{config.health_check_interval_ms / 1000:.3f}s",
            }
        ],
        # No panic routing: with every server unhealthy, answer 503 at once.
        "common_lb_config": {"healthy_panic_threshold": {"value": 0}},
    }
    if config.upstream_tls is not None:
        cluster["transport_socket"] = _upstream_tls(config.upstream_tls)
    filter_chain: dict[str, Any] = {
        "filters": [
            {"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}
        ]
    }
    if config.listener_tls is not None:
        filter_chain["transport_socket"] = _listener_tls(*config.listener_tls)
        # A TLS handshake that stalls is cut like half-sent headers.
        filter_chain["transport_socket_connect_timeout"] = f"{config.timeouts.request_headers:.3f}s"
    clusters = [cluster]
    bootstrap_extra: dict[str, Any] = {}
    if config.otlp_endpoint:
        manager["tracing"] = _tracing()
        clusters.append(_collector_cluster(config.otlp_endpoint))
        # Spans leave every second (Envoy's default is 5 s).
        bootstrap_extra["layered_runtime"] = {
            "layers": [
                {
                    "name": "tracing",
                    "static_layer": {"tracing.opentelemetry.flush_interval_ms": 1000},
                }
            ]
        }
    return {
        "admin": {"address": _address("127.0.0.1", config.admin_port)},
        "overload_manager": guards.overload_manager(config),
        "static_resources": {
            "listeners": [
                {
                    "name": "public",
                    "address": _address(config.host, config.port),
                    "enable_reuse_port": False,
                    "per_connection_buffer_limit_bytes": 1024 * 1024,
                    "filter_chains": [filter_chain],
                }
            ],
            "clusters": clusters,
        },
        **bootstrap_extra,
    }
