"""Fixed ports for `turnmesh up`'s children, chosen before they start.

A restarted child must come back on its address (peers hold it; Envoy's
upstreams are static), so `up` cannot let each start pick any free port.
Ports come from below the kernel's ephemeral range: while a child is down,
an outgoing connection can never be given its port.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

PORT_FLOOR = 10000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_ports(count: int, host: str = "127.0.0.1", exclude: set[int] | None = None) -> list[int]:
    """`count` distinct ports free on `host` now (each was bound once), none
    of them in `exclude` (ports chosen for another host)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    low = _ephemeral_low()
    taken = exclude or set()
    candidates = [p for p in range(PORT_FLOOR, low) if p not in taken]
    if len(candidates) < 100 * count:
        candidates = []
    random.shuffle(candidates)
    held: list[socket.socket] = []
    try:
        for port in candidates:
            if len(held) == count:
                break
            s = socket.socket(family)
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                continue
            held.append(s)
        while len(held) < count:  # no room below the ephemeral range: any free port
            s = socket.socket(family)
            s.bind((host, 0))
            if s.getsockname()[1] in taken:
                s.close()
                continue
            held.append(s)
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()
