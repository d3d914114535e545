"""Command-line flags: names, aliases, the TLS file rules, and the servers' settings
that `turnmesh up` passes on (from its flags, config file and environment)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from turnmesh.cli._flags import scalar as _scalar
from turnmesh.cli._up_config import UP_SERVER_FLAGS, UpConfig, load
from turnmesh.cli.main import _component, build_parser, main
from turnmesh.cli.up import _server_args, up_flags
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


# `turnmesh up` and the servers' settings it passes on (ServerConfig fields whose Flag is `up`).


def _up(argv: list[str], config_file: Path | None = None) -> UpConfig:
    """What `up` makes of a command line and a config file, as run_up does."""
    return load(config_file, up_flags(build_parser().parse_args(["up", *argv])))


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No TURNMESH_* variable from the shell running the tests."""
    for name in [n for n in os.environ if n.startswith("TURNMESH_")]:
        monkeypatch.delenv(name)
    return monkeypatch


def test_up_restates_no_server_default_and_passes_only_what_is_given(
    no_env: pytest.MonkeyPatch,
) -> None:
    from turnmesh.server import ServerConfig

    assert not set(UP_SERVER_FLAGS) & set(UpConfig.model_fields)
    config = _up([])
    assert config.server_args() == []
    argv = _server_args(config, "127.0.0.1:7000", "demo")
    assert not {f.flag for f in UP_SERVER_FLAGS.values()} & set(argv)
    assert "--log-level" not in argv  # the members' own default too
    assert config.store == ServerConfig.model_fields["store"].default
    assert config.api_keys_file is None
    config = _up(["--store", "sqlite:/tmp/s.db", "--max-turns", "8", "--session-ttl", "5"])
    assert config.server_args() == [
        "--session-ttl", "5.0", "--max-turns", "8", "--store", "sqlite:/tmp/s.db",
    ]  # fmt: skip
    assert config.store == "sqlite:/tmp/s.db"
    argv = _server_args(config, "127.0.0.1:7000", "demo")
    assert argv.count("--session-ttl") == 1 and argv.count("--store") == 1


def test_every_server_flag_of_up_reaches_a_servers_config(no_env: pytest.MonkeyPatch) -> None:
    """Each flag, given to `up`, is what the server's own flag parses to."""
    from turnmesh.server import ServerConfig

    samples: dict[object, str] = {int: "7", float: "2.5", str: "text"}
    argv: list[str] = []
    for f in UP_SERVER_FLAGS.values():
        argv += [f.flag, samples[_scalar(ServerConfig.model_fields[f.field].annotation)]]
    config = _up(argv)
    _, server, _ = _component(build_parser().parse_args(["server", *config.server_args()]))
    assert isinstance(server, ServerConfig)
    for f in UP_SERVER_FLAGS.values():
        parse = _scalar(ServerConfig.model_fields[f.field].annotation)
        assert getattr(server, f.field) == parse(samples[parse]), f.flag
        assert getattr(server, f.field) == config.server_setting(f.field), f.flag


