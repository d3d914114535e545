"""``kind: a2a``: a remote A2A agent behind a real mesh. The remote is built
from a2a-sdk's own server classes (tests/support/a2a_remote.py) and runs in
its own process on loopback ports, with a bearer token; the workers reach
it over real sockets with the pinned a2a-sdk client, over JSON-RPC,
HTTP+JSON and gRPC. What the remote saw is read from its log."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from google.protobuf import json_format

from tests.support.a2a_clients import Agents, S, answer, message, sent
from tests.support.mesh import SUPPORT_DIR, Component, Mesh, until, wait_for
from turnmesh.agent import AgentError, AgentRequest
from turnmesh.agent.a2a_settings import RemoteSettings
from turnmesh.agent.remote_a2a import A2AAgent, context_for
from turnmesh.client import AsyncClient, TurnFailedError
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.worker.emitter import QueueEmitter

TOKEN = "a2a-test-token"  # the remote's; a file holds it for the worker


@dataclass
class Remote:
    proc: subprocess.Popen[bytes]
    port: int
    grpc_port: int
    down_port: int
    log_path: Path

    def seen(self, event: str) -> list[dict[str, Any]]:
        lines = self.log_path.read_text().splitlines() if self.log_path.exists() else []
        return [entry for entry in map(json.loads, lines) if entry["event"] == event]


@dataclass
class A2AMesh:
    mesh: Mesh
    server: Component
    remote: Remote
    workdir: Path


def _start_remote(workdir: Path) -> Remote:
    ready, log_path = workdir / "remote.ready.json", workdir / "remote.log"
    with (workdir / "remote.out").open("wb") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, str(SUPPORT_DIR / "a2a_remote.py")),
                *("--ready-file", str(ready), "--log", str(log_path), "--token", TOKEN),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    wait_for(lambda: ready.exists() or proc.poll() is not None, 60, "the remote A2A agent")
    assert proc.poll() is None, (workdir / "remote.out").read_text()
    ports = json.loads(ready.read_text())
    return Remote(proc, ports["port"], ports["grpc_port"], ports["down_port"], log_path)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _agent_file(workdir: Path, name: str, remote: str) -> str:
    path = workdir / f"{name}.yaml"
    path.write_text(f"name: {name}\nkind: a2a\nremote:\n{remote}")
    return str(path)


def _spawn_worker(a2a: A2AMesh, name: str, agent: str) -> Component:
    return a2a.mesh.spawn_worker(name, str(a2a.workdir / f"{agent}.yaml"))


@pytest.fixture(scope="module")
def a2a(tmp_path_factory: pytest.TempPathFactory) -> Iterator[A2AMesh]:
    workdir = tmp_path_factory.mktemp("a2a-agent")
    remote = _start_remote(workdir)
    base = f"http://127.0.0.1:{remote.port}"
    (workdir / "token").write_text(TOKEN + "\n")
    token = f"  bearer_token_file: {workdir / 'token'}\n"
    files = {
        # The card's URL; the allow-list names the remote's loopback origin.
        "travel": f"  url: {base}/.well-known/agent-card.json\n  allow: [{base}/]\n{token}",
        # The base URL of the card that names the HTTP+JSON binding.
        "travel-rest": f"  url: {base}/rest\n{token}",
        "nobody": f"  url: http://127.0.0.1:{_closed_port()}\n  connect_timeout_seconds: 5\n",
        # The card that names the gRPC binding: its port is allowed as an
        # http:// origin, so the channel is plaintext.
        "travel-grpc": (
            f"  url: {base}/grpc\n  allow: [{base}/, http://127.0.0.1:{remote.grpc_port}]\n{token}"
        ),
        # A gRPC interface nothing listens on.
        "nobody-grpc": (
            f"  url: {base}/grpc-down\n  allow: [{base}/, http://127.0.0.1:{remote.down_port}]\n"
        ),
    }
    mesh = Mesh(workdir / "mesh")
    try:
        mesh.start_router()
        workers = [
            mesh.spawn_worker(f"worker-{name}", _agent_file(workdir, name, remote))
            for name, remote in files.items()
        ]
        server = mesh.spawn_server("server", "--agent", "travel")
        mesh.wait_ready(*workers, server)
        yield A2AMesh(mesh, server, remote, workdir)
    finally:
        mesh.stop()
        if remote.proc.poll() is None:
            os.kill(remote.proc.pid, signal.SIGTERM)
        try:
            remote.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(remote.proc.pid, signal.SIGKILL)
            remote.proc.wait(timeout=10)


def _deltas(events: list[event_pb2.Event]) -> list[str]:
    return [e.delta for e in events if e.type == event_pb2.TEXT_MESSAGE_CONTENT]


def _result(events: list[event_pb2.Event]) -> dict[str, Any]:
    finished = events[-1]
    assert finished.type == event_pb2.RUN_FINISHED
    return json_format.MessageToDict(finished.result)


# The remote's card names JSON-RPC for "travel", gRPC for "travel-grpc".
BY_BINDING = pytest.mark.parametrize("agent", ["travel", "travel-grpc"])


@BY_BINDING
async def test_turns_stream_the_remote_answer_in_one_remote_context(
    a2a: A2AMesh, agent: str
) -> None:
    async with AsyncClient(a2a.server.address) as client:
        sid = (await client.create_session(agent=agent)).session_id
        first = await client.send(sid, "hello")
        second = await client.send(sid, "again")
    context = context_for(sid)
    # Streamed as the remote's three artifact chunks, as they came.
    assert _deltas(first.events) == [f"echo 1 in {context}: ", "hello", "."]
    # The second turn is a new task in the same context, which the remote kept.
    assert second.text == f"echo 2 in {context}: again."
    marks = [_result(r.events)["a2a"] for r in (first, second)]
    assert [m["context_id"] for m in marks] == [context, context]
    assert [m["state"] for m in marks] == ["TASK_STATE_COMPLETED"] * 2
    assert marks[0]["task_id"] != marks[1]["task_id"]
    assert marks[0]["progress"] == ["thinking"]  # the working status, not the answer
    seen = [m for m in a2a.remote.seen("message") if m["context_id"] == context]
    # The remote got each message alone: it holds the conversation itself.
    assert [m["text"] for m in seen] == ["hello", "again"]
    # The worker sent the token from its file on every call.
    assert a2a.remote.seen("auth") and all(e["ok"] for e in a2a.remote.seen("auth"))
    grpc_calls = [e for e in a2a.remote.seen("auth") if e.get("binding") == "GRPC"]
    assert bool(grpc_calls) == (agent == "travel-grpc")


async def test_the_http_json_binding_carries_a_turn(a2a: A2AMesh) -> None:
    async with AsyncClient(a2a.server.address) as client:
        sid = (await client.create_session(agent="travel-rest")).session_id
        result = await client.send(sid, "over rest")
    assert _deltas(result.events) == [f"echo 1 in {context_for(sid)}: ", "over rest", "."]


def _answer(interrupt_id: str, payload: str) -> message_pb2.ResumeEntry:
    entry = message_pb2.ResumeEntry(interrupt_id=interrupt_id, status="resolved")
    entry.payload.string_value = payload
    return entry


@BY_BINDING
async def test_input_required_is_a_question_answered_on_the_same_task_by_another_worker(
    a2a: A2AMesh, agent: str
) -> None:
    async with AsyncClient(a2a.server.address) as client:
        sid = (await client.create_session(agent=agent)).session_id
        asked = await client.send(sid, "ask me where to go")
        assert asked.outcome is not None and asked.outcome.type == "interrupt"
        (question,) = asked.outcome.interrupts
        assert (question.reason, question.message) == ("question", "Which city?")
        assert asked.text == "Which city?"  # the remote's words, also in the history
        task_id = _result(asked.events)["a2a"]["task_id"]
        # The remote's task id waits with the pause, never shown to the client.
        assert not (await client.get_session(sid)).pause.agent_checkpoint

        # Another worker takes the answer: the first stops once the second is up.
        first = next(c for c in a2a.mesh.components if c.name == f"worker-{agent}")
        second = _spawn_worker(a2a, f"worker-{agent}-2", agent)
        a2a.mesh.wait_ready(second)
        a2a.mesh.kill(first, signal.SIGTERM)

        done = await client.send(sid, "", resume=[_answer(question.id, "Kyoto")])
    assert done.outcome is None
    assert done.text == f"Booked Kyoto on {task_id}"
    answer = a2a.remote.seen("message")[-1]
    assert (answer["task_id"], answer["text"], answer["continues"]) == (task_id, "Kyoto", True)


async def test_a_cancelled_question_cancels_the_remote_task(a2a: A2AMesh) -> None:
    async with AsyncClient(a2a.server.address) as client:
        sid = (await client.create_session()).session_id
        asked = await client.send(sid, "ask me, then never mind")
        assert asked.outcome is not None
        (question,) = asked.outcome.interrupts
        task_id = _result(asked.events)["a2a"]["task_id"]
        cancelled = message_pb2.ResumeEntry(interrupt_id=question.id, status="cancelled")
        after = await client.send(sid, "hello instead", resume=[cancelled])
    assert task_id in [e["task_id"] for e in a2a.remote.seen("cancel")]
    # The message beside the cancelled answer is a new task in the same context.
    assert after.text == f"echo 1 in {context_for(sid)}: hello instead."
    assert _result(after.events)["a2a"]["task_id"] != task_id


@BY_BINDING
async def test_a_cancelled_turn_cancels_the_remote_task(a2a: A2AMesh, agent: str) -> None:
    async with AsyncClient(a2a.server.address) as client:
        sid = (await client.create_session(agent=agent)).session_id
        async with client.stream_turn(sid, "slow please") as events:
            async for event in events:
                if event.type == event_pb2.TEXT_MESSAGE_CONTENT:
                    assert event.delta == "working on it"
                    await client.cancel_turn(sid, event.run_id)
        slow = next(m for m in a2a.remote.seen("message") if m["text"] == "slow please")
        await until(
            lambda: slow["task_id"] in [e["task_id"] for e in a2a.remote.seen("cancel")],
            what="the remote's CancelTask",
        )
        # The session goes on, in the same remote context.
        after = await client.send(sid, "still there?")
    assert after.text == f"echo 1 in {context_for(sid)}: still there?."


@pytest.mark.parametrize(
    ("agent", "message", "code", "detail"),
    [
        ("nobody", "hello", "remote_unreachable", "the remote A2A agent could not be reached"),
        ("nobody-grpc", "hello", "remote_unreachable", "the remote A2A agent could not be reached"),
        ("travel", "fail now", "remote_failed", "the remote A2A agent's task ended failed"),
        ("travel-grpc", "fail now", "remote_failed", "the remote A2A agent's task ended failed"),
        ("travel", "reject this", "remote_rejected", "I only book trips."),
    ],
)
async def test_remote_failures_are_clean_run_errors(
    a2a: A2AMesh, agent: str, message: str, code: str, detail: str
) -> None:
    async with AsyncClient(a2a.server.address) as client:
        sid = (await client.create_session(agent=agent)).session_id
        with pytest.raises(TurnFailedError) as failed:
            await client.send(sid, message)
    error = failed.value.event
    assert (error.type, error.code, error.problem.detail) == (event_pb2.RUN_ERROR, code, detail)
    text = str(error)
    assert "Traceback" not in text and "secret" not in text and TOKEN not in text


async def test_an_openai_chat_completion_reaches_the_remote_through_the_edge(
    a2a: A2AMesh,
) -> None:
    envoy = a2a.mesh.start_envoy([a2a.server], name="a2a-envoy")
    oai = openai.AsyncOpenAI(base_url=f"http://{envoy.listener_address}/v1", api_key="unused")
    try:
        one = await oai.chat.completions.create(
            model="travel", messages=[{"role": "user", "content": "hi from openai"}]
        )
        # Stateless: the conversation so far is new to the remote, so it comes first.
        two = await oai.chat.completions.create(
            model="travel",
            messages=[
                {"role": "user", "content": "hi from openai"},
                {"role": "assistant", "content": one.choices[0].message.content or ""},
                {"role": "user", "content": "and again"},
            ],
        )
    finally:
        await oai.close()
    first = one.choices[0].message.content or ""
    assert first.startswith("echo 1 in ") and first.endswith(": hi from openai.")
    second = two.choices[0].message.content or ""
    assert second.startswith("echo 1 in ")
    assert second.endswith(
        f"The conversation so far:\nuser: hi from openai\nassistant: {first}\nand again."
    )


async def _run_in_process(remote: RemoteSettings, message: str) -> AgentError:
    """The agent in this process (no worker) against the real remote."""
    agent = A2AAgent(remote)
    request = AgentRequest.from_messages([message], session_id=message, turn_id="t")
    try:
        with pytest.raises(AgentError) as failed:
            await agent.run(request, emitter=QueueEmitter())
    finally:
        await agent.close()
    return failed.value


async def test_a_card_naming_a_url_outside_the_allow_list_is_never_called(
    a2a: A2AMesh,
) -> None:
    base = f"http://127.0.0.1:{a2a.remote.port}"
    # Only the card is allowed: the JSON-RPC URL it names is not.
    only_card = RemoteSettings(url=base, allow=[f"{base}/.well-known/"])
    error = await _run_in_process(only_card, "never sent")
    assert (error.code, error.title) == ("remote_not_allowed", "Remote agent not allowed")
    assert "never sent" not in [m["text"] for m in a2a.remote.seen("message")]


async def test_a_wrong_token_is_refused_credentials(
    a2a: A2AMesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TM_A2A_WRONG", "not-the-token")
    wrong = RemoteSettings(
        url=f"http://127.0.0.1:{a2a.remote.port}", bearer_token_env="TM_A2A_WRONG"
    )
    error = await _run_in_process(wrong, "with a wrong token")
    assert (error.code, error.detail) == (
        "remote_auth",
        "the remote A2A agent rejected this agent's credentials",
    )
    assert not a2a.remote.seen("auth")[-1]["ok"]


async def test_a_grpc_interface_outside_the_allow_list_is_never_dialled(a2a: A2AMesh) -> None:
    base = f"http://127.0.0.1:{a2a.remote.port}"
    # The card is allowed (the url's origin), the gRPC port it names is not.
    card_only = RemoteSettings(url=f"{base}/grpc")
    calls = len(a2a.remote.seen("auth"))
    error = await _run_in_process(card_only, "never dialled")
    assert (error.code, error.title) == ("remote_not_allowed", "Remote agent not allowed")
    assert len(a2a.remote.seen("auth")) == calls


async def test_a_wrong_token_over_grpc_is_refused_credentials(
    a2a: A2AMesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TM_A2A_WRONG", "not-the-token")
    base = f"http://127.0.0.1:{a2a.remote.port}"
    wrong = RemoteSettings(
        url=f"{base}/grpc",
        allow=[f"{base}/", f"http://127.0.0.1:{a2a.remote.grpc_port}"],
        bearer_token_env="TM_A2A_WRONG",
    )
    error = await _run_in_process(wrong, "with a wrong token over grpc")
    assert (error.code, error.detail) == (
        "remote_auth",
        "the remote A2A agent rejected this agent's credentials",
    )
    assert a2a.remote.seen("auth")[-1] == {"event": "auth", "ok": False, "binding": "GRPC"}


async def test_a_silent_grpc_stream_times_out_and_cancels_the_remote_task(
    a2a: A2AMesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gRPC has no read timeout of its own: the agent's idle timeout holds it.
    monkeypatch.setenv("TM_A2A_TOKEN", TOKEN)
    base = f"http://127.0.0.1:{a2a.remote.port}"
    silent = RemoteSettings(
        url=f"{base}/grpc",
        allow=[f"{base}/", f"http://127.0.0.1:{a2a.remote.grpc_port}"],
        bearer_token_env="TM_A2A_TOKEN",
        timeout_seconds=1,
    )
    error = await _run_in_process(silent, "slow, then silent")
    assert (error.code, error.detail) == (
        "remote_timeout",
        "the remote A2A agent did not answer in time",
    )
    slow = next(m for m in a2a.remote.seen("message") if m["text"] == "slow, then silent")
    await until(
        lambda: slow["task_id"] in [e["task_id"] for e in a2a.remote.seen("cancel")],
        what="the remote's CancelTask",
    )


async def test_an_a2a_client_reaches_the_remote_through_the_meshs_own_a2a_surface(
    a2a: A2AMesh,
) -> None:
    # A2A in front of A2A: the mesh's card for "travel", then a task on it.
    envoy = a2a.mesh.start_envoy([a2a.server], name="a2a-front-envoy")
    agents = Agents(envoy.listener_address, "HTTP+JSON")
    try:
        client = await agents.client("travel", streaming=False)
        task = await sent(client, message("through two meshes"))
    finally:
        await agents.close()
    assert task.status.state == S.TASK_STATE_COMPLETED
    # The remote's context is the mesh session's (the task's context).
    assert answer(task) == f"echo 1 in {context_for(task.context_id)}: through two meshes."
