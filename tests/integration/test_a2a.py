"""A2A through Envoy with the real, pinned a2a-sdk client, over gRPC and
HTTP+JSON: a message sent (blocking, and returned at once then read back),
streamed, continued on its context, cancelled while it streams (nothing
saved), followed again after its stream was dropped (no text lost or
repeated), and the spec's errors for what it refuses."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator

import httpx
import pytest
from a2a.types import a2a_pb2
from a2a.utils.errors import (
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

from tests.conftest import SharedMesh
from tests.support.a2a_clients import (
    Agents,
    S,
    answer,
    ended,
    message,
    open_gate,
    sent,
)

pytestmark = pytest.mark.integration


async def test_a_message_is_answered_by_a_completed_task(agents: Agents) -> None:
    client = await agents.client("demo", streaming=False)
    request = message("hello there")
    task = await sent(client, request)
    assert task.status.state == S.TASK_STATE_COMPLETED
    assert "hello there" in answer(task)
    assert task.context_id and task.id
    # The history is the task's: the user's message (its own id), the answer.
    assert task.history[0].message_id == request.message.message_id
    assert task.history[0].role == a2a_pb2.ROLE_USER
    assert task.history[-1].role == a2a_pb2.ROLE_AGENT
    # Read back by its id, as it was answered; history_length is honoured.
    again = await client.get_task(a2a_pb2.GetTaskRequest(id=task.id, history_length=1))
    assert (again.status.state, answer(again)) == (S.TASK_STATE_COMPLETED, answer(task))
    assert [m.role for m in again.history] == [a2a_pb2.ROLE_AGENT]


async def test_return_immediately_then_the_task_is_read_when_done(agents: Agents) -> None:
    client = await agents.client("demo", streaming=False)
    request = message("background hello")
    request.configuration.return_immediately = True
    task = await sent(client, request)
    assert task.status.state in (S.TASK_STATE_SUBMITTED, S.TASK_STATE_WORKING)
    assert not task.artifacts
    done = await ended(client, task.id)
    assert done.status.state == S.TASK_STATE_COMPLETED
    assert "background hello" in answer(done)


async def test_a_streamed_task_and_its_context_continued(agents: Agents) -> None:
    client = await agents.client("demo")
    events = [r async for r in client.send_message(message("stream me please"))]
    first, *updates = events
    assert first.HasField("task") and first.task.status.state in (
        S.TASK_STATE_SUBMITTED,
        S.TASK_STATE_WORKING,
    )
    chunks = [e.artifact_update for e in updates if e.HasField("artifact_update")]
    assert len(chunks) > 1, "the answer is streamed in pieces"
    assert not chunks[0].append and all(c.append for c in chunks[1:])
    assert [c.last_chunk for c in chunks] == [False] * (len(chunks) - 1) + [True]
    streamed = "".join(p.text for c in chunks for p in c.artifact.parts)
    final = updates[-1]
    assert final.status_update.status.state == S.TASK_STATE_COMPLETED
    task = await client.get_task(a2a_pb2.GetTaskRequest(id=first.task.id))
    assert answer(task) == streamed and "stream me please" in streamed
    # The same context: the agent remembers the first message.
    follow = await sent(
        await agents.client("demo", streaming=False), message("and again", first.task.context_id)
    )
    assert follow.context_id == first.task.context_id and follow.id != task.id
    assert "message 2 of our conversation" in answer(follow)


async def test_a_client_chosen_context_is_made_on_first_use(agents: Agents) -> None:
    client = await agents.client("demo", streaming=False)
    context_id = f"ctx-{uuid.uuid4()}"
    first = await sent(client, message("one", context_id))
    second = await sent(client, message("two", context_id))
    assert first.context_id == second.context_id == context_id
    assert "message 2 of our conversation" in answer(second)


async def test_a_repeated_message_runs_once(agents: Agents) -> None:
    client = await agents.client("demo", streaming=False)
    context_id = f"ctx-{uuid.uuid4()}"
    request = message("only once", context_id)
    first = await sent(client, request)
    again = await sent(client, request)  # a retry: the same message_id
    assert again.id == first.id and answer(again) == answer(first)
    after = await sent(client, message("and then", context_id))
    # The retry added nothing: this is the conversation's second message.
    assert "message 2 of our conversation" in answer(after)


async def test_cancel_while_streaming(agents: Agents, shared_mesh: SharedMesh) -> None:
    client = await agents.client("probe")
    gate = str(uuid.uuid4())
    stream = client.send_message(message("hold", gate=gate, deltas="3", delay_ms="1"))
    first = await anext(stream)
    task_id = first.task.id
    # Running: its first piece of the answer is out, the rest waits on the gate.
    async for event in stream:
        if event.HasField("status_update"):
            assert event.status_update.status.state == S.TASK_STATE_WORKING
        if event.HasField("artifact_update") or event.HasField("status_update"):
            break
    cancelled = await client.cancel_task(a2a_pb2.CancelTaskRequest(id=task_id))
    assert cancelled.status.state == S.TASK_STATE_CANCELED
    rest = [e async for e in stream]
    assert rest[-1].status_update.status.state == S.TASK_STATE_CANCELED
    task = await client.get_task(a2a_pb2.GetTaskRequest(id=task_id))
    # Nothing of a cancelled turn is saved: no answer, no history.
    assert task.status.state == S.TASK_STATE_CANCELED
    assert not task.artifacts and not task.history
    open_gate(shared_mesh.mesh.probe_dir, gate)
    with pytest.raises(TaskNotCancelableError):
        await client.cancel_task(a2a_pb2.CancelTaskRequest(id=task_id))


async def test_a_dropped_stream_is_followed_again(agents: Agents, shared_mesh: SharedMesh) -> None:
    client = await agents.client("probe")
    gate = str(uuid.uuid4())
    stream = client.send_message(message("resume", gate=gate, deltas="4", delay_ms="1"))
    task_id = (await anext(stream)).task.id
    seen: list[str] = []
    async for event in stream:
        if event.HasField("artifact_update"):
            seen += [p.text for p in event.artifact_update.artifact.parts]
        if event.HasField("status_update"):
            break  # WORKING: the turn runs, waiting on the gate
    assert isinstance(stream, AsyncGenerator)
    await stream.aclose()  # the caller goes; the task runs on
    resumed = client.subscribe(a2a_pb2.SubscribeToTaskRequest(id=task_id))
    snapshot = await anext(resumed)
    assert snapshot.task.id == task_id
    assert snapshot.task.status.state == S.TASK_STATE_WORKING
    so_far = answer(snapshot.task)
    open_gate(shared_mesh.mesh.probe_dir, gate)
    rest = [e async for e in resumed]
    more = [
        p.text
        for e in rest
        if e.HasField("artifact_update")
        for p in e.artifact_update.artifact.parts
    ]
    assert rest[-1].status_update.status.state == S.TASK_STATE_COMPLETED
    final = answer(await client.get_task(a2a_pb2.GetTaskRequest(id=task_id)))
    # Nothing lost, nothing repeated: the snapshot and the updates after it
    # are the answer, exactly.
    assert so_far + "".join(more) == final == "part0 part1 part2 part3 "
    assert "".join(seen) == so_far[: len("".join(seen))]
    # A task that ended has nothing more to stream.
    with pytest.raises(UnsupportedOperationError):
        async for _ in client.subscribe(a2a_pb2.SubscribeToTaskRequest(id=task_id)):
            pass


async def test_what_a2a_refuses(agents: Agents) -> None:
    client = await agents.client("demo", streaming=False)
    done = await sent(client, message("hi"))
    for missing in ("no-such-task", f"01J00000000000000000000000.{'x' * 8}", done.id + "x"):
        with pytest.raises(TaskNotFoundError):
            await client.get_task(a2a_pb2.GetTaskRequest(id=missing))
    # Another agent's task is not found through that agent.
    with pytest.raises(TaskNotFoundError):
        await (await agents.client("echo")).get_task(a2a_pb2.GetTaskRequest(id=done.id))
    with pytest.raises(TaskNotCancelableError):
        await client.cancel_task(a2a_pb2.CancelTaskRequest(id=done.id))
    empty = message("x")
    del empty.message.parts[:]
    with pytest.raises(InvalidParamsError):
        await sent(client, empty)
    blank = message("   ")
    with pytest.raises(InvalidParamsError):
        await sent(client, blank)
    # A message naming a finished task: a new task of its context is the way.
    on_done = message("more", done.context_id)
    on_done.message.task_id = done.id
    with pytest.raises(UnsupportedOperationError):
        await sent(client, on_done)


async def test_agent_cards(shared_mesh: SharedMesh) -> None:
    """One card per agent at the well-known path, open, with absolute
    interfaces for this edge naming the agent as tenant; the default agent's
    at the root; an agent nobody serves is 404 in A2A's error shape."""
    async with httpx.AsyncClient(base_url=f"http://{shared_mesh.edge}", timeout=30) as http:
        for path, agent in (("/probe", "probe"), ("/echo", "echo"), ("", "demo")):
            response = await http.get(f"{path}/.well-known/agent-card.json")
            assert response.status_code == 200, response.text
            card = response.json()
            assert card["name"] == agent
            assert {
                (i["protocolBinding"], i["url"], i["tenant"]) for i in card["supportedInterfaces"]
            } == {
                ("HTTP+JSON", f"http://{shared_mesh.edge}", agent),
                ("JSONRPC", f"http://{shared_mesh.edge}/{agent}/jsonrpc", agent),
                ("GRPC", shared_mesh.edge, agent),
            }
            assert card["capabilities"] == {
                "streaming": True,
                "pushNotifications": False,
                "extendedAgentCard": False,
            }
            assert "securitySchemes" not in card  # a keyless mesh
        missing = await http.get("/nobody/.well-known/agent-card.json")
        assert missing.status_code == 404
        assert missing.json()["error"]["status"] == "NOT_FOUND"


