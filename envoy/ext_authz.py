"""The key check at the edge: Envoy's ext_authz filter asks a session server
(``runtime/ext_authz.py``) about each REST request's headers before any body
is read, so an unauthenticated upload gets 401 and its connection closes
instead of being buffered.

Native gRPC skips it: Envoy does not buffer gRPC (flow control holds each
stream to the connection's buffer limit) and the servers refuse a call
without a key before receiving its message (``runtime/interceptors.py``). Health, readiness and the playground
skip it too: they never depend on keys.
"""

from __future__ import annotations

from typing import Any

from turnmesh.runtime import errors

FILTER = "envoy.filters.http.ext_authz"
# The cluster of session servers: health-checked, and with mutual TLS when
# the mesh has it, for the check as for the calls.
CLUSTER = "session_servers"
# An allowed request's principal, in the access log.
PRINCIPAL = f"%DYNAMIC_METADATA({FILTER}:principal)%"
# When no server answers the check: 503 (the key could not be checked), never
# allowed through.
ERROR_STATUS = 503


def ext_authz_filter(timeout_seconds: float) -> dict[str, Any]:
    return {
        "name": FILTER,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
            "grpc_service": {
                "envoy_grpc": {
                    "cluster_name": CLUSTER,
                    # Another server, when the one asked was unreachable.
                    "retry_policy": {"retry_on": "connect-failure,refused-stream,unavailable"},
                },
                "timeout": f"{timeout_seconds:.3f}s",
            },
            "transport_api_version": "V3",
            "failure_mode_allow": False,
            "status_on_error": {"code": ERROR_STATUS},
            # Only the key goes to the check (not cookies, not the body).
            "allowed_headers": {"patterns": [{"exact": "authorization"}]},
        },
    }


def skipped() -> dict[str, Any]:
    """A route's typed_per_filter_config entry that skips the check."""
    return {
        FILTER: {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3"
            ".ExtAuthzPerRoute",
            "disabled": True,
        }
    }


def reply_mappers(openai_paths: dict[str, Any]) -> list[dict[str, Any]]:
    """Local reply mappers (first in the list) giving the check's denials the
    bodies the servers' own refusals have: problem+json with ``grpc_code`` and
    ``reason``, or OpenAI's error shape on its paths. Its failures are 503s
    that say why."""
    row = errors.Unauthenticated.row()
    unavailable = errors.Unavailable.row()
    by_check = {"response_flag_filter": {"flags": ["UAEX"]}}

    def status(code: int) -> dict[str, Any]:
        value = {"default_value": code, "runtime_key": f"turnmesh.ext_authz_{code}"}
        return {"status_code_filter": {"comparison": {"op": "EQ", "value": value}}}

    def mapper(
        filters: list[dict[str, Any]], body: dict[str, Any], content_type: str
    ) -> dict[str, Any]:
        return {
            "filter": {"and_filter": {"filters": [by_check, *filters]}},
            "body_format_override": {"json_format": body, "content_type": content_type},
        }

    def problem(r: errors.Row, detail: str) -> dict[str, Any]:
        return {
            "type": r.problem_type,
            "title": r.title,
            "status": "%RESPONSE_CODE%",
            "detail": detail,
            "grpc_code": r.code.value[0],
            "reason": r.reason,
        }

    def openai(r: errors.Row, message: str) -> dict[str, Any]:
        return {
            "error": {
                "message": message,
                "type": r.openai_type,
                "param": None,
                "code": r.reason.lower(),
            }
        }

    failed = "the API key could not be checked: no session server answered in time"
    return [
        mapper(
            [openai_paths, status(row.http_status)],
            openai(row, "%LOCAL_REPLY_BODY%"),
            "application/json",
        ),
        mapper(
            [status(row.http_status)],
            problem(row, "%LOCAL_REPLY_BODY%"),
            "application/problem+json",
        ),
        {
            **mapper(
                [openai_paths, status(ERROR_STATUS)],
                openai(unavailable, failed),
                "application/json",
            ),
            "headers_to_add": [_retry_after()],
        },
        {
            **mapper(
                [status(ERROR_STATUS)], problem(unavailable, failed), "application/problem+json"
            ),
            "headers_to_add": [_retry_after()],
        },
    ]


def _retry_after() -> dict[str, Any]:
    return {
        "header": {"key": errors.RETRY_AFTER_KEY, "value": "1"},
        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
    }
