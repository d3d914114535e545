"""ListTasks: the caller's tasks (its principal's records: another's never
appear), newest first, in keyset pages (``page_token`` as ListSessions':
the position of the last task a page holds), filtered by tenant (the
agent; none: every agent), ``context_id``, ``status`` and
``status_timestamp_after``.

``total_size`` is exact: every page looks at all the caller's records (at
most ``TASK_RECORDS_PER_PRINCIPAL``, read in batches). A filter on the
status reads the status of each task that does not keep its end yet (a
running or waiting task; one that ended keeps it from its first read on,
this one's included), so listing costs about one read per live task.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json

from a2a.types import a2a_pb2

from turnmesh.runtime.errors import TaskNotFound
from turnmesh.server.compat._common import Mesh
from turnmesh.server.compat.a2a import records, stored
from turnmesh.server.compat.a2a.messages import invalid_params
from turnmesh.server.stores import listing
from turnmesh.server.stores.base import TASK_RECORDS_PER_PRINCIPAL

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 100
# Records read per store call while listing.
BATCH = 100
# Batches a listing reads at most (past the store's bound: a guard).
MAX_BATCHES = TASK_RECORDS_PER_PRINCIPAL // BATCH + 10
MAX_TOKEN_CHARS = 1_024


def _page_size(request: a2a_pb2.ListTasksRequest) -> int:
    if not request.HasField("page_size"):
        return DEFAULT_PAGE_SIZE
    if not 1 <= request.page_size <= MAX_PAGE_SIZE:
        raise invalid_params("page_size", f"must be between 1 and {MAX_PAGE_SIZE}")
    return request.page_size


def _history_length(request: a2a_pb2.ListTasksRequest) -> int:
    if not request.HasField("history_length"):
        return 0
    if request.history_length < 0:
        raise invalid_params("history_length", "must not be negative")
    return request.history_length


class _Filter:
    def __init__(self, request: a2a_pb2.ListTasksRequest, agent: str) -> None:
        self.agent = agent
        self.context = request.context_id
        self.state = request.status
        self.after = (
            request.status_timestamp_after.ToNanoseconds()
            if request.HasField("status_timestamp_after")
            else None
        )

    @property
    def by_status(self) -> bool:
        return bool(self.state) or self.after is not None

    def of_record(self, record: records.TaskRecord) -> bool:
        return (not self.agent or record.agent == self.agent) and (
            not self.context or record.context == self.context
        )

    def of_status(self, status: a2a_pb2.TaskStatus) -> bool:
        if self.state and status.state != self.state:
            return False
        return self.after is None or status.timestamp.ToNanoseconds() > self.after


async def _read(
    mesh: Mesh, session_id: str, record: records.TaskRecord, agent: str
) -> stored.Read | None:
    try:
        return await stored.read(mesh, session_id, record.turns[0], agent)
    except TaskNotFound:  # its session went meanwhile
        return None


def _decode(token: str) -> listing.Position | None:
    """A page token of this listing (ListSessions' form, longer ids)."""
    if not token:
        return None
    if len(token) <= MAX_TOKEN_CHARS:
        with contextlib.suppress(ValueError, binascii.Error, TypeError, RecursionError):
            nanos, task = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
            if isinstance(nanos, int) and not isinstance(nanos, bool) and isinstance(task, str):
                return (nanos, task)
    raise invalid_params("page_token", "not a token this API returned")


async def list_tasks(
    mesh: Mesh, request: a2a_pb2.ListTasksRequest, agent: str
) -> a2a_pb2.ListTasksResponse:
    size = _page_size(request)
    history_length = _history_length(request)
    before = _decode(request.page_token)
    wanted = _Filter(request, agent)
    page: list[tuple[listing.Position, stored.Read]] = []
    total, more, cursor = 0, False, None
    for _ in range(MAX_BATCHES):
        items, frontier = await records.page(mesh, cursor, BATCH)
        for at, session_id, record in items:
            if not wanted.of_record(record):
                continue
            found: stored.Read | None = None
            if wanted.by_status:
                if record.final:
                    shown = stored.kept_status(record)
                else:
                    found = await _read(mesh, session_id, record, agent)
                    if found is None:
                        continue
                    shown = stored.status(found)
                if not wanted.of_status(shown):
                    continue
            if before is not None and at >= before:
                total += 1
                continue
            if len(page) == size:
                more = True
                total += 1
                continue
            found = found or await _read(mesh, session_id, record, agent)
            if found is not None:
                total += 1
                page.append((at, found))
        if frontier is None:
            break
        cursor = frontier
    response = a2a_pb2.ListTasksResponse(
        page_size=size,
        total_size=total,
        next_page_token=listing.encode_token(page[-1][0]) if more and page else "",
    )
    for _, found in page:
        task = stored.as_task(found, history_length)
        if not request.include_artifacts:
            task.ClearField("artifacts")
        response.tasks.append(task)
    return response