def test_up_ranks_flag_over_file_over_environment(
    no_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A server setting's variable is the server's own: TURNMESH_EVENT_LOG_TTL_SECONDS
    # for --event-log-ttl (`turnmesh server` reads the same).
    no_env.setenv("TURNMESH_SESSION_TTL", "60")
    no_env.setenv("TURNMESH_EVENT_LOG_TTL_SECONDS", "70")
    no_env.setenv("TURNMESH_MAX_TURNS", "")  # empty: unset, as the server reads it
    config = _up([])
    assert config.server_args() == ["--session-ttl", "60.0", "--event-log-ttl", "70.0"]
    toml = tmp_path / "turnmesh.toml"
    toml.write_text("[up]\nsession_ttl = 61\nevent_log_ttl = 71\nstore = 'sqlite:a.db'\n")
    config = _up([], toml)
    assert (config.server_setting("session_ttl_seconds"), config.store) == (61.0, "sqlite:a.db")
    assert config.server_setting("event_log_ttl_seconds") == 71.0
    config = _up(["--session-ttl", "62", "--store", "memory"], toml)
    assert config.server_args() == [
        "--session-ttl", "62.0", "--event-log-ttl", "71.0", "--store", "memory",
    ]  # fmt: skip


def test_up_ranks_its_file_over_the_environment_for_edge_limits_too(
    no_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    no_env.setenv("TURNMESH_RATE_LIMIT_PER_IP", "5")
    assert _up([]).rate_limit_per_ip == 5
    toml = tmp_path / "turnmesh.toml"
    toml.write_text("rate_limit_per_ip = 7\n")
    assert _up([], toml).rate_limit_per_ip == 7
    assert _up(["--rate-limit-per-ip", "9"], toml).rate_limit_per_ip == 9


def test_up_help_shows_the_servers_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    from turnmesh.server import ServerConfig

    with pytest.raises(SystemExit):
        build_parser().parse_args(["up", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag, field in (
        ("--session-ttl", "session_ttl_seconds"),
        ("--max-turns", "max_turns_in_flight"),
    ):
        default = ServerConfig.model_fields[field].default
        assert f"{flag} {flag.removeprefix('--').upper().replace('-', '_')} " in text
        assert f"(default: {default})" in text


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], run_dir: Path) -> str:
    """`up`'s one line when it refuses to start (exit 2, nothing started)."""
    usr1 = signal.getsignal(signal.SIGUSR1)  # run_up installs its own
    try:
        with pytest.raises(SystemExit) as exited:
            main(["up", "--run-dir", str(run_dir), "--port", "0", *argv])
    finally:
        signal.signal(signal.SIGUSR1, usr1)
    assert exited.value.code == 2
    assert not run_dir.exists()
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_up_refuses_bad_server_settings_before_anything_starts(
    no_env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    assert _refused(["--session-ttl", "0"], capsys, run_dir) == (
        "turnmesh up: invalid setting session_ttl (--session-ttl, TURNMESH_SESSION_TTL): "
        "Input should be greater than 0 (got 0.0)"
    )
    assert "invalid float value: 'soon'" in _refused(["--session-ttl", "soon"], capsys, run_dir)
    toml = tmp_path / "turnmesh.toml"
    toml.write_text("[up]\nmax_turns = 'many'\n")
    line = _refused(["--config", str(toml)], capsys, run_dir)
    assert line.startswith("turnmesh up: invalid setting max_turns (--max-turns, ")
    assert line.endswith("(got 'many')")
    toml.write_text("[up]\nsession_tll = 5\n")
    line = _refused(["--config", str(toml)], capsys, run_dir)
    assert line == "turnmesh up: invalid setting session_tll: Extra inputs are not permitted"
    no_env.setenv("TURNMESH_EVENT_LOG_TTL_SECONDS", "-1")
    line = _refused([], capsys, run_dir)
    assert "invalid setting event_log_ttl (--event-log-ttl, TURNMESH_EVENT_LOG_TTL_SECONDS)" in line


def test_a_bad_variable_of_one_command_is_no_other_commands_traceback(
    no_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every command's flags are built each time; a variable is converted only
    # for the command that runs.
    no_env.setenv("TURNMESH_HEARTBEAT_INTERVAL", "soon")
    no_env.setenv("TURNMESH_CONCURRENCY", "many")
    assert build_parser().parse_args(["up"]).session_ttl is None
    for command, flag in (("router", "--heartbeat-interval"), ("edge", "--concurrency")):
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args([command])
        assert exited.value.code == 2
        assert f"argument {flag}: invalid" in capsys.readouterr().err


def test_a_postgresql_store_comes_from_the_file_or_the_environment(
    no_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`store` in turnmesh.toml or TURNMESH_STORE names a PostgreSQL database
    as any other store, and every server `up` starts gets it."""
    url = "postgresql://tm@db.internal/turnmesh?pool_max=4"
    no_env.setenv("TURNMESH_STORE", url)
    assert _up([]).server_args()[-2:] == ["--store", url]
    toml = tmp_path / "turnmesh.toml"
    toml.write_text("[up]\nstore = 'postgres://tm@other/turnmesh'\nservers = 2\n")
    config = _up([], toml)
    assert (config.store, config.servers) == ("postgres://tm@other/turnmesh", 2)
    assert config.server_args()[-2:] == ["--store", "postgres://tm@other/turnmesh"]