async def test_http_json_errors_and_media_type(shared_mesh: SharedMesh) -> None:
    """A2A's HTTP+JSON error shape (Google's, with ErrorInfo in A2A's domain),
    not problem+json; application/a2a+json passes the edge's cross-origin
    guard as JSON does."""
    async with httpx.AsyncClient(base_url=f"http://{shared_mesh.edge}", timeout=30) as http:
        missing = await http.get("/demo/tasks/no-such-task")
        assert missing.status_code == 404
        error = missing.json()["error"]
        assert (error["code"], error["status"]) == (404, "NOT_FOUND")
        (info,) = error["details"]
        assert (info["reason"], info["domain"]) == ("TASK_NOT_FOUND", "a2a-protocol.org")
        bad = await http.post(
            "/demo/message:send",
            content=b'{"message": {"messageId": "m", "role": "ROLE_USER", "parts": []}}',
            headers={"content-type": "application/a2a+json", "origin": "https://elsewhere.example"},
        )
        assert bad.status_code == 400, bad.text
        assert bad.json()["error"]["status"] == "INVALID_ARGUMENT"
        assert {d["reason"] for d in bad.json()["error"]["details"] if "reason" in d} == {
            "INVALID_PARAMS"
        }
        good = await http.post(
            "/demo/message:send",
            json={"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}]}},
            headers={"content-type": "application/a2a+json", "origin": "https://elsewhere.example"},
        )
        assert good.status_code == 200, good.text
        assert good.json()["task"]["status"]["state"] == "TASK_STATE_COMPLETED"


async def test_a_question_makes_the_task_wait_for_input(agents: Agents) -> None:
    """An agent's question ends the turn waiting: the task is INPUT_REQUIRED,
    its status message says what is asked (text, and the interrupt as data);
    it stays so when read back or followed again; cancelling it cancels the pause."""
    client = await agents.client("demo", streaming=False)
    task = await sent(client, message("please ask me something"))
    assert task.status.state == S.TASK_STATE_INPUT_REQUIRED
    asked = task.status.message
    assert asked.role == a2a_pb2.ROLE_AGENT
    (data,) = [p.data for p in asked.parts if p.HasField("data")]
    (interrupt,) = data.struct_value.fields["interrupts"].list_value.values
    assert interrupt.struct_value.fields["reason"].string_value == "question"
    again = await client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
    assert again.status.state == S.TASK_STATE_INPUT_REQUIRED
    streaming = await agents.client("demo")
    (followed,) = [e async for e in streaming.subscribe(a2a_pb2.SubscribeToTaskRequest(id=task.id))]
    assert followed.task.status.state == S.TASK_STATE_INPUT_REQUIRED
    cancelled = await client.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))
    assert cancelled.status.state == S.TASK_STATE_CANCELED
    # The session waits no more (read back, the task's turn shows as it ended).
    after = await client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
    assert after.status.state != S.TASK_STATE_INPUT_REQUIRED
