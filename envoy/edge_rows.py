"""The rows of Envoy's own replies (it never asked a server), from the one
error table (``turnmesh.runtime.errors``): the row each HTTP status takes, or
one only the edge has, in the mesh's problem+json, on A2A's paths and in A2A's
JSON-RPC envelope. ``envoy/replies.py`` renders Envoy's local replies from them."""

from __future__ import annotations

from turnmesh.runtime.errors import (
    JSONRPC_INTERNAL_ERROR,
    JSONRPC_INVALID_REQUEST,
    Cancelled,
    DeadlineExceeded,
    InvalidArgument,
    InvalidRequest,
    MethodNotFound,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    TurnmeshError,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)

_EDGE_KINDS: dict[int, type[TurnmeshError]] = {
    400: InvalidArgument,
    401: Unauthenticated,
    403: PermissionDenied,
    404: NotFound,
    429: ResourceExhausted,
    499: Cancelled,
    500: TurnmeshError,
    501: Unimplemented,
    503: Unavailable,
    504: DeadlineExceeded,
}
_EDGE_ONLY: dict[int, tuple[str, str, str]] = {
    405: ("method-not-allowed", "Method not allowed", "invalid_request_error"),
    408: ("request-timeout", "Request timeout", "invalid_request_error"),
    413: ("payload-too-large", "Payload too large", "invalid_request_error"),
    # A cross-origin POST whose body is not JSON (envoy/guards.py).
    415: ("unsupported-media-type", "Unsupported media type", "invalid_request_error"),
    # A Host the edge does not answer to (envoy/guards.py).
    421: ("misdirected-request", "Misdirected request", "invalid_request_error"),
    431: (
        "request-header-fields-too-large",
        "Request header fields too large",
        "invalid_request_error",
    ),
    502: ("bad-gateway", "Bad gateway", "server_error"),
}
# Any other status Envoy answers with.
EDGE_FALLBACK = ("error", "Error")


def edge_jsonrpc_error(status: int) -> tuple[int, str]:
    """The JSON-RPC code and ErrorInfo reason of Envoy's own reply with this
    HTTP status: its row's, or for a status only the edge answers (413 …)
    JSON-RPC's invalid request (a 4xx) or internal error (a 5xx)."""
    kind = _EDGE_KINDS.get(status)
    if kind is not None:
        return kind.jsonrpc_code(), kind.reason_name()
    slug = _EDGE_ONLY.get(status, EDGE_FALLBACK)[0]
    code = JSONRPC_INTERNAL_ERROR if status >= 500 else JSONRPC_INVALID_REQUEST
    return code, slug.upper().replace("-", "_")


# Envoy's own replies on A2A's HTTP+JSON paths: A2A's row where A2A has one
# (a request the edge cannot read as one, a path that names no method), else
# the mesh's row for the status (a refused key, a rate limit, no server: A2A
# has no error for those, and its clients keep the HTTP status).
_EDGE_A2A_KINDS: dict[int, type[TurnmeshError]] = {
    **_EDGE_KINDS,
    400: InvalidRequest,
    404: MethodNotFound,
    405: InvalidRequest,
    408: DeadlineExceeded,
    413: InvalidRequest,
    415: InvalidRequest,
    421: InvalidRequest,
    431: InvalidRequest,
    502: Unavailable,
}


def edge_a2a_errors() -> dict[int, tuple[str, str, str]]:
    """(gRPC code name, ErrorInfo reason, domain) per HTTP status that Envoy
    answers by itself on A2A's paths."""
    return {
        status: (kind.code.name, kind.reason_name(), kind.domain)
        for status, kind in sorted(_EDGE_A2A_KINDS.items())
    }


def edge_problems() -> dict[int, tuple[str, str, str]]:
    """(slug, title, OpenAI type) per HTTP status that Envoy answers by itself."""
    problems = {s: (k.slug, k.title, k.openai_type) for s, k in _EDGE_KINDS.items()}
    return dict(sorted({**problems, **_EDGE_ONLY}.items()))
