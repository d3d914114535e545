"""How the demo agent answers from attached files: the line that shares the
most words with the question, quoted with the file's name."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from turnmesh.agent._contract import AgentFile

T = TypeVar("T")

_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset(
    {
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "do",
        "does",
        "file",
        "files",
        "for",
        "from",
        "how",
        "i",
        "in",
        "is",
        "it",
        "me",
        "of",
        "on",
        "or",
        "say",
        "says",
        "tell",
        "that",
        "the",
        "this",
        "to",
        "was",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "with",
        "you",
        "your",
        "document",
    }
)


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def _lines(text: str) -> list[str]:
    parts = re.split(r"\n+|(?<=[.!?])\s+", text)
    return [p.strip(" |#-") for p in parts if p.strip(" |#-")]


# Earlier files' text a turn reads at most, newest first: five files at the
# worker's cap. A seeded history may hold 64 MiB of it, which took seconds a turn.
MAX_HISTORY_CHARS = 1_000_000
# More text than this is scanned in a thread: the worker's event loop serves
# every turn (and its heartbeats) meanwhile.
INLINE_CHARS = 100_000


def files_in_history(
    history: Sequence[dict[str, Any]], max_chars: int = MAX_HISTORY_CHARS
) -> list[AgentFile]:
    """The files of earlier turns, newest first, as the worker read them, as
    far back as ``max_chars`` characters of their text."""
    found: list[AgentFile] = []
    chars = 0
    for message in reversed(history):
        for file in message.get("files", ()):
            text = file.get("text") or ""
            if chars + len(text) > max_chars:
                return found
            chars += len(text)
            found.append(
                AgentFile(
                    filename=str(file.get("filename", "")),
                    mime_type=str(file.get("mime_type", "")),
                    content=b"",
                    text=text or None,
                )
            )
    return found


async def off_loop(files: Sequence[AgentFile], scan: Callable[..., T], *args: Any) -> T:
    """``scan(*args)`` over the files' text: inline when it is short, else in a thread."""
    if sum(len(f.text or "") for f in files) <= INLINE_CHARS:
        return scan(*args)
    return await asyncio.to_thread(scan, *args)


def best_line(question: str, files: Sequence[AgentFile]) -> tuple[str, str] | None:
    """(file name, line) of the line sharing the most words with the question."""
    wanted = _words(question)
    best: tuple[int, str, str] = (0, "", "")
    for file in files:
        for line in _lines(file.text or ""):
            score = len(wanted & _words(line))
            if score > best[0]:
                best = (score, file.filename or file.mime_type, line)
    return (best[1], " ".join(best[2].split())) if best[0] else None


def answer_from_files(question: str, files: Sequence[AgentFile]) -> str:
    found = best_line(question, files)
    parts = []
    if found is not None:
        parts.append(f'From {found[0]}: "{found[1]}".')
    else:
        readable = [f.filename or f.mime_type for f in files if f.text]
        if readable:
            parts.append(f"I read {', '.join(readable)} but found nothing about that.")
    parts += [f"I could not read {f.filename or f.mime_type}: {f.error}." for f in files if f.error]
    return " ".join(parts)
