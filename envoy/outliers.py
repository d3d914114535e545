"""How the edge leaves out an upstream that fails: the session servers'
gRPC ports and their /ws listeners alike (outlier detection, and the active
health checks)."""

from __future__ import annotations

from typing import Any

# Failures to connect in a row that leave a server out (outlier detection).
LOCAL_FAILURES_TO_EJECT = 3
HEALTH_CHECK_TIMEOUT = "5s"
UNHEALTHY_THRESHOLD = 3


def health_check(interval_ms: int, checker: dict[str, Any]) -> dict[str, Any]:
    """An active health check (``checker``: its ``grpc_health_check`` or
    ``http_health_check`` member). A slow answer is not a dead server: a
    check may take HEALTH_CHECK_TIMEOUT and a server is left out only after
    UNHEALTHY_THRESHOLD failures in a row, so one check lost on a saturated
    server (the only one, maybe) never turns every call into "no healthy
    upstream"."""
    interval = f"{interval_ms / 1000:.3f}s"
    return {
        "timeout": HEALTH_CHECK_TIMEOUT,
        "interval": interval,
        "unhealthy_threshold": UNHEALTHY_THRESHOLD,
        "healthy_threshold": 1,
        **checker,
        # Keep checking at full rate while no traffic flows (default 60 s),
        # so a server that just started is used at once.
        "no_traffic_interval": interval,
    }


def outlier_detection() -> dict[str, Any]:
    """A server that refuses connections (killed, gone) is left out at once,
    before the health check says so: only failures to connect or reset
    streams count (never a slow answer or a 5xx), and at most half the
    servers are left out (one server alone never is)."""
    return {
        "split_external_local_origin_errors": True,
        "consecutive_local_origin_failure": LOCAL_FAILURES_TO_EJECT,
        "enforcing_consecutive_local_origin_failure": 100,
        "consecutive_5xx": 2**31 - 1,
        "enforcing_consecutive_5xx": 0,
        "enforcing_consecutive_gateway_failure": 0,
        "enforcing_success_rate": 0,
        "enforcing_local_origin_success_rate": 0,
        "enforcing_failure_percentage": 0,
        "enforcing_failure_percentage_local_origin": 0,
        "interval": "1s",
        "base_ejection_time": "5s",
        "max_ejection_time": "30s",
        "max_ejection_percent": 50,
    }
