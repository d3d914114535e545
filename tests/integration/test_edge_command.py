"""`turnmesh edge`: Envoy for a host or a container of its own, in front of
servers named by address or by DNS name."""

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
