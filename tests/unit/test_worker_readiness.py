"""Readiness of the default agent: up at once, down only after misses in a row."""

from __future__ import annotations

from turnmesh.server.workers.readiness import AgentReadiness


def _ready(readiness: AgentReadiness) -> bool:
    # A call, so that the type checker does not narrow the attribute across observe().
    return readiness.ready


def test_ready_as_soon_as_a_worker_is_listed() -> None:
    readiness = AgentReadiness("demo", misses=3)
    assert not _ready(readiness)
    assert not readiness.observe(False)  # not ready yet: nothing to withdraw
    assert readiness.observe(True)
    assert _ready(readiness)
    assert not readiness.observe(True)  # no change


def test_withdrawn_only_after_misses_in_a_row() -> None:
    readiness = AgentReadiness("demo", misses=3)
    readiness.observe(True)
    assert not readiness.observe(False)
    assert not readiness.observe(False)
    assert readiness.observe(True) is False  # back before the third miss: no flap
    assert _ready(readiness)
    assert not readiness.observe(False)
    assert not readiness.observe(False)
    assert readiness.observe(False)  # the third in a row
    assert not _ready(readiness)
    assert not readiness.observe(False)
    assert readiness.observe(True)
