"""Who may bind a public address, for the commands that front the mesh.

A member (router, server, worker) checks its own bind in
``serving.check_bind_host``. ``turnmesh up`` and ``turnmesh edge`` put Envoy on
the public address, so they check the same thing before anything starts: a
non-loopback bind needs what makes it safe, or an explicit ``--allow-open``.
"""

from __future__ import annotations

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class ExposureRefused(ValueError):
    """A public bind without what makes it safe; the text is one line."""


def is_loopback(host: str) -> bool:
    return host.strip("[]") in LOOPBACK_HOSTS


def _host_of(address: str) -> str:
    return address.rpartition(":")[0] or address


def check_up_exposure(host: str, *, api_keys: bool, allow_open: bool) -> None:
    """`up` always has a mesh key; what a public port adds is the API keys."""
    if is_loopback(host) or api_keys or allow_open:
        return
    raise ExposureRefused(
        f"refusing to serve on {host} without API keys: pass --api-keys-file FILE (or set "
        "TURNMESH_API_KEYS), or --allow-open to expose an unauthenticated API"
    )


def check_edge_exposure(
    host: str,
    *,
    listener_tls: bool,
    upstream_tls: bool,
    upstreams: list[str],
    allow_open: bool,
) -> None:
    """The edge holds no keys: callers' API keys pass through it to the
    servers, so a public edge must not carry them in clear on either side.
    Envoy gets no mesh key (servers let its holders skip the API-key check),
    so mutual TLS is the one way to secure its calls across the network."""
    if is_loopback(host) or allow_open:
        return
    missing = []
    if not listener_tls:
        missing.append("HTTPS (--edge-tls-cert, --edge-tls-key)")
    if not upstream_tls and not all(is_loopback(_host_of(u)) for u in upstreams):
        missing.append("mutual TLS to the servers (--tls-ca, --tls-cert, --tls-key)")
    if missing:
        raise ExposureRefused(
            f"refusing to serve on {host} without {' and '.join(missing)}: callers' API keys "
            "would cross the network in clear; pass --allow-open if TLS ends in front of "
            "Envoy and the network to the servers is trusted"
        )
