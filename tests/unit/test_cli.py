"""Command-line flags: names, aliases and the TLS file rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from turnmesh.cli.main import _component, build_parser
from turnmesh.runtime.tls import PLAINTEXT, TlsConfigError, TlsFiles, Transport, tls_files


def test_mesh_key_flag_and_its_old_name() -> None:
    parser = build_parser()
    assert parser.parse_args(["router", "--mesh-key", "k1"]).mesh_key == "k1"
    assert parser.parse_args(["worker", "--admin-key", "k2"]).mesh_key == "k2"


def test_mesh_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNMESH_MESH_KEY", "from-env")
    assert build_parser().parse_args(["router"]).mesh_key == "from-env"
    monkeypatch.delenv("TURNMESH_MESH_KEY")
    monkeypatch.setenv("TURNMESH_ADMIN_KEY", "old-env")
    assert build_parser().parse_args(["router"]).mesh_key == "old-env"


def test_tls_flags_reach_the_component_config(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["worker", "--tls-ca", "ca.pem", "--tls-cert", "w.crt", "--tls-key", "w.key"]
    )
    _, config, _ = _component(args)
    assert config.tls == TlsFiles(  # type: ignore[attr-defined]
        ca_file=Path("ca.pem"), cert_file=Path("w.crt"), key_file=Path("w.key")
    )


def test_tls_needs_all_three_files_or_none() -> None:
    assert tls_files(None, None, None) is None
    with pytest.raises(TlsConfigError, match="missing --tls-cert, --tls-key"):
        tls_files("ca.pem", None, None)


def test_unreadable_or_non_pem_tls_files_are_named(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate")
    files = TlsFiles(ca_file=ca, cert_file=tmp_path / "missing.crt", key_file=ca)
    with pytest.raises(TlsConfigError, match=r"ca\.pem is not a PEM file"):
        Transport.from_files(files)
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    with pytest.raises(TlsConfigError, match=r"cannot read the certificate .*missing\.crt"):
        Transport.from_files(files)
    assert Transport.from_files(None) is PLAINTEXT
    assert not PLAINTEXT.secure
