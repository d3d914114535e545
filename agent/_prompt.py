"""How a turn's attached files read in a model's prompt: shared by the agents
that hand the user's text to a model (``openai``, ``langgraph``, ``areal``),
so none of them imports another's SDK for it."""

from __future__ import annotations

from collections.abc import Sequence

from turnmesh.agent._contract import AgentFile

__all__ = ["file_context"]


def file_context(files: Sequence[AgentFile]) -> str:
    """Each file's text in a ``<file>`` element (or why it could not be read),
    to follow the user's message."""
    parts = []
    for file in files:
        name = file.filename or file.mime_type
        if file.text:
            parts.append(f"<file name={name!r} type={file.mime_type!r}>\n{file.text}\n</file>")
        elif file.error:
            parts.append(f"<file name={name!r}>could not be read: {file.error}</file>")
    return "\n\n".join(parts)
