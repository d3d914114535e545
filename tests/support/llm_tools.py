"""Tools for the LLM agent tests (imported by the worker: this folder is on
its PYTHONPATH)."""

from __future__ import annotations

import asyncio


def broken(text: str) -> str:
    """A tool that always fails."""
    raise RuntimeError("internal detail: the database password is hunter2")


async def slow(seconds: float) -> str:
    """A tool that takes its time."""
    await asyncio.sleep(seconds)
    return "finally done"


def transfer(amount: int) -> str:
    """Move money (the agent file makes its calls wait for approval)."""
    return f"moved {amount}"
