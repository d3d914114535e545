"""Addresses and TLS transport sockets, for the public listener (HTTPS) and
the session servers' cluster (mutual TLS) alike."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from turnmesh.runtime.tls import TlsFiles

TLS_SOCKET = "envoy.transport_sockets.tls"
TLS_TYPES = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."


def _certificate(cert: Path, key: Path) -> dict[str, Any]:
    return {
        "certificate_chain": {"filename": str(cert)},
        "private_key": {"filename": str(key)},
    }


def listener_tls(cert: Path, key: Path) -> dict[str, Any]:
    return {
        "name": TLS_SOCKET,
        "typed_config": {
            "@type": TLS_TYPES + "DownstreamTlsContext",
            "common_tls_context": {
                "tls_certificates": [_certificate(cert, key)],
                # gRPC clients need h2 by ALPN; curl and browsers take either.
                "alpn_protocols": ["h2", "http/1.1"],
            },
        },
    }


def upstream_tls(files: TlsFiles) -> dict[str, Any]:
    return {
        "name": TLS_SOCKET,
        "typed_config": {
            "@type": TLS_TYPES + "UpstreamTlsContext",
            "common_tls_context": {
                "tls_certificates": [_certificate(files.cert_file, files.key_file)],
                # Only servers with a certificate from the mesh CA are trusted.
                "validation_context": {"trusted_ca": {"filename": str(files.ca_file)}},
                "alpn_protocols": ["h2"],
            },
        },
    }


def address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def split(host_port: str) -> tuple[str, int]:
    host, _, port = host_port.rpartition(":")
    return host.strip("[]"), int(port)


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
