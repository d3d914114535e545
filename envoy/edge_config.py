"""What one edge is: ``EdgeConfig`` (where Envoy listens, which session
servers it calls) and ``EdgeGuards`` (its limits), with their defaults.

``config.render`` turns them into Envoy's bootstrap (``guards`` renders the
limits); ``turnmesh edge`` and ``turnmesh up`` build them from their flags.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path

import turnmesh.v1
from turnmesh.envoy.timeouts import EdgeTimeouts
from turnmesh.playground import INDEX as PLAYGROUND
from turnmesh.runtime.tls import TlsFiles

# The descriptor set ships inside the generated package (package data), in a
# checkout and an installed wheel alike.
DESCRIPTOR_SET = Path(turnmesh.v1.__file__).resolve().parent / "turnmesh.binpb"

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_ADMIN_PORT = 9901
DEFAULT_CORS_ORIGINS = ("http://localhost:3000",)

# Requests a second one client IP may make, sustained; bursts of twice that.
# Generous: behind NAT one address is many people.
DEFAULT_RATE_LIMIT_PER_IP = 200
DEFAULT_MAX_STREAMS_PER_CONNECTION = 100
MAX_STREAMS = 2**31 - 1  # HTTP/2's own ceiling
DEFAULT_MAX_HEAP_MB = 1024
# Connections open at once, across all clients (file descriptors: Envoy needs
# about as many again upstream).
DEFAULT_MAX_CONNECTIONS = 10_000

_HOST = re.compile(r"^(\*\.)?[a-z0-9]([a-z0-9.-]*[a-z0-9])?$|^\[[0-9a-f:.]+\]$")
_PORT = re.compile(r":\d+$")


@dataclass(frozen=True)
class EdgeGuards:
    """Limits at the edge; each is a flag of ``turnmesh up`` and ``turnmesh edge``."""

    # Requests a second per client IP (0: no limit); bursts of twice that.
    rate_limit_per_ip: int = DEFAULT_RATE_LIMIT_PER_IP
    # Concurrent HTTP/2 streams (gRPC calls) on one connection.
    max_streams_per_connection: int = DEFAULT_MAX_STREAMS_PER_CONNECTION
    # Envoy's heap; requests are shed (429) at 95 % of it.
    max_heap_mb: int = DEFAULT_MAX_HEAP_MB
    # Host names (besides localhost and the listen address) the API answers
    # to; "*": any. Empty: any on a keyed mesh, only those on a keyless one.
    allowed_hosts: tuple[str, ...] = ()
    # Proxies in front of Envoy that append X-Forwarded-For (0: the peer's
    # address is the client's; a client's own header is never trusted).
    trusted_proxy_hops: int = 0

    def __post_init__(self) -> None:
        if self.rate_limit_per_ip < 0 or self.trusted_proxy_hops < 0:
            raise ValueError("--rate-limit-per-ip and --trusted-proxy-hops cannot be negative")
        if not 1 <= self.max_streams_per_connection <= MAX_STREAMS:
            raise ValueError(f"--max-streams-per-connection must be 1 to {MAX_STREAMS}")
        if self.max_heap_mb < 1:
            raise ValueError("--max-heap-mb must be at least 1")
        for host in self.allowed_hosts:
            if host != "*":
                host_name(host)  # raises on what is no host name


def host_name(host: str) -> str:
    """A host as Envoy matches it: lower case, no port, IPv6 in brackets."""
    host = host.strip().lower()
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        name = _PORT.sub("", host) if not host.startswith("[") else host.split("]")[0] + "]"
        if not _HOST.match(name):
            raise ValueError(f"--allowed-host {host!r} is not a host name") from None
        return name
    return f"[{address}]" if address.version == 6 else str(address)


@dataclass(frozen=True)
class EdgeConfig:
    """Where Envoy listens and which session servers it sends calls to."""

    upstreams: list[str]
    # The same servers' WebSocket listeners (AReaL's /ws; `server --ws-port`).
    ws_upstreams: list[str] = field(default_factory=list)
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    admin_port: int = 0
    descriptor_set: Path = DESCRIPTOR_SET
    health_check_interval_ms: int = 1000
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    # HTTPS on the public listener: (certificate chain, private key) PEM paths.
    listener_tls: tuple[Path, Path] | None = None
    # Mutual TLS to the session servers: the mesh CA and Envoy's own certificate.
    upstream_tls: TlsFiles | None = None
    # OTLP/gRPC collector (host:port or http://host:port) for Envoy's spans.
    otlp_endpoint: str | None = None
    # Browser origins allowed to call the API ("*": any). The playground is
    # served from this listener, so it needs no entry (same origin).
    cors_origins: tuple[str, ...] = DEFAULT_CORS_ORIGINS
    # The page served at GET / (None: no playground).
    playground: Path | None = PLAYGROUND
    # Whether the servers behind check API keys; None: not known (a
    # standalone edge without --api-keys-required or --no-key-check).
    # Unless they have none, Envoy asks them about each REST request's key
    # before reading its body (ext_authz); unless they have keys, it answers
    # only to allowed Host names (DNS rebinding). Not known: both.
    api_keys: bool | None = None
    # Per-IP, per-connection and overall limits (envoy/guards.py).
    guards: EdgeGuards = field(default_factory=EdgeGuards)
    timeouts: EdgeTimeouts = field(default_factory=EdgeTimeouts)

    @property
    def authenticate(self) -> bool:
        """Whether Envoy checks keys before bodies (ext_authz)."""
        return self.api_keys is not False
