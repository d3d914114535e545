"""Envoy's configuration for the public edge, rendered for one mesh.

One listener serves REST/JSON, SSE and native gRPC (``codec_type: AUTO``). The
JSON transcoder turns the annotated SessionService RPCs into REST; streaming
RPCs come out as SSE. Errors a REST client can get are all
``application/problem+json``: converted gRPC errors are reshaped by
``problem.lua``, Envoy's own replies by ``local_reply_config`` (replies.py).

``render`` puts the bootstrap together from named parts: the listener and its
HTTP connection manager (``_connection_manager``: access log, local replies,
``_route_config`` with the virtual hosts and their ``_routes``,
``_http_filters``), the clusters (clusters.py), and the limits and overload
manager (guards.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import grpc
from a2a.types import a2a_pb2
from google.api import annotations_pb2

from turnmesh.envoy import clusters, ext_authz, guards, ws_route
from turnmesh.envoy.edge_config import EdgeConfig
from turnmesh.envoy.replies import REQUEST_ID, local_reply_config
from turnmesh.envoy.sockets import address, listener_tls
from turnmesh.envoy.timeouts import manager_timeouts
from turnmesh.runtime import errors
from turnmesh.v1 import (
    chat_upload_pb2,
    compat_service_pb2,
    event_stream_pb2,
    session_service_pb2,
)

HERE = Path(__file__).resolve().parent
SESSION_SERVICE = session_service_pb2.DESCRIPTOR.services_by_name["SessionService"].full_name
COMPAT_SERVICE = compat_service_pb2.DESCRIPTOR.services_by_name["CompatService"].full_name
# Simple chat's multipart forms: their own transcoder on their own routes.
UPLOAD_SERVICE = chat_upload_pb2.DESCRIPTOR.services_by_name["ChatUploadService"].full_name
# The REST event streams (SSE printed by the servers): `_streamed_routes`.
EVENT_STREAM_SERVICE = event_stream_pb2.DESCRIPTOR.services_by_name["EventStreamService"].full_name
# A2A's own service, transcoded by its own google.api.http rules.
A2A_SERVICE = a2a_pb2.DESCRIPTOR.services_by_name["A2AService"].full_name

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

# The path without its query: /ws takes its API key as ?token= (a browser's
# WebSocket cannot set headers), and keys never reach the log.
ACCESS_LOG_FORMAT = (
    '[%START_TIME%] "%REQ(X-TURNMESH-ORIGINAL-METHOD?:METHOD)% '
    '%PATH(NQ)% %PROTOCOL%" '
    "%RESPONSE_CODE% grpc=%GRPC_STATUS% %DURATION%ms up=%UPSTREAM_HOST% "
    f"flags=%RESPONSE_FLAGS% principal={ext_authz.PRINCIPAL} rid={REQUEST_ID}\n"
)


def render(config: EdgeConfig) -> dict[str, Any]:
    """The whole Envoy bootstrap as a dict (JSON is valid Envoy YAML)."""
    bootstrap: dict[str, Any] = {
        "admin": {"address": address("127.0.0.1", config.admin_port)},
        "overload_manager": guards.overload_manager(config),
        "memory_allocator_manager": guards.memory_allocator_manager(),
        "static_resources": {
            "listeners": [_listener(config)],
            "clusters": clusters.clusters(config),
        },
    }
    if config.otlp_endpoint:
        bootstrap["layered_runtime"] = clusters.tracing_runtime()
    return bootstrap


def _listener(config: EdgeConfig) -> dict[str, Any]:
    filter_chain: dict[str, Any] = {
        "filters": [
            {
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": _connection_manager(config),
            }
        ]
    }
    if config.listener_tls is not None:
        filter_chain["transport_socket"] = listener_tls(*config.listener_tls)
        # A TLS handshake that stalls is cut like half-sent headers.
        filter_chain["transport_socket_connect_timeout"] = f"{config.timeouts.request_headers:.3f}s"
    return {
        "name": "public",
        "address": address(config.host, config.port),
        "enable_reuse_port": False,
        "per_connection_buffer_limit_bytes": 1024 * 1024,
        "filter_chains": [filter_chain],
    }


def _connection_manager(config: EdgeConfig) -> dict[str, Any]:
    transcoder = _transcoder(config)
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
        "local_reply_config": local_reply_config(_openai_paths()),
        "route_config": _route_config(config, transcoder),
        "http_filters": _http_filters(config, transcoder),
        **guards.connection_manager(config),
    }
    if config.otlp_endpoint:
        manager["tracing"] = clusters.tracing()
    return manager


# -- filters ---------------------------------------------------------------------


def _transcoder(config: EdgeConfig) -> dict[str, Any]:
    return {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.grpc_json_transcoder.v3"
        ".GrpcJsonTranscoder",
        "proto_descriptor": str(config.descriptor_set),
        "services": [SESSION_SERVICE, COMPAT_SERVICE, A2A_SERVICE],
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


def _http_filters(config: EdgeConfig, transcoder: dict[str, Any]) -> list[dict[str, Any]]:
    return [
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
                "default_source_code": {"inline_string": _lua_source()},
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
    ]


def _lua_source() -> str:
    return (
        (HERE / "problem.lua")
        .read_text()
        .replace("__MAX_REQUEST_BYTES__", str(MAX_REQUEST_BODY_BYTES))
        .replace("__MAX_HEADER_BYTES__", str(guards.MAX_HEADER_BYTES))
        .replace("__ERROR_TABLE__", lua_error_table())
    )


def lua_error_table() -> str:
    """The error table as Lua for ``problem.lua``: rows by gRPC code, and the
    rows of their own that some reasons have."""

    def row(r: errors.Row) -> str:
        return f'"{r.slug}", "{r.title}", "{r.openai_type}", {r.code.value[0]}, {r.jsonrpc_code}'

    return "\n".join(
        [
            f'local BASE = "{errors.PROBLEM_BASE}"',
            "local BY_CODE = {",
            *(f"  [{r.code.value[0]}] = {{{row(r)}}}," for r in errors.code_rows()),
            "}",
            "local BY_REASON = {",
            *(f"  {r.reason} = {{{row(r)}}}," for r in errors.reason_rows()),
            "}",
            "local CODE_NAMES = {",
            *(f'  [{c.value[0]}] = "{c.name}",' for c in grpc.StatusCode),
            "}",
        ]
    )


# -- virtual hosts and routes ----------------------------------------------------


# Safe retries only: the call never reached a server, or a server refused it
# before doing anything (UNAVAILABLE: draining, no worker). Envoy never retries
# once it has forwarded part of a response.
RETRY_ON = "connect-failure,refused-stream,unavailable,reset-before-request"
# A read (an RPC REST reaches with GET: nothing it does changes anything) is
# also asked again when its server died while answering it.
READ_RETRY_ON = RETRY_ON + ",reset"


def _read_paths() -> tuple[str, ...]:
    """The gRPC paths of the public RPCs bound to GET."""
    paths = []
    for module, name in (
        (session_service_pb2, "SessionService"),
        # REST's SubscribeTurn (StreamSubscribeTurn) is a read too.
        (event_stream_pb2, "EventStreamService"),
        (compat_service_pb2, "CompatService"),
        (a2a_pb2, "A2AService"),
    ):
        service = module.DESCRIPTOR.services_by_name[name]
        for method in service.methods:
            if method.GetOptions().Extensions[annotations_pb2.http].get:
                paths.append(f"/{service.full_name}/{method.name}")
    return tuple(sorted(paths))


READ_PATHS = _read_paths()
# A2A agent cards: where clients look for them, and the RPC that answers.
AGENT_CARD_REST = r"^(/[^/]+)?/\.well-known/agent-card\.json$"
AGENT_CARD_PATH = f"/{COMPAT_SERVICE}/GetAgentCard"
# The Host a card's request named and the port it reached (the edge strips
# ports from Host), for the card's absolute URLs (the server sees no
# :authority); set here, so a caller's own values never count.
AGENT_CARD_HOST_HEADER = "x-turnmesh-card-host"
AGENT_CARD_PORT_HEADER = "x-turnmesh-card-port"


def _card_headers() -> dict[str, Any]:
    return {
        "request_headers_to_add": [
            {
                "header": {"key": key, "value": value},
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
            }
            for key, value in (
                (AGENT_CARD_HOST_HEADER, "%REQ(:AUTHORITY)%"),
                (AGENT_CARD_PORT_HEADER, "%DOWNSTREAM_LOCAL_PORT%"),
            )
        ]
    }


def _route(retry_on: str = RETRY_ON) -> dict[str, Any]:
    """Where the calls go: any session server."""
    return {
        "cluster": clusters.SESSION_SERVERS,
        "timeout": "0s",  # never cut a long turn
        "retry_policy": {
            "retry_on": retry_on,
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


def _route_config(config: EdgeConfig, transcoder: dict[str, Any]) -> dict[str, Any]:
    route = _route()
    return {
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
                "routes": _routes(config, route, transcoder),
            },
            *guards.foreign_hosts(config, route, INTERNAL_HEADERS),
        ],
    }


def _routes(
    config: EdgeConfig, route: dict[str, Any], transcoder: dict[str, Any]
) -> list[dict[str, Any]]:
    """The API's routes, first match wins."""
    return [
        ext_authz.check_refused(),
        *ws_route.routes(config),
        *_playground_routes(config),
        *guards.cross_origin_routes(config),
        # Reads, by their gRPC path: a REST call is routed again once it is
        # transcoded (and native gRPC goes straight here), so what a read may
        # retry is matched on the method it became.
        *(
            {
                "match": {"path": path, "headers": [ext_authz.grpc_content_type()]},
                "route": _route(READ_RETRY_ON),
                "typed_per_filter_config": ext_authz.skipped(),
                **(_card_headers() if path == AGENT_CARD_PATH else {}),
            }
            for path in READ_PATHS
        ),
        {
            # Native gRPC (reflection is a bidi stream) must not be buffered;
            # gRPC's own message limits apply, and the servers refuse a call
            # without a key unread.
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
        # Nor do A2A agent cards: clients read them before they use a key.
        {
            "match": {"safe_regex": {"regex": AGENT_CARD_REST}, "headers": [_method("GET")]},
            "route": route,
            "typed_per_filter_config": ext_authz.bodiless(),
        },
        *_openai_unserved_routes(),
        *_upload_routes(route, transcoder),
        *_streamed_routes(route, transcoder),
        {"match": {"prefix": "/"}, "route": route},
    ]


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


# The REST event streams: EventStreamService binds the same paths as Turn
# and SubscribeTurn, and prints the events itself (several to a message).
EVENT_STREAM_PATHS = r"^/v1/sessions/[^/]+/turns(/[^/]+/events)?/?$"
# The other REST paths whose answer is a stream of Events (ChatStream),
# transcoded. With every zero field printed an event would carry `role: ""`
# and the like, which the real AG-UI client rejects (AGUI-NOTES.md).
STREAMED_PATHS = r"^/v1/chat:stream/?$|^/agent/[^/]+/chat/stream/?$"


def _streamed_routes(route: dict[str, Any], transcoder: dict[str, Any]) -> list[dict[str, Any]]:
    """The streamed routes, with the transcoder printing only set fields
    (its print options are filter-wide: overridden per route)."""
    streamed = {
        **transcoder,
        "print_options": {**transcoder["print_options"], "always_print_primitive_fields": False},
    }
    events = {**streamed, "services": [EVENT_STREAM_SERVICE]}
    return [
        {
            "match": {"safe_regex": {"regex": EVENT_STREAM_PATHS}},
            "route": route,
            "typed_per_filter_config": {"envoy.filters.http.grpc_json_transcoder": events},
        },
        {
            "match": {"safe_regex": {"regex": STREAMED_PATHS}},
            "route": route,
            "typed_per_filter_config": {"envoy.filters.http.grpc_json_transcoder": streamed},
        },
    ]


# Simple chat's paths (HoloDeck's), which a multipart/form-data body sends
# to ChatUploadService instead of Chat and ChatStream.
CHAT_PATHS = r"^/v1/chat(:stream)?/?$|^/agent/[^/]+/chat(/stream)?/?$"
MULTIPART_CONTENT_TYPE = r"(?i)^\s*multipart/form-data\b.*"


def _upload_routes(route: dict[str, Any], transcoder: dict[str, Any]) -> list[dict[str, Any]]:
    """The transcoder picks an RPC by path and verb, never by content type:
    a multipart chat request gets a transcoder of its own (only
    ChatUploadService, whose RPCs bind the same paths; JSON ones keep Chat)."""
    upload = {
        **transcoder,
        "services": [UPLOAD_SERVICE],
        "print_options": {**transcoder["print_options"], "always_print_primitive_fields": False},
    }
    return [
        {
            "match": {
                "safe_regex": {"regex": CHAT_PATHS},
                "headers": [
                    {
                        "name": "content-type",
                        "string_match": {"safe_regex": {"regex": MULTIPART_CONTENT_TYPE}},
                    }
                ],
            },
            "route": route,
            "typed_per_filter_config": {"envoy.filters.http.grpc_json_transcoder": upload},
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
