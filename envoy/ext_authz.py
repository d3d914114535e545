"""The key check at the edge: Envoy's ext_authz filter asks a session server
(``runtime/ext_authz.py``) about each REST request's headers before any body
is read, so an unauthenticated upload gets 401 and its connection closes
instead of being buffered.

Native gRPC skips it: Envoy does not buffer gRPC (flow control holds each
stream to the connection's buffer limit) and the servers refuse a call
without a key before receiving its message (``runtime/interceptors.py``).
Health, readiness and the playground skip it too: they never depend on keys.
"""

from __future__ import annotations

from typing import Any

from turnmesh.envoy import a2a_replies, edge_rows
from turnmesh.runtime import errors

FILTER = "envoy.filters.http.ext_authz"
# The cluster of session servers: health-checked, and with mutual TLS when
# the mesh has it, for the check as for the calls.
CLUSTER = "session_servers"
# An allowed request's principal, in the access log.
PRINCIPAL = f"%DYNAMIC_METADATA({FILTER}:principal)%"
# When the check fails (no server answered it): 503, the key could not be
# checked; never let through.
ERROR_STATUS = errors.Unavailable.http_status


# A key check changes nothing: it is asked again on any failure to answer.
CHECK_RETRY_ON = "connect-failure,refused-stream,unavailable,reset"
# Headers can name no previous-hosts predicate: a retry may pick the server
# that failed again, so a few more tries than the route's.
CHECK_RETRIES = 5


def ext_authz_filter(timeout_seconds: float) -> dict[str, Any]:
    return {
        "name": FILTER,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
            "grpc_service": {
                "envoy_grpc": {
                    "cluster_name": CLUSTER,
                    # Another server, at once, when the one asked was
                    # unreachable, draining or died while asked (a key check
                    # changes nothing: asking again is always safe).
                    "retry_policy": {
                        "retry_on": CHECK_RETRY_ON,
                        "num_retries": CHECK_RETRIES,
                        "retry_back_off": {"base_interval": "0.025s", "max_interval": "0.25s"},
                        "retry_host_predicate": [
                            {
                                "name": "envoy.retry_host_predicates.previous_hosts",
                                "typed_config": {
                                    "@type": "type.googleapis.com/envoy.extensions.retry.host"
                                    ".previous_hosts.v3.PreviousHostsPredicate"
                                },
                            }
                        ],
                        "host_selection_retry_max_attempts": 3,
                    },
                },
                "timeout": f"{timeout_seconds:.3f}s",
                # The same policy as headers of the check's own request,
                # which its router honours in a static config too.
                "initial_metadata": [
                    {"key": "x-envoy-retry-on", "value": CHECK_RETRY_ON},
                    {"key": "x-envoy-max-retries", "value": str(CHECK_RETRIES)},
                ],
            },
            "transport_api_version": "V3",
            "failure_mode_allow": False,
            "status_on_error": {"code": ERROR_STATUS},
            # Only the key goes to the check (not cookies, not the body).
            "allowed_headers": {"patterns": [{"exact": "authorization"}]},
        },
    }


# Content types Envoy treats as gRPC (Grpc::Common::hasGrpcContentType):
# exactly application/grpc, or application/grpc+NAME. Not application/grpc-web,
# nor application/grpcx: those are transcoded (and buffered) as REST.
GRPC_CONTENT_TYPE = r"^application/grpc(\+.*)?$"
# The check's own method: mesh-internal, never served to outside callers (it
# would tell anyone which principal a key names, with no rate limit).
CHECK_PATH_PREFIX = "/envoy.service.auth.v3.Authorization/"


def skipped() -> dict[str, Any]:
    """A route's typed_per_filter_config entries that skip the check and the
    buffer filter: a route that reads no key must never buffer a body either
    (what it serves needs none: health, the playground, unbuffered gRPC)."""
    return {
        FILTER: {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3"
            ".ExtAuthzPerRoute",
            "disabled": True,
        },
        "envoy.filters.http.buffer": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.BufferPerRoute",
            "disabled": True,
        },
    }


