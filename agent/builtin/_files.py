"""How the demo agent answers from attached files: the line that shares the
most words with the question, quoted with the file's name."""

from __future__ import annotations

import re
from collections.abc import Sequence

from turnmesh.agent._contract import AgentFile

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


def answer_from_files(question: str, files: Sequence[AgentFile]) -> str:
    wanted = _words(question)
    best: tuple[int, str, str] = (0, "", "")
    for file in files:
        for line in _lines(file.text or ""):
            score = len(wanted & _words(line))
            if score > best[0]:
                best = (score, file.filename or file.mime_type, line)
    parts = []
    if best[0]:
        parts.append(f'From {best[1]}: "{" ".join(best[2].split())}".')
    else:
        readable = [f.filename or f.mime_type for f in files if f.text]
        if readable:
            parts.append(f"I read {', '.join(readable)} but found nothing about that.")
    parts += [f"I could not read {f.filename or f.mime_type}: {f.error}." for f in files if f.error]
    return " ".join(parts)
