"""Hosts on one machine: Linux network namespaces joined by veth pairs to a
bridge, each with its own address on a private subnet that exists only inside
them (iproute2's `ip netns`, as root). Everything made here is removed on
exit, even after a failure; processes are started in a host and ended by PID."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

SUBNET = "10.213.7"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@dataclass
class Host:
    name: str
    namespace: str
    address: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def run(self, argv: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.namespace, *argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self.processes.append(proc)
        return proc

    def link(self, up: bool) -> None:
        """Plug or unplug this host's network cable."""
        _ip("netns", "exec", self.namespace, "ip", "link", "set", "eth0", "up" if up else "down")


class Network:
    """``with Network(["edge", "core", ...]) as net: net.hosts["core"].address``"""

    def __init__(self, names: list[str]) -> None:
        tag = f"tm{os.getpid() % 100000}"
        self._switch = f"{tag}-sw"
        self._created: list[str] = []
        self.hosts = {
            name: Host(name, f"{tag}-{name}", f"{SUBNET}.{index + 1}")
            for index, name in enumerate(names)
        }
        self._tag = tag

    def __enter__(self) -> Network:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        _ip("netns", "add", self._switch)
        self._created.append(self._switch)
        _ip("netns", "exec", self._switch, "ip", "link", "add", "br0", "type", "bridge")
        _ip("netns", "exec", self._switch, "ip", "link", "set", "br0", "up")
        for index, host in enumerate(self.hosts.values()):
            _ip("netns", "add", host.namespace)
            self._created.append(host.namespace)
            near, far = f"{self._tag}h{index}", f"{self._tag}s{index}"
            _ip("link", "add", near, "type", "veth", "peer", "name", far)
            _ip("link", "set", near, "netns", host.namespace)
            _ip("link", "set", far, "netns", self._switch)
            ns = ("netns", "exec", host.namespace, "ip")
            _ip(*ns, "link", "set", near, "name", "eth0")
            _ip(*ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip(*ns, "link", "set", "eth0", "up")
            _ip(*ns, "link", "set", "lo", "up")
            _ip("netns", "exec", self._switch, "ip", "link", "set", far, "master", "br0")
            _ip("netns", "exec", self._switch, "ip", "link", "set", far, "up")

    def close(self) -> None:
        for host in self.hosts.values():
            for proc in host.processes:
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGTERM)
        for host in self.hosts.values():
            for proc in host.processes:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
        # Deleting a namespace deletes its end of each veth pair, and the pair.
        for namespace in reversed(self._created):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
        self._created.clear()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def namespaces(self) -> list[str]:
        return list(self._created)