# What a route that needs no body (health, the playground page) lets a
# request carry without a key: past it, 413 (a GET may carry a body, and
# Envoy's HTTP/1 codec hides Transfer-Encoding from route matchers).
BODILESS_BYTES = 4096


def bodiless() -> dict[str, Any]:
    """Like ``skipped``, for routes that need no body: the buffer filter
    stays, bounded to BODILESS_BYTES."""
    return {
        **skipped(),
        "envoy.filters.http.buffer": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.BufferPerRoute",
            "buffer": {"max_request_bytes": BODILESS_BYTES},
        },
    }


def grpc_content_type() -> dict[str, Any]:
    """A route header matcher for requests Envoy treats as gRPC."""
    return {"name": "content-type", "string_match": {"safe_regex": {"regex": GRPC_CONTENT_TYPE}}}


def check_refused() -> dict[str, Any]:
    """A route answering the check's own path with 404 before anything else."""
    return {
        "match": {"prefix": CHECK_PATH_PREFIX},
        "direct_response": {"status": 404, "body": {"inline_string": "not found"}},
        "typed_per_filter_config": {
            **skipped(),
            "envoy.filters.http.grpc_json_transcoder": {
                "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig",
                "disabled": True,
            },
        },
    }


def reply_mappers(openai_paths: dict[str, Any]) -> list[dict[str, Any]]:
    """Local reply mappers (first in the list) giving the check's denials the
    bodies the servers' own refusals have: problem+json with ``grpc_code`` and
    ``reason``, or OpenAI's or A2A's error shape on their paths. Its failures are 503s
    that say why."""
    row = errors.Unauthenticated.row()
    unavailable = errors.Unavailable.row()
    by_check = {"response_flag_filter": {"flags": ["UAEX"]}}

    def status(code: int) -> dict[str, Any]:
        value = {"default_value": code, "runtime_key": f"turnmesh.ext_authz_{code}"}
        return {"status_code_filter": {"comparison": {"op": "EQ", "value": value}}}

    def mapper(
        filters: list[dict[str, Any]],
        body: dict[str, Any],
        content_type: str,
        headers: list[dict[str, Any]],
    ) -> dict[str, Any]:
        return {
            "filter": {"and_filter": {"filters": [by_check, *filters]}},
            "body_format_override": {"json_format": body, "content_type": content_type},
            "headers_to_add": headers,
        }

    def problem(r: errors.Row, detail: str) -> dict[str, Any]:
        return {
            "type": r.problem_type,
            "title": r.title,
            "status": "%RESPONSE_CODE%",
            "detail": detail,
            "grpc_code": r.code.value[0],
            "reason": r.reason,
            "instance": "%REQ(X-REQUEST-ID)%",
        }

    def openai(r: errors.Row, message: str) -> dict[str, Any]:
        error = {"message": message, "type": r.openai_type, "param": None, "code": r.reason.lower()}
        return {"error": error}

    retry = [
        {
            "header": {"key": errors.RETRY_AFTER_KEY, "value": "1"},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }
    ]
    cases = [
        # The detail the server gave (the denial's body), its status and headers.
        (row, "%LOCAL_REPLY_BODY%", []),
        (unavailable, "the API key could not be checked; try again", retry),
    ]
    a2a_paths = a2a_replies.a2a_paths()
    mappers = []
    for r, detail, headers in cases:
        code = status(r.http_status)
        a2a = a2a_replies.a2a_error(*edge_rows.edge_a2a_errors()[r.http_status], detail)
        mappers += [
            mapper([openai_paths, code], openai(r, detail), "application/json", headers),
            mapper([a2a_paths, code], a2a, "application/json", headers),
            mapper([code], problem(r, detail), "application/problem+json", headers),
        ]
    return mappers
