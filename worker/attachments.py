"""A turn's files as the agent gets them: each file's text, read in a sandbox
process (or taken from the worker's cache of texts it read for the same
principal), with its checksum, and a CUSTOM ``file_read`` event per file so
the caller sees what the agent could read."""

from __future__ import annotations

import asyncio
import hashlib

from google.protobuf import struct_pb2

from turnmesh.agent import AgentFile
from turnmesh.files import Outcome, Sandbox
from turnmesh.files.extract import reader_version
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.worker.emitter import ET, make_event
from turnmesh.worker.extract_cache import ExtractCache


def _fingerprint(file: message_pb2.File) -> tuple[str, str]:
    return hashlib.sha256(file.content).hexdigest(), reader_version(file.mime_type)


async def _read_one(
    sandbox: Sandbox, cache: ExtractCache, file: message_pb2.File, principal: str, turn: str
) -> tuple[str, Outcome]:
    # hashlib releases the GIL on large inputs: the loop keeps serving. The
    # digest is part of the cache's key, so it comes before the read.
    sha256, version = await asyncio.to_thread(_fingerprint, file)
    outcome = await cache.read(
        (principal, sha256, version),
        lambda: sandbox.extract(file.mime_type, file.content, principal=principal, turn=turn),
    )
    return sha256, outcome


async def read_files(
    sandbox: Sandbox,
    cache: ExtractCache,
    files: list[message_pb2.File],
    *,
    principal: str,
    turn: str,
) -> tuple[list[AgentFile], list[message_pb2.FileRef]]:
    """What the agent gets, and what the history records (no bytes). The
    files wait for reader slots shared fairly among principals and turns,
    unless ``cache`` has their text."""
    results = await asyncio.gather(*(_read_one(sandbox, cache, f, principal, turn) for f in files))
    agent_files, refs = [], []
    for file, (sha256, outcome) in zip(files, results, strict=True):
        agent_files.append(
            AgentFile(
                filename=file.filename,
                mime_type=file.mime_type,
                content=file.content,
                text=outcome.text if not outcome.error else None,
                sha256=sha256,
                error=outcome.error or None,
                truncated=outcome.truncated,
            )
        )
        refs.append(
            message_pb2.FileRef(
                mime_type=file.mime_type,
                filename=file.filename,
                size_bytes=len(file.content),
                sha256=sha256,
                text=outcome.text,
                error=outcome.error,
                truncated=outcome.truncated,
            )
        )
    return agent_files, refs


def file_events(refs: list[message_pb2.FileRef]) -> list[event_pb2.Event]:
    """One ``file_read`` CUSTOM event per file: what was read, never the text."""
    events = []
    for index, ref in enumerate(refs):
        value = struct_pb2.Value()
        fields: dict[str, str | int | bool] = {
            "index": index,
            "filename": ref.filename,
            "mime_type": ref.mime_type,
            "size_bytes": ref.size_bytes,
            "sha256": ref.sha256,
            "chars": len(ref.text),
            "truncated": ref.truncated,
        }
        if ref.error:
            fields["error"] = ref.error
        value.struct_value.update(fields)
        events.append(make_event(ET.CUSTOM, name="file_read", value=value))
    return events
