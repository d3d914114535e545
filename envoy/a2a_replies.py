"""Envoy's own replies on A2A's HTTP+JSON paths (a refused key, a body or
headers too large, a rate limit, no route, no server) in A2A's HTTP+JSON
error shape, which the a2a-sdk REST client parses into its error classes:
``{"error": {"code": <HTTP status>, "status": "NOT_FOUND", "message",
"details": [google.rpc.ErrorInfo]}}`` (problem.lua gives the servers' own
errors the same shape). Reasons and domains come from the one error table
(``edge_rows.edge_a2a_errors``)."""

from __future__ import annotations

from typing import Any

ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"
# A2A's HTTP+JSON paths, bare (the default agent's) or under the agent's
# segment, before or after the transcoder rewrote :path. One regex each (RE2
# refuses a program over 100 instructions).
_A2A_PATHS = (
    r"^(/[^/?]+)?/message:(send|stream)([?].*)?$",
    r"^(/[^/?]+)?/tasks([/?].*)?$",
    r"^(/[^/?]+)?/(extendedAgentCard|\.well-known/agent-card\.json)([?].*)?$",
)


def a2a_paths() -> dict[str, Any]:
    """An access-log filter: requests to A2A's HTTP+JSON paths."""
    filters = [
        {"header_filter": {"header": {"name": name, "string_match": {"safe_regex": {"regex": r}}}}}
        for name in (":path", "x-envoy-original-path")
        for r in _A2A_PATHS
    ]
    return {"or_filter": {"filters": filters}}


def a2a_error(code_name: str, reason: str, domain: str, message: str) -> dict[str, Any]:
    """A local reply's body format in A2A's HTTP+JSON error shape."""
    info = {"@type": ERROR_INFO_TYPE, "reason": reason, "domain": domain}
    return {
        "error": {
            "code": "%RESPONSE_CODE%",
            "status": code_name,
            "message": message,
            "details": [info],
        }
    }
