"""Helpers shared by the built-in agents."""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping
from typing import Any

from turnmesh.agent._contract import EventEmitter

MAX_DELAY_MS = 10_000

# A word with its following whitespace; leading whitespace stays with the first word.
_WORD = re.compile(r"\s*\S+\s*")


def split_words(text: str) -> list[str]:
    """Pieces of ``text``, one per word, that concatenate back to ``text`` exactly."""
    words = _WORD.findall(text)
    if not words and text:
        return [text]  # whitespace only
    return words


def delay_seconds(metadata: Mapping[str, Any]) -> float:
    """``metadata["delay_ms"]`` clamped to 0..10000, in seconds (0 when absent or bad)."""
    value = metadata.get("delay_ms")
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return 0.0
    return min(max(float(value), 0.0), MAX_DELAY_MS) / 1000


async def stream_words(emitter: EventEmitter, text: str, delay: float) -> None:
    """Emit ``text`` word by word, sleeping ``delay`` seconds between deltas."""
    for index, word in enumerate(split_words(text)):
        if index and delay:
            await asyncio.sleep(delay)
        await emitter.emit_delta(word)


def word_count(text: str) -> int:
    return len(text.split())
