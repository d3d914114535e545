"""Mutual TLS between mesh members.

Every member holds a certificate signed by the mesh's CA and presents it both
as a server (its port refuses any client without a certificate from that CA)
and as a client (it verifies the peer's certificate and host name). Without TLS
files a member speaks plaintext, which is only safe on loopback or a private
network; the mesh key still guards the internal RPCs either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from pydantic import BaseModel, ConfigDict


class TlsFiles(BaseModel):
    """PEM files of one mesh member: the CA that signs every member, and this
    member's certificate (chain) and private key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ca_file: Path
    cert_file: Path
    key_file: Path


class TlsConfigError(ValueError):
    """A TLS file is missing or unreadable; the message names it."""


def tls_files(ca: str | None, cert: str | None, key: str | None) -> TlsFiles | None:
    """All three paths, or none of them (plaintext); anything else is an error."""
    given = {"--tls-ca": ca, "--tls-cert": cert, "--tls-key": key}
    if not any(given.values()):
        return None
    missing = [flag for flag, value in given.items() if not value]
    if missing:
        raise TlsConfigError(
            f"mutual TLS needs all of --tls-ca, --tls-cert, --tls-key; missing {', '.join(missing)}"
        )
    return TlsFiles(ca_file=Path(ca or ""), cert_file=Path(cert or ""), key_file=Path(key or ""))


def _read(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TlsConfigError(f"cannot read the {what} {path}: {exc.strerror}") from exc
    if b"-----BEGIN " not in data:
        raise TlsConfigError(f"the {what} {path} is not a PEM file")
    return data


@dataclass(frozen=True)
class Transport:
    """How this process listens and calls other mesh members."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None

    @classmethod
    def from_files(cls, files: TlsFiles | None) -> Transport:
        if files is None:
            return PLAINTEXT
        return cls(
            ca=_read(files.ca_file, "CA certificate"),
            cert=_read(files.cert_file, "certificate"),
            key=_read(files.key_file, "private key"),
        )

    @property
    def secure(self) -> bool:
        return self.ca is not None

    def bind(self, server: grpc.aio.Server, address: str) -> int:
        if not self.secure:
            return server.add_insecure_port(address)
        assert self.cert is not None and self.key is not None
        credentials = grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.ca, require_client_auth=True
        )
        return server.add_secure_port(address, credentials)

    def channel(self, address: str, options: Sequence[tuple[str, int | str]]) -> grpc.aio.Channel:
        if not self.secure:
            return grpc.aio.insecure_channel(address, options=options)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )
        return grpc.aio.secure_channel(address, credentials, options=options)


PLAINTEXT = Transport()
