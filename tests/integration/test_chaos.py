"""The short chaos run inside `make test` (`make chaos` runs the long one)."""

from __future__ import annotations

from pathlib import Path

from tests.support.chaos import chaos


async def test_chaos_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    report = tmp_path / "chaos.json"
    counts = await chaos(seconds=20, conversations=64, report=report)
    assert report.exists()
    assert counts.turns_finished > 64, counts
    assert counts.hung == 0, counts
    assert counts.lost == 0, counts
    assert counts.duplicated == 0, counts
    assert counts.partial == 0, counts
    assert counts.resumed_seq_errors == 0, counts
    assert any("SIGKILL server" in f for f in counts.faults), counts.faults
    assert any("restart router" in f for f in counts.faults), counts.faults
