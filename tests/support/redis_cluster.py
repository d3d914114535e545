"""A throwaway three-node Redis Cluster from Debian's redis-server, on free
loopback ports, joined with ``redis-cli --cluster create`` (no replicas)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.support.mesh import POLL, READY_TIMEOUT, RedisServer, _free_port

NODES = 3
# A node also listens on its port + 10,000 (the cluster bus).
BUS_OFFSET = 10_000


def _cluster_port() -> int:
    """A free port whose bus port (+10,000) is free and below 65,536."""
    while True:
        port = _free_port()
        if port + BUS_OFFSET > 65_535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + BUS_OFFSET))
            except OSError:
                continue
        return port


class RedisCluster:
    def __init__(self, workdir: Path) -> None:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is installed by `make install` (system-deps)")
        self._cli = cli
        self.nodes: list[RedisServer] = []
        try:
            for _ in range(NODES):
                port = _cluster_port()
                node_dir = workdir / f"node-{port}"
                node_dir.mkdir(parents=True)
                self.nodes.append(
                    RedisServer(
                        node_dir,
                        port=port,
                        extra=[
                            "--cluster-enabled",
                            "yes",
                            "--cluster-config-file",
                            "nodes.conf",
                            # A busy machine may starve a node for seconds:
                            # never long enough for the others to mark it
                            # failed (no replicas: the cluster would go down).
                            "--cluster-node-timeout",
                            "120000",
                        ],
                    )
                )
            subprocess.run(
                [
                    cli,
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{n.port}" for n in self.nodes),
                    "--cluster-replicas",
                    "0",
                    "--cluster-yes",
                ],
                check=True,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=READY_TIMEOUT,
            )
            deadline = time.monotonic() + READY_TIMEOUT
            while not all(self._ok(n.port) for n in self.nodes):
                if time.monotonic() > deadline:
                    raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")
                time.sleep(POLL)
        except BaseException:
            self.stop()
            raise

    def _ok(self, port: int) -> bool:
        info = subprocess.run(
            [self._cli, "-p", str(port), "cluster", "info"],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=10,
        ).stdout
        return "cluster_state:ok" in info

    @property
    def url(self) -> str:
        """Any one node: the client finds the others."""
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def keys_per_node(self) -> list[int]:
        """How many keys each node holds (all of them: the test's cluster)."""
        counts = []
        for node in self.nodes:
            out = subprocess.run(
                [self._cli, "-p", str(node.port), "dbsize"],
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=10,
            ).stdout
            counts.append(int(out.strip()))
        return counts

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
