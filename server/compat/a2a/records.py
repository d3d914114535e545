"""A2A tasks as durable records: a task is a chain of turns (its first, whose
id the task id encodes, then one per answer given on the task), kept in the
session store beside its session (``put_task``), read and written on the
session's owner (``Mesh.task_record``), so any server finds it by its id.

A record holds what a true state needs later, when the turns' own records
(kept ``--turn-record-ttl``) and the session's pause are gone: how the task
ended outside its turns (``ended``: cancelled while it waited for input),
and, once a read has seen it end, its final status (``final``), which every
later read shows as it was.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from turnmesh.runtime.errors import NotFound
from turnmesh.server.compat._common import Mesh

# A task's turns at most (each answer to its input adds one).
MAX_TURNS = 100
CANCELLED = "cancelled"


@dataclass
class TaskRecord:
    id: str
    agent: str
    context: str  # the session's public id
    turns: list[str]
    created: float  # Unix seconds
    ended: str = ""
    # When an answer given on the task began to be started (its turn not
    # known yet; 0: none): a read then sees the task working, not its pause gone.
    answering: float = 0.0
    # The status a read saw the task end with: {"state", "time", "text"}.
    final: dict[str, Any] = field(default_factory=dict)

    @property
    def latest(self) -> str:
        return self.turns[-1]

    def dumps(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


def new(task_id: str, agent: str, context: str, turn_id: str) -> TaskRecord:
    return TaskRecord(task_id, agent, context, [turn_id], time.time())


def loaded(text: str | bytes) -> TaskRecord | None:
    """A record as stored; None if it is not one."""
    try:
        value = json.loads(text)
        return TaskRecord(**value)
    except (ValueError, TypeError):
        return None


async def get(mesh: Mesh, session_id: str, task_id: str) -> TaskRecord | None:
    """The task's record; None if it has none (a task of before records)."""
    try:
        text = await mesh.task_record(session_id, task_id)
    except NotFound:
        return None
    return loaded(text) if text else None


async def put(mesh: Mesh, session_id: str, record: TaskRecord) -> bool:
    return await mesh.put_task_record(session_id, record.id, record.dumps(), record.created)


async def page(
    mesh: Mesh, before: tuple[int, str] | None, limit: int
) -> tuple[list[tuple[tuple[int, str], str, TaskRecord]], tuple[int, str] | None]:
    """A keyset page of the caller's task records (unreadable ones skipped)."""
    items, frontier = await mesh.task_records(before, limit)
    found = [(at, session, r) for at, session, text in items if (r := loaded(text)) is not None]
    return found, frontier
