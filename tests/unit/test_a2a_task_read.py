"""A task read while its turn ends: the turn reads finished after the
history was read without its messages. The task is COMPLETED with its
answer, never COMPLETED without it (a poller would stop at an empty task)."""

from __future__ import annotations

from typing import Any

from a2a.types import a2a_pb2

from turnmesh.runtime.errors import NotFound
from turnmesh.server.compat._common import Mesh
from turnmesh.server.compat.a2a import stored
from turnmesh.server.compat.a2a.ids import task_id
from turnmesh.v1 import message_pb2
from turnmesh.v1 import session_service_pb2 as spb

SESSION, TURN = "ctx-1", "turn-1"


class EndingMesh(Mesh):
    """The session's history as of before its turn ended, then after."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def history(self, session_id: str) -> list[message_pb2.Message]:
        self.reads += 1
        if self.reads == 1:
            return []
        return [
            message_pb2.Message(role="user", content="hi", turn_id=TURN),
            message_pb2.Message(role="assistant", content="hello back", turn_id=TURN),
        ]

    async def task_record(self, session_id: str, task: str) -> str:
        raise NotFound("no record")

    async def get_session(self, session_id: str) -> spb.Session:
        return spb.Session(session_id=SESSION, agent_name="demo")

    async def get_turn(self, session_id: str, turn_id: str) -> spb.Turn:
        return spb.Turn(turn_id=TURN, state=spb.TURN_STATE_FINISHED)

    async def put_task_record(self, *args: Any) -> bool:
        return True


async def test_a_turn_that_ends_during_the_read_is_completed_with_its_answer() -> None:
    mesh = EndingMesh()
    task = await stored.task(mesh, SESSION, TURN, "demo", None)
    assert task.id == task_id(SESSION, TURN)
    assert task.status.state == a2a_pb2.TaskState.TASK_STATE_COMPLETED
    assert [p.text for a in task.artifacts for p in a.parts] == ["hello back"]
    assert mesh.reads == 2


async def test_a_running_turn_reads_the_history_once() -> None:
    class Running(EndingMesh):
        async def get_turn(self, session_id: str, turn_id: str) -> spb.Turn:
            return spb.Turn(turn_id=TURN, state=spb.TURN_STATE_RUNNING)

    mesh = Running()
    task = await stored.task(mesh, SESSION, TURN, "demo", None)
    assert task.status.state == a2a_pb2.TaskState.TASK_STATE_WORKING
    assert not task.artifacts and mesh.reads == 1
