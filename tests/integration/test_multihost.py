"""The mesh across hosts: six network namespaces on a private subnet (edge,
core with the router and Redis, two session servers, two workers), found by
configured addresses only. Conversations go through the edge while one server
host's cable is pulled and plugged back: sessions fail over to the other
server, and nothing is lost or duplicated. Twice: with the mesh key, and with
mutual TLS as well. (`make test-multihost` runs only this.)"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.certs import TestCA
from tests.support.mesh import SUPPORT_DIR, wait_for
from tests.support.netns import Host, Network

MESH_KEY = "multihost-mesh-key-0123456789"
API_KEY = "multihost-api-key-abcdef"
HOSTS = ["edge", "core", "server-a", "server-b", "worker-a", "worker-b"]


def _can_make_namespaces() -> bool:
    """Root, iproute2, and a kernel that lets us: probed by making one."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = f"tmprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, check=False)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return made.returncode == 0


pytestmark = pytest.mark.skipif(
    not _can_make_namespaces(),
    reason="network namespaces need root, iproute2 (make install) and a kernel that allows them",
)


@dataclass
class MultiHost:
    net: Network
    workdir: Path
    ready: dict[str, Path]

    def host(self, name: str) -> Host:
        return self.net.hosts[name]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNMESH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SUPPORT_DIR), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _turnmesh(*args: str) -> list[str]:
    return [sys.executable, "-m", "turnmesh", *args]


def _start(workdir: Path, tls: bool) -> MultiHost:
    net = Network(HOSTS).__enter__()
    try:
        return _start_components(net, workdir, tls)
    except BaseException:
        net.close()
        raise


def _start_components(net: Network, workdir: Path, tls: bool) -> MultiHost:
    env = _env()
    keys = workdir / "api-keys"
    keys.write_text(f"sha256:{hashlib.sha256(API_KEY.encode()).hexdigest()}\n")
    ca = TestCA(workdir / "ca") if tls else None
    ready: dict[str, Path] = {}

    def flags(host: Host) -> list[str]:
        common = ["--mesh-key", MESH_KEY, "--host", host.address]
        if ca is not None:
            common += ca.issue(host.name, ips=(host.address,)).flags()
        return common

    def run(host: Host, *args: str) -> None:
        ready[host.name] = workdir / f"{host.name}.ready.json"
        host.run(
            _turnmesh(*args, "--ready-file", str(ready[host.name])),
            workdir / f"{host.name}.log",
            env,
        )

    core = net.hosts["core"]
    redis = shutil.which("redis-server")
    assert redis, "redis-server is installed by `make install`"
    core.run(
        # Unprotected: this Redis lives on a subnet only these namespaces have.
        [
            redis,
            "--bind",
            core.address,
            "--port",
            "6379",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
        ],
        workdir / "redis.log",
        env,
    )
    router = f"{core.address}:7000"
    run(core, "router", "--port", "7000", "--heartbeat-interval", "0.5",
        "--heartbeat-timeout", "2", *flags(core))  # fmt: skip
    wait_for(ready["core"].exists, timeout=60, what="the router")
    for name in ("worker-a", "worker-b"):
        host = net.hosts[name]
        run(host, "worker", "--port", "7200", "--router", router, "--agent", "demo", *flags(host))
    for name in ("server-a", "server-b"):
        host = net.hosts[name]
        run(host, "server", "--port", "7100", "--router", router, "--grace-seconds", "2",
            "--store", f"redis://{core.address}:6379/0", "--api-keys-file", str(keys),
            "--lease-seconds", "2",
            *flags(host))  # fmt: skip
    for name in ("worker-a", "worker-b", "server-a", "server-b"):
        wait_for(ready[name].exists, timeout=60, what=name)
    edge = net.hosts["edge"]
    edge_flags = ["--host", edge.address, "--port", "8080", "--admin-port", "9901"]
    # The client speaks plaintext to the edge on this private subnet.
    edge_flags.append("--allow-open")
    if ca is not None:
        edge_flags += ca.issue("envoy", ips=(edge.address,)).flags()
    upstreams = [f"--upstream={net.hosts[n].address}:7100" for n in ("server-a", "server-b")]
    edge.run(
        _turnmesh("edge", *edge_flags, *upstreams, "--config-dir", str(workdir / "edge")),
        workdir / "edge.log",
        env,
    )
    return MultiHost(net, workdir, ready)


