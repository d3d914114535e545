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


def test_unset_flags_take_the_configs_own_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    from turnmesh.router import RouterConfig
    from turnmesh.server import ServerConfig
    from turnmesh.worker import WorkerConfig

    for command, model in (
        ("router", RouterConfig),
        ("server", ServerConfig),
        ("worker", WorkerConfig),
    ):
        _, config, _ = _component(build_parser().parse_args([command]))
        assert isinstance(config, model)
        for name, field in model.model_fields.items():
            if name in ("port", "router_address", "mesh_key", "tls", "allow_open"):
                continue  # the commands' own: well-known ports, the local router
            assert getattr(config, name) == field.get_default(call_default_factory=True), name


def test_the_environment_sets_a_field_and_a_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNMESH_SESSION_TTL", "60")
    monkeypatch.setenv("TURNMESH_MAX_TURNS", "8")
    _, config, _ = _component(build_parser().parse_args(["server"]))
    assert (config.session_ttl_seconds, config.max_turns_in_flight) == (60.0, 8)  # type: ignore[attr-defined]
    _, config, _ = _component(build_parser().parse_args(["server", "--session-ttl", "5"]))
    assert config.session_ttl_seconds == 5.0  # type: ignore[attr-defined]


def test_help_shows_the_defaults_of_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    from turnmesh.server import ServerConfig

    with pytest.raises(SystemExit):
        build_parser().parse_args(["server", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for field, flag in (
        ("session_ttl_seconds", "--session-ttl"),
        ("max_turns_in_flight", "--max-turns"),
        ("max_sessions", "--max-sessions"),
        ("keepalive_seconds", "--keepalive"),
    ):
        assert flag in text
        assert f"(default: {ServerConfig.model_fields[field].default})" in text


def test_every_config_refuses_unknown_keys() -> None:
    from pydantic import BaseModel, ValidationError

    from turnmesh.cli._up_config import UpConfig
    from turnmesh.router import RouterConfig
    from turnmesh.server import ServerConfig, SessionLimits
    from turnmesh.worker import WorkerConfig

    cases: list[tuple[type[BaseModel], dict[str, object]]] = [
        (RouterConfig, {}),
        (ServerConfig, {"router_address": "127.0.0.1:7000"}),
        (SessionLimits, {}),
        (WorkerConfig, {}),
        (UpConfig, {}),
        (TlsFiles, {"ca_file": "a", "cert_file": "b", "key_file": "c"}),
    ]
    for model, required in cases:
        model(**required)
        with pytest.raises(ValidationError, match="session_tll"):
            model(**required, session_tll=5)
