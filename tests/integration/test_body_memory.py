"""A server's memory returns to its baseline after large and refused
bodies, on every surface that takes one (``tests/support/big_bodies.py``:
REST through Envoy, gRPC straight at the server; refused as not JSON, as
too many values, as a message too long; accepted with a file). Before,
each such body stayed in memory (20-35 MiB for a 20 MiB body, until a rare
cyclic collection), so a few dozen took a server past hundreds of MiB.
``python -m bench.body_memory`` sends hundreds, bigger.

Resident memory, not time: the margin holds on a slow machine as on a fast
one; the settling is polled with a generous bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.body_memory import Sampler, phase
from tests.support.big_bodies import kinds, rss_mib
from tests.support.mesh import Mesh

# A body's size: big enough that keeping it shows (main kept 8-14 MiB of
# each of these), small enough for a quick test.
BODY_BYTES = 8 * 2**20
# What a server may keep after a pass of bodies, past its baseline: the
# README's bound (at most 32 MiB above the baseline once idle).
MARGIN_MIB = 32.0
# Sent at once: the receipt slots of one connection (the edge's).
CONCURRENCY = 4


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Mesh, str]]:
    mesh = Mesh(Path(tmp_path_factory.mktemp("body-memory")))
    try:
        mesh.start_router()
        worker = mesh.spawn_worker("echo", "echo")
        server = mesh.spawn_server("server", "--agent", "echo")
        mesh.wait_ready(worker, server)
        envoy = mesh.start_envoy([server])
        yield mesh, envoy.listener_address
    finally:
        mesh.stop()


async def test_large_and_refused_bodies_leave_no_memory_behind(mesh: tuple[Mesh, str]) -> None:
    """The benchmark's own rounds, smaller (so it cannot rot either)."""
    running, edge = mesh
    server = next(c for c in running.components if c.name == "server")
    sampler = Sampler(server.pid)
    megabytes = BODY_BYTES / 2**20
    try:
        # A first round loads what each surface needs (and its first large
        # file turn what that needs): the baseline is after it.
        warm = await phase("warm-up", server, edge, megabytes, 1, CONCURRENCY, sampler)
        large = await phase("large", server, edge, megabytes, 1, CONCURRENCY, sampler)
    finally:
        await sampler.stop()
    assert warm["outcomes"] == large["outcomes"] == {"expected": len(kinds())}
    baseline = warm["rounds"][-1]["after_mib"]
    after = float(large["rounds"][-1]["after_mib"])
    # Trims run half a second after large requests end: poll, generously.
    for _ in range(300):
        if after <= baseline + MARGIN_MIB:
            break
        await asyncio.sleep(0.2)
        after = rss_mib(server.pid)
    assert after <= baseline + MARGIN_MIB, (
        f"{len(kinds())} bodies of {megabytes:g} MiB left the server at {after:.0f} MiB,"
        f" {after - baseline:+.0f} MiB from its baseline of {baseline} MiB"
    )
