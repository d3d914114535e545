"""The short chaos run inside `make test` (`make chaos` runs the long one),
next to a CPU hog: faults follow each other by events (a member back, turns
landed), never by the clock, so a busy machine only stretches the run."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.chaos import chaos


@pytest.fixture
def cpu_hog() -> Iterator[None]:
    """One core kept busy for the whole run, as on a shared CI machine."""
    hog = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        yield
    finally:
        hog.kill()  # by its PID: the one process this fixture started
        hog.wait()


@pytest.mark.usefixtures("cpu_hog")
@pytest.mark.parametrize("store", ["redis", "postgres"])
async def test_chaos_loses_and_duplicates_nothing(tmp_path: Path, store: str) -> None:
    report = tmp_path / "chaos.json"
    counts = await chaos(seconds=12, conversations=64, report=report, store=store)
    assert report.exists()
    assert counts.turns_finished > 64, counts
    assert counts.hung == 0, counts
    assert counts.lost == 0, counts
    assert counts.duplicated == 0, counts
    assert counts.partial == 0, counts
    assert counts.resumed_seq_errors == 0, counts
    assert counts.unexplained_503 == 0, counts
    assert any("SIGSTOP server" in f for f in counts.faults), counts.faults
    assert any("SIGCONT server" in f for f in counts.faults), counts.faults
    assert any("SIGKILL server" in f for f in counts.faults), counts.faults
    assert any("SIGKILL router" in f for f in counts.faults), counts.faults
    assert any("restart router" in f for f in counts.faults), counts.faults
    assert counts.turns_without_router > 0, counts
