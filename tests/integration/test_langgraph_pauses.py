"""A LangGraph graph's ``interrupt()`` through the mesh: the turn ends with a
question whose id, message and schema are the graph's; the graph's checkpoint
waits in the session store, so the answer resumes it on another worker of a
restarted server; a cancelled question abandons it."""

from __future__ import annotations

import signal
from pathlib import Path

from google.protobuf import json_format

from tests.support.mesh import Mesh
from turnmesh.client import AsyncClient
from turnmesh.v1 import event_pb2, message_pb2

AGENT_FILE = "name: planner\nkind: langgraph\ngraph: lg_graph:asking\n"


def _answer(interrupt_id: str, payload: dict[str, object]) -> message_pb2.ResumeEntry:
    entry = message_pb2.ResumeEntry(interrupt_id=interrupt_id, status="resolved")
    json_format.ParseDict(payload, entry.payload)
    return entry


async def test_an_interrupt_resumes_from_the_store_on_another_worker(
    mesh_factory: Mesh, tmp_path: Path
) -> None:
    agent_file = tmp_path / "planner.yaml"
    agent_file.write_text(AGENT_FILE)
    store = f"sqlite:{tmp_path / 'sessions.db'}"
    mesh = mesh_factory
    mesh.start_router()
    first_worker = mesh.spawn_worker("lg-a", str(agent_file))
    first = mesh.spawn_server("server-a", "--agent", "planner", "--store", store)
    mesh.wait_ready(first_worker, first)
    async with AsyncClient(first.address) as client:
        sid = (await client.create_session()).session_id
        asked = await client.send(sid, "plan a trip")
        assert asked.outcome is not None and asked.outcome.type == "interrupt"
        (question,) = asked.outcome.interrupts
        assert (question.reason, question.message) == ("question", "Which city?")
        assert json_format.MessageToDict(question.response_schema)["required"] == ["city"]
        assert asked.text == "Let me plan your trip."
        # The graph's checkpoint is the agent's own: never shown to the client.
        waiting = (await client.get_session(sid)).pause
        assert [i.id for i in waiting.interrupts] == [question.id]
        assert not waiting.agent_checkpoint
    # Both the worker that ran the graph and the server go: only the store remains.
    mesh.kill(first_worker, signal.SIGKILL)
    mesh.kill(first, signal.SIGKILL)

    second_worker = mesh.spawn_worker("lg-b", str(agent_file))
    second = mesh.spawn_server("server-b", "--agent", "planner", "--store", store)
    mesh.wait_ready(second_worker, second)
    async with AsyncClient(second.address) as client:
        done = await client.send(sid, "", resume=[_answer(question.id, {"city": "Kyoto"})])
        assert done.outcome is None
        # The graph went on from its checkpoint (greet did not run again).
        assert done.text == "Booked Kyoto (1 messages from you)."
        assert [e.delta for e in done.events if e.type == event_pb2.TEXT_MESSAGE_CONTENT] == [
            "Booked Kyoto (1 messages from you)."
        ]
        history = await client.history(sid)
        assert [(m.role, m.content) for m in history] == [
            ("user", "plan a trip"),
            ("assistant", "Let me plan your trip."),
            ("assistant", "Booked Kyoto (1 messages from you)."),
        ]

        # Cancelled: the checkpoint is dropped and the graph runs from history.
        again = await client.send(sid, "another trip")
        assert again.outcome is not None
        (second_question,) = again.outcome.interrupts
        cancel = message_pb2.ResumeEntry(interrupt_id=second_question.id, status="cancelled")
        fresh = await client.send(sid, "never mind, plan one more", resume=[cancel])
        assert fresh.outcome is not None and fresh.outcome.type == "interrupt"
        assert fresh.text == "Let me plan your trip."  # from the start, not resumed