def _logs(mesh: MultiHost) -> str:
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
        for p in sorted(mesh.workdir.glob("*.log"))
    )


# `make test` runs the mTLS mesh (a real cable cut with the strictest trust);
# `make test-multihost` runs the mesh-key one too (TURNMESH_MULTIHOST_ALL=1):
# the same failover, and the mesh key's trust is covered on one host already.
ALL_TRUSTS = os.environ.get("TURNMESH_MULTIHOST_ALL") == "1"


@pytest.fixture(
    params=[
        pytest.param(
            "mesh-key",
            marks=pytest.mark.skipif(not ALL_TRUSTS, reason="make test-multihost runs it"),
        ),
        "mtls",
    ]
)
def multihost(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MultiHost]:
    mesh = _start(tmp_path, tls=request.param == "mtls")
    try:
        yield mesh
    finally:
        mesh.net.close()
    # Nothing of ours is left behind.
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert not any(ns in listed.stdout for ns in mesh.net.hosts), listed.stdout


def _progress(path: Path) -> list[int]:
    """Turns landed so far, per conversation."""
    try:
        return list(json.loads(path.read_text())["per_conversation"])
    except (OSError, ValueError, KeyError):
        return []


def _each_landed(path: Path, since: list[int], more: int, conversations: int = 8) -> bool:
    now = _progress(path)
    return len(now) == conversations and all(
        n - (since[i] if i < len(since) else 0) >= more for i, n in enumerate(now)
    )


@pytest.mark.timeout(400)
def test_sessions_fail_over_when_a_server_host_is_cut_off(multihost: MultiHost) -> None:
    edge = multihost.host("edge")
    stop, progress = multihost.workdir / "stop", multihost.workdir / "progress"
    client = edge.run(
        [sys.executable, str(SUPPORT_DIR / "multihost_client.py"),
         "--target", f"{edge.address}:8080", "--api-key", API_KEY, "--conversations", "8",
         "--stop-file", str(stop), "--progress-file", str(progress)],
        multihost.workdir / "client.log",
        _env(),
    )  # fmt: skip
    try:
        wait_for(lambda: _each_landed(progress, [], 3), timeout=90,
                 what="every conversation under way")  # fmt: skip
        server_a = multihost.host("server-a")
        cut_at, before_cut = time.time(), _progress(progress)
        server_a.link(up=False)
        # Every conversation keeps going while server-a is unreachable: the
        # sessions it owned moved to server-b.
        wait_for(lambda: _each_landed(progress, before_cut, 3), timeout=90,
                 what="every conversation landing turns during the cut")  # fmt: skip
        during_cut = sum(_progress(progress)) - sum(before_cut)
        server_a.link(up=True)
        restored_at, before_restore = time.time(), _progress(progress)
        wait_for(lambda: _each_landed(progress, before_restore, 3), timeout=90,
                 what="every conversation landing turns after the cable is back")  # fmt: skip
    except TimeoutError:
        raise AssertionError(_logs(multihost)) from None
    finally:
        stop.write_text("stop")
        try:
            client.wait(timeout=120)
        except subprocess.TimeoutExpired:
            client.kill()
    out = (multihost.workdir / "client.log").read_text()
    report = json.loads(out.strip().splitlines()[-1])
    timeline = report.pop("timeline")
    print(
        json.dumps({**report, "landed_during_cut": during_cut,
                    "cut_seconds": round(restored_at - cut_at, 1),
                    "first_turn_after_cut_s": round(
                        min((t for t, _ in timeline if t > cut_at), default=cut_at) - cut_at, 2)})
    )  # fmt: skip
    assert report["lost"] == 0, report
    assert report["duplicated"] == 0, report
    assert report["out_of_order"] == 0, report
    assert report["landed"] >= 8 * 9
