"""How long Envoy waits on a client: what bounds the time (and so the memory)
a slow or silent client can hold at the edge."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EdgeTimeouts:
    """Seconds; ``turnmesh edge --NAME-timeout`` sets each one."""

    # Until a request's headers are all in (half-sent headers: slowloris), and
    # for a TLS handshake.
    request_headers: float = 10.0
    # Until a whole request is in, body and all (the response starting also
    # ends it, so streams are never cut by it). With the 135 MiB body limit
    # this is a floor on how fast a body must arrive: 135 MiB / 300 s, about
    # 460 KiB/s (3.8 Mbit/s) for the largest body, proportionally less for a
    # smaller one; a client that trickles gets 408.
    request: float = 300.0
    # A stream (request or response) with no bytes either way: this reaps
    # streams whose peer vanished. Turns that run send a keepalive event every
    # 15 s, but a turn queued behind a long one in its session is silent until
    # it starts, so this stays long (an hour; the overload manager shortens it
    # to a minute when connections run short).
    stream_idle: float = 3600.0
    # A connection with no request in flight (an idle keep-alive connection,
    # or one that never sent a byte).
    connection_idle: float = 60.0
    # The key check (ext_authz) of one request, retries included: longer
    # than a frozen server takes to be found out (the upstream keepalive,
    # 2 s), so a check sent to one is asked again elsewhere, not refused.
    auth: float = 5.0


def _duration(seconds: float) -> str:
    return f"{seconds:.3f}s"


def manager_timeouts(timeouts: EdgeTimeouts) -> dict[str, Any]:
    """The HTTP connection manager's fields for these timeouts."""
    return {
        "request_headers_timeout": _duration(timeouts.request_headers),
        "request_timeout": _duration(timeouts.request),
        "stream_idle_timeout": _duration(timeouts.stream_idle),
        "common_http_protocol_options": {"idle_timeout": _duration(timeouts.connection_idle)},
    }
