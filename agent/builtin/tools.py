"""Tools that ship with turnmesh, for agent files and examples."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from turnmesh.agent.builtin._calculator import calculate


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (+ - * / ** and parentheses) exactly."""
    return calculate(expression)


def current_time(timezone: str = "UTC") -> str:
    """The current date and time in an IANA time zone, e.g. Europe/Paris."""
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        return f"error: unknown time zone {timezone!r}"
    return datetime.now(UTC).astimezone(zone).isoformat(timespec="seconds")
