"""One /ws request as frames (server/compat/areal_ws/runs.py), against a
Mesh whose turn is scripted: what each event and each refusal becomes."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any, Unpack

from turnmesh.runtime.errors import AlreadyExists, TurnmeshError, TurnQuotaExceeded
from turnmesh.server.compat import Mesh
from turnmesh.server.compat._common import TurnArgs
from turnmesh.server.compat.areal_ws import frames
from turnmesh.server.compat.areal_ws.runs import run
from turnmesh.v1 import event_pb2
from turnmesh.v1 import session_service_pb2 as spb

E = event_pb2


class ScriptedMesh(Mesh):
    """A session that does not exist yet, and a turn whose events (or
    refusal) are given."""

    def __init__(self, events: Sequence[event_pb2.Event], refusal: TurnmeshError | None = None):
        super().__init__()
        self.events = events
        self.refusal = refusal
        self.created: list[str] = []
        self.asked: dict[str, Any] = {}

    async def session_exists(self, session_id: str) -> bool:
        return session_id in self.created

    async def create_session(
        self, session_id: str | None, agent: str | None, *a: Any, **k: Any
    ) -> str:
        assert session_id is not None
        self.created.append(session_id)
        raise AlreadyExists("made by another socket meanwhile")  # tolerated

    @contextlib.asynccontextmanager
    async def turn(
        self, session_id: str, message: str, **options: Unpack[TurnArgs]
    ) -> AsyncIterator[AsyncIterator[event_pb2.Event]]:
        self.asked = {"session_id": session_id, "message": message, **options}

        async def events() -> AsyncIterator[event_pb2.Event]:
            if self.refusal is not None:
                raise self.refusal
            for event in self.events:
                yield event

        yield events()


async def answers(mesh: Mesh, followup: bool = False) -> list[dict[str, Any]]:
    request = frames.AgentRequest("r1", "hi", "s-1", "key-1", followup=followup)
    return [json.loads(f) async for f in run(mesh, request)]


STARTED = E.Event(type=E.RUN_STARTED, run_id="turn-1")


async def test_events_become_the_seeds_frames() -> None:
    mesh = ScriptedMesh(
        [
            STARTED,
            E.Event(type=E.TEXT_MESSAGE_CONTENT, delta="thinking. "),
            E.Event(type=E.TOOL_CALL_START, tool_call_id="c1", tool_call_name="calc"),
            E.Event(type=E.TOOL_CALL_ARGS, tool_call_id="c1", delta='{"a":'),
            E.Event(type=E.TOOL_CALL_ARGS, tool_call_id="c1", delta="1}"),
            E.Event(type=E.TOOL_CALL_END, tool_call_id="c1"),
            E.Event(type=E.TOOL_CALL_RESULT, tool_call_id="c1", content="1"),
            E.Event(type=E.TEXT_MESSAGE_CONTENT, delta="one"),
            E.Event(type=E.RUN_FINISHED),
        ]
    )
    got = await answers(mesh)
    run_id = frames.run_id("turn-1")
    assert [f["payload"] for f in got] == [
        {"runId": run_id, "status": "accepted"},
        {"runId": run_id, "delta": "thinking. "},
        {"runId": run_id, "toolCall": {"name": "calc", "args": '{"a":1}'}},
        {"runId": run_id, "delta": "one"},
        {"runId": run_id, "status": "complete", "summary": "one"},
    ]
    assert mesh.created == ["s-1"]
    assert mesh.asked["policy"] == spb.TURN_POLICY_COLLECT
    assert mesh.asked["idempotency_key"] == "key-1"
    assert mesh.asked["on_disconnect"] == spb.DISCONNECT_POLICY_CONTINUE


async def test_followup_enqueues() -> None:
    mesh = ScriptedMesh([STARTED, E.Event(type=E.RUN_FINISHED)])
    assert (await answers(mesh, followup=True))[-1]["payload"] == {
        "runId": frames.run_id("turn-1"),
        "status": "complete",
    }
    assert mesh.asked["policy"] == spb.TURN_POLICY_ENQUEUE


async def test_a_refusal_is_failed_in_words_with_its_code() -> None:
    mesh = ScriptedMesh([], TurnQuotaExceeded("this caller runs 1 turn at once already"))
    (failed,) = await answers(mesh)
    assert failed == {
        "type": "res",
        "id": "r1",
        "ok": False,
        "payload": {
            "status": "failed",
            "error": "this caller runs 1 turn at once already",
            "code": "TURN_QUOTA_EXCEEDED",
        },
    }


async def test_a_failed_turn_is_failed_with_its_run_id() -> None:
    mesh = ScriptedMesh(
        [STARTED, E.Event(type=E.RUN_ERROR, message="the agent failed", code="agent_error")]
    )
    accepted, failed = await answers(mesh)
    assert failed["ok"] is False and failed["payload"]["runId"] == accepted["payload"]["runId"]
    assert failed["payload"]["error"] == "the agent failed"


async def test_a_stream_that_ends_without_an_outcome_fails() -> None:
    (failed,) = await answers(ScriptedMesh([]))
    assert failed["ok"] is False and failed["payload"]["code"] == "UNAVAILABLE"
