"""Envoy's own replies (a refused key, a body over the limit, no healthy
server, overload) in the shape each caller reads: ``application/problem+json``
for REST callers, OpenAI's error object on OpenAI's paths, A2A's on A2A's
(a2a_replies.py), and plain statuses
for native gRPC callers. Errors the servers return get the same shapes from
``problem.lua`` (config.py); both take titles and types from the one error
table (runtime/errors.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from turnmesh.envoy import a2a_replies, edge_rows, ext_authz, guards
from turnmesh.runtime import errors

# Envoy's id of a request from outside: in the access log, a problem's
# `instance`, the X-Request-Id response header and the turn's log line.
REQUEST_ID = "%REQ(X-REQUEST-ID)%"


def local_reply_config(openai_paths: dict[str, Any]) -> dict[str, Any]:
    """The connection manager's local reply mappers, first match wins: A2A's
    JSON-RPC endpoints', the key check's own denials, then everyone else's by
    status."""
    return {
        "mappers": [
            *_jsonrpc_mappers(),
            *ext_authz.reply_mappers(openai_paths),
            *_problem_mappers(openai_paths),
        ]
    }


# A2A's JSON-RPC endpoints (server/compat/a2a/jsonrpc.py), before or after
# the transcoder rewrote :path.
JSONRPC_PATH = r"^(/[^/]+)?/jsonrpc([?].*)?$"


def _jsonrpc_mappers() -> list[dict[str, Any]]:
    """Envoy's own replies on A2A's JSON-RPC endpoints (a refused key, a body
    over the limit, overload) as JSON-RPC error responses, their HTTP status
    kept; ``id`` is null: the request was never read."""
    paths = {
        "or_filter": {
            "filters": [
                {
                    "header_filter": {
                        "header": {
                            "name": name,
                            "string_match": {"safe_regex": {"regex": JSONRPC_PATH}},
                        }
                    }
                }
                for name in (":path", "x-envoy-original-path")
            ]
        }
    }

    def mapper(code: int) -> dict[str, Any]:
        value = {"default_value": code, "runtime_key": f"turnmesh.jsonrpc_{code}"}
        found = {"status_code_filter": {"comparison": {"op": "EQ", "value": value}}}
        rpc_code, reason = edge_rows.edge_jsonrpc_error(code)
        info = {"@type": ERROR_INFO_TYPE, "reason": reason, "domain": errors.ERROR_DOMAIN}
        body = {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": rpc_code, "message": "%LOCAL_REPLY_BODY%", "data": [info]},
        }
        return guards.shed(
            _never_retried(
                {
                    "filter": {"and_filter": {"filters": [paths, guards.or_shed(found, code)]}},
                    "body_format_override": {
                        "json_format": body,
                        "content_type": "application/json",
                    },
                },
                code,
            ),
            code,
        )

    return [mapper(code) for code in edge_rows.edge_problems()]


ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"


# Requests too large to ever be served: OpenAI's SDKs would retry some of
# them (they retry on their own judgement unless told not to).
NEVER_RETRIED = (413, 431)


def _never_retried(mapper: dict[str, Any], code: int) -> dict[str, Any]:
    if code not in NEVER_RETRIED:
        return mapper
    never = {
        "header": {"key": "x-should-retry", "value": "false"},
        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
    }
    return {**mapper, "headers_to_add": [never]}


def _problem_mappers(openai_paths: dict[str, Any]) -> list[dict[str, Any]]:
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
            "filter": {"and_filter": {"filters": [openai_paths, status_filter]}},
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
    problems = edge_rows.edge_problems()
    mappers = [
        guards.shed(_never_retried(openai_mapper(status("EQ", code), error_type), code), code)
        for code, (_, _, error_type) in problems.items()
    ]
    mappers += [
        openai_mapper(status("GE", 500), "server_error"),
        openai_mapper(status("GE", 400), "invalid_request_error"),
    ]
    mappers += _a2a_mappers(status)
    mappers += [
        guards.shed(mapper(status("EQ", code), title, slug), code)
        for code, (slug, title, _) in problems.items()
    ]
    mappers.append(
        mapper(status("GE", 400), edge_rows.EDGE_FALLBACK[1], edge_rows.EDGE_FALLBACK[0])
    )
    return mappers


def _a2a_mappers(status: Callable[[str, int], dict[str, Any]]) -> list[dict[str, Any]]:
    """A2A's error shape for Envoy's own replies on A2A's HTTP+JSON paths."""
    paths = a2a_replies.a2a_paths()

    def mapper(status_filter: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        return {
            "filter": {"and_filter": {"filters": [paths, status_filter]}},
            "body_format_override": {"json_format": body, "content_type": "application/json"},
        }

    shaped = edge_rows.edge_a2a_errors()
    mappers = [
        guards.shed(
            mapper(status("EQ", code), a2a_replies.a2a_error(*row, "%LOCAL_REPLY_BODY%")), code
        )
        for code, row in shaped.items()
    ]
    server, client = shaped[500], shaped[400]
    mappers += [
        mapper(status("GE", 500), a2a_replies.a2a_error(*server, "%LOCAL_REPLY_BODY%")),
        mapper(status("GE", 400), a2a_replies.a2a_error(*client, "%LOCAL_REPLY_BODY%")),
    ]
    return mappers
