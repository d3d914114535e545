"""`turnmesh edge`: Envoy for a host or a container of its own, in front of
servers named by address or by DNS name; a public bind only with HTTPS and
mutual TLS to remote servers, or an explicit --allow-open."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import SharedMesh
from tests.support.certs import TestCA
from tests.support.mesh import wait_for
from turnmesh.envoy.process import bound_listener


@pytest.mark.parametrize("by", ["address", "dns-name"])
def test_edge_serves_the_mesh(shared_mesh: SharedMesh, tmp_path: Path, by: str) -> None:
    upstreams = [s.address for s in shared_mesh.servers]
    if by == "dns-name":
        upstreams = [a.replace("127.0.0.1", "localhost") for a in upstreams]
    args = [f"--upstream={u}" for u in upstreams]
    proc = subprocess.Popen(
        [sys.executable, "-m", "turnmesh", "edge", *args, "--port", "0", "--admin-port", "0",
         "--config-dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        admin_file = tmp_path / "envoy-admin-address"
        wait_for(lambda: admin_file.exists() and admin_file.read_text().strip() != "",
                 what="Envoy's admin address")  # fmt: skip
        admin = admin_file.read_text().strip()
        wait_for(lambda: bound_listener(admin) is not None, what="the listener")
        listener = bound_listener(admin)

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://{listener}/ready", timeout=2) as response:
                    status: int = response.status
                    return status == 200
            except OSError:
                return False

        wait_for(ready, timeout=30, what="a server ready through the edge")
        assert proc.poll() is None  # Envoy is this very process (exec)
        assert "envoy" in Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace")
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        started = time.monotonic()
        proc.wait(timeout=30)
        assert time.monotonic() - started < 10


def test_edge_without_upstreams_is_one_clear_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "turnmesh", "edge"], capture_output=True, text=True, timeout=60,
        check=False, env={k: v for k, v in os.environ.items() if not k.startswith("TURNMESH_")},
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "turnmesh edge: give at least one --upstream HOST:PORT (a session server)"
    )


FAR_UPSTREAM = "--upstream=192.0.2.10:7100"  # TEST-NET-1: never reached, never loopback


def _edge(*args: str, config_dir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "turnmesh", "edge", "--port", "0", "--admin-port", "0",
         "--config-dir", str(config_dir), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("TURNMESH_")},
        start_new_session=True,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("tls", "upstream", "missing"),
    [
        ([], "--upstream=127.0.0.1:7100", "HTTPS (--edge-tls-cert, --edge-tls-key)"),
        (["edge"], FAR_UPSTREAM, "mutual TLS to the servers (--tls-ca, --tls-cert, --tls-key)"),
        (["mesh"], FAR_UPSTREAM, "HTTPS (--edge-tls-cert, --edge-tls-key)"),
        ([], FAR_UPSTREAM, "HTTPS (--edge-tls-cert, --edge-tls-key) and mutual TLS to the "
                           "servers (--tls-ca, --tls-cert, --tls-key)"),
    ],
    ids=["no-https", "no-mtls", "no-https-far", "neither"],
)  # fmt: skip
def test_a_public_edge_without_tls_is_refused_in_one_line(
    tmp_path: Path, tls: list[str], upstream: str, missing: str
) -> None:
    proc = _edge("--host", "0.0.0.0", upstream, *_tls_flags(tmp_path, tls), config_dir=tmp_path)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.strip() == (
        f"turnmesh edge: refusing to serve on 0.0.0.0 without {missing}: callers' API keys "
        "would cross the network in clear; pass --allow-open if TLS ends in front of Envoy "
        "and the network to the servers is trusted"
    )
    assert not (tmp_path / "envoy.json").exists()


@pytest.mark.parametrize(
    ("flags", "tls", "upstream"),
    [
        (["--allow-open"], [], FAR_UPSTREAM),
        ([], ["edge", "mesh"], FAR_UPSTREAM),
        ([], ["edge"], "--upstream=127.0.0.1:7100"),  # the servers' hop stays on this host
    ],
    ids=["allow-open", "https-and-mtls", "https-loopback-servers"],
)
def test_a_public_edge_starts_with_tls_or_allow_open(
    tmp_path: Path, flags: list[str], tls: list[str], upstream: str
) -> None:
    proc = _edge("--host", "0.0.0.0", upstream, *flags, *_tls_flags(tmp_path, tls),
                 config_dir=tmp_path)  # fmt: skip
    try:
        admin_file = tmp_path / "envoy-admin-address"

        def listening() -> bool:
            assert proc.poll() is None, proc.communicate()
            admin = admin_file.read_text().strip() if admin_file.exists() else ""
            return bool(admin) and bound_listener(admin) is not None

        wait_for(listening, timeout=60, what="Envoy's public listener")
        with urllib.request.urlopen(
            f"http://{admin_file.read_text().strip()}/listeners", timeout=30
        ) as r:
            assert "::0.0.0.0:" in r.read().decode()  # bound where it was asked to
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)


def _tls_flags(tmp_path: Path, which: list[str]) -> list[str]:
    ca = TestCA(tmp_path / "ca")
    flags = []
    if "edge" in which:
        edge = ca.issue("edge")
        flags += ["--edge-tls-cert", str(edge.cert_file), "--edge-tls-key", str(edge.key_file)]
    if "mesh" in which:
        flags += ca.issue("envoy").flags()
    return flags
