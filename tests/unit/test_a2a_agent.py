"""``kind: a2a`` in parts: its agent file, where the remote's ids live, how
the remote's stream becomes events, and what a failure tells the caller
(the whole agent against a real remote is tests/integration/test_a2a_agent.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest
from a2a.client import A2AClientError, A2AClientTimeoutError, AgentCardResolutionError
from a2a.types.a2a_pb2 import (
    Artifact,
    Message,
    Part,
    StreamResponse,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import TaskNotFoundError
from google.protobuf import struct_pb2

from tests.unit.test_agents import RecordingEmitter
from turnmesh.agent import (
    AgentError,
    AgentLoadError,
    AgentRequest,
    Interrupt,
    Resume,
    load_agent,
)
from turnmesh.agent._config import read_agent_file
from turnmesh.agent.a2a_link import Link, NotAllowed, grpc_target, remote_error
from turnmesh.agent.a2a_settings import RemoteSettings
from turnmesh.agent.remote_a2a import (
    MAX_TRANSCRIPT_CHARS,
    A2AAgent,
    context_for,
    history_transcript,
    remote_knows,
)
from turnmesh.agent.remote_a2a import _Stream as Stream


def _file(tmp_path: Path, remote: str) -> str:
    path = tmp_path / "remote.yaml"
    path.write_text(f"name: travel\nkind: a2a\nremote:\n{remote}")
    return str(path)


def test_an_agent_file_of_kind_a2a(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    remote = f"  url: https://agents.example.com/travel\n  bearer_token_file: {token}\n"
    name, agent = load_agent(_file(tmp_path, remote))
    assert name == "travel" and isinstance(agent, A2AAgent)
    # Without `allow`, the url's own origin is what the worker may call.
    assert agent.settings.allowed == ["https://agents.example.com"]


def test_the_example_agent_file_is_valid() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "remote-a2a.yaml"
    name, agent = load_agent(str(example))
    assert name == "travel" and isinstance(agent, A2AAgent)


@pytest.mark.parametrize(
    ("remote", "message"),
    [
        ("", "needs `remote`"),
        ("  url: ftp://x.example\n", "remote.url: Value error, must be an http or https URL"),
        ("  url: https://u:p@x.example\n", "must not carry credentials"),
        ("  url: https://x.example/a/../b\n", "must not hold . or .. path segments"),
        (
            "  url: https://x.example/a\n  allow: [https://y.example]\n",
            "the agent's card URL is under none of its prefixes",
        ),
        ("  url: https://x.example\n  allow: [nope]\n", "remote.allow"),
        ("  url: https://x.example\n  bearer_token_env: TM_NO_SUCH_TOKEN\n", "is not set"),
        ("  url: https://x.example\n  bearer_token_file: /nonexistent\n", "cannot read"),
        ("  url: https://x.example\n  timeout_seconds: 0\n", "remote.timeout_seconds"),
        ("  url: https://x.example\n  colour: blue\n", "remote.colour"),
    ],
)
def test_a_bad_remote_is_named(tmp_path: Path, remote: str, message: str) -> None:
    text = "name: a\nkind: a2a\n" + (f"remote:\n{remote}" if remote else "")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(AgentLoadError, match=message.replace("(", r"\(").replace(".", r"\.")):
        load_agent(str(path))


def test_remote_is_only_for_a2a(tmp_path: Path) -> None:
    path = tmp_path / "echo.yaml"
    path.write_text("name: a\nkind: echo\nremote: {url: https://x.example}\n")
    with pytest.raises(Exception, match="`remote` is for a2a agents"):
        read_agent_file(path)


def test_a_token_never_shows_in_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TM_TOKEN", "s3cret")
    remote = "  url: https://x.example\n  bearer_token_env: TM_TOKEN\n  bearer_token_file: /t\n"
    with pytest.raises(AgentLoadError) as failed:
        load_agent(_file(tmp_path, remote))
    assert "not both" in str(failed.value) and "s3cret" not in str(failed.value)


async def test_the_link_refuses_a_url_outside_the_allow_list() -> None:
    link = Link(RemoteSettings(url="http://127.0.0.1:9/agent", allow=["http://127.0.0.1:9/agent/"]))
    await link._check(httpx.Request("GET", "http://127.0.0.1:9/agent/rpc"))
    for url in ("http://127.0.0.1:9/admin", "http://127.0.0.1:99/agent/rpc", "http://10.0.0.1/"):
        with pytest.raises(NotAllowed):
            await link._check(httpx.Request("GET", url))


def test_a_sessions_context_is_the_same_everywhere_and_names_nothing() -> None:
    context = context_for("team-a/trip")
    assert context == context_for("team-a/trip") != context_for("team-b/trip")
    assert uuid.UUID(context).version == 5 and "team" not in context


def test_the_remote_knows_a_context_a_turn_ran_in() -> None:
    context = context_for("s")
    mark = {"role": "assistant", "content": "x", "metadata": {"a2a": {"context_id": context}}}
    assert remote_knows([{"role": "user", "content": "hi"}, mark], context)
    # A fork's or a seed's history carries another session's mark, or none.
    assert not remote_knows([mark], context_for("other"))
    assert not remote_knows([{"role": "assistant", "content": "x"}], context)


def test_a_transcript_keeps_the_latest_messages_within_its_bound() -> None:
    history = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "second"}]
    assert history_transcript(history) == "The conversation so far:\nuser: first\nassistant: second"
    long = [{"role": "user", "content": "x" * 1000}] * (MAX_TRANSCRIPT_CHARS // 1000 + 5)
    text = history_transcript([*long, {"role": "user", "content": "last"}])
    assert len(text) <= MAX_TRANSCRIPT_CHARS + 100
    assert "[earlier messages left out]" in text and text.endswith("user: last")
    assert history_transcript([{"role": "assistant", "content": ""}]) == ""


def _status(state: TaskState, text: str = "") -> StreamResponse:
    message = Message(parts=[Part(text=text)]) if text else None
    return StreamResponse(
        status_update=TaskStatusUpdateEvent(
            task_id="t", context_id="c", status=TaskStatus(state=state, message=message)
        )
    )


def _chunk(artifact_id: str, *parts: Part, append: bool = False) -> StreamResponse:
    return StreamResponse(
        artifact_update=TaskArtifactUpdateEvent(
            task_id="t",
            context_id="c",
            artifact=Artifact(artifact_id=artifact_id, parts=list(parts)),
            append=append,
        )
    )


async def test_artifacts_are_the_answer_and_working_messages_are_progress() -> None:
    emitter = RecordingEmitter()
    stream = Stream(emitter)
    value = struct_pb2.Value()
    value.struct_value.update({"k": 1})
    submitted = TaskStatus(state=TaskState.TASK_STATE_SUBMITTED)
    for event in [
        StreamResponse(task=Task(id="t", context_id="c", status=submitted)),
        _status(TaskState.TASK_STATE_WORKING, "thinking"),
        _chunk("a", Part(text="one ")),
        _chunk("a", Part(text="two"), append=True),
        _chunk("b", Part(data=value), Part(url="https://x/f.pdf", filename="f.pdf")),
        _status(TaskState.TASK_STATE_COMPLETED, "done (not repeated)"),
    ]:
        await stream.take(event)
    assert emitter.deltas == ["one ", "two", "\n\n", '{"k":1}']
    assert stream.ended and (stream.task_id, stream.context_id) == ("t", "c")
    assert stream.result() == {
        "a2a": {
            "context_id": "c",
            "task_id": "t",
            "state": "TASK_STATE_COMPLETED",
            "progress": ["thinking"],
            "files": [{"filename": "f.pdf", "media_type": "", "url": "https://x/f.pdf"}],
        }
    }


async def test_a_final_status_message_is_the_answer_when_no_artifact_spoke() -> None:
    emitter = RecordingEmitter()
    stream = Stream(emitter)
    await stream.take(_status(TaskState.TASK_STATE_COMPLETED, "all done"))
    assert emitter.deltas == ["all done"]


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        (TaskState.TASK_STATE_INPUT_REQUIRED, "question"),
        (TaskState.TASK_STATE_AUTH_REQUIRED, "auth_required"),
    ],
)
async def test_a_task_that_waits_is_a_question(state: TaskState, reason: str) -> None:
    emitter = RecordingEmitter()
    stream = Stream(emitter)
    await stream.take(_status(state, "Which city?"))
    assert stream.question is not None and stream.ended
    assert (stream.question.reason, stream.question.message) == (reason, "Which city?")
    assert stream.question.metadata == {"a2a_state": TaskState.Name(state)}
    assert emitter.deltas == ["Which city?"]


async def test_a_failed_task_says_nothing_of_the_remotes_words() -> None:
    with pytest.raises(AgentError) as failed:
        await Stream(RecordingEmitter()).take(
            _status(TaskState.TASK_STATE_FAILED, "Traceback: secret")
        )
    assert failed.value.code == "remote_failed" and "secret" not in failed.value.detail
    with pytest.raises(AgentError) as refused:
        await Stream(RecordingEmitter()).take(_status(TaskState.TASK_STATE_REJECTED, "No\nway."))
    assert (refused.value.code, refused.value.detail) == ("remote_rejected", "No way.")


def _http_error(status: int) -> A2AClientError:
    request = httpx.Request("POST", "http://x/rpc")
    cause = httpx.HTTPStatusError("no", request=request, response=httpx.Response(status))
    error = A2AClientError(f"HTTP Error {status}: secret body")
    error.__cause__ = cause
    return error


def _caused(error: Exception, cause: Exception) -> Exception:
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    ("exc", "code", "status"),
    [
        (_caused(A2AClientError("x"), httpx.ConnectError("refused")), "remote_unreachable", 502),
        (_caused(A2AClientTimeoutError("x"), httpx.ReadTimeout("slow")), "remote_timeout", 504),
        (_http_error(401), "remote_auth", 502),
        (_http_error(500), "remote_error", 502),
        (AgentCardResolutionError("secret", status_code=404), "remote_card", 502),
        (TaskNotFoundError("secret"), "remote_task_not_found", 409),
        (_caused(A2AClientError("x"), NotAllowed("http://10.0.0.1/")), "remote_not_allowed", 502),
    ],
)
def test_remote_failures_map_to_clean_errors(exc: Exception, code: str, status: int) -> None:
    error = remote_error(exc)
    assert error is not None and (error.code, error.status) == (code, status)
    assert "secret" not in error.title + error.detail


def test_an_unrelated_failure_is_left_alone() -> None:
    assert remote_error(KeyError("x")) is None


async def test_an_answer_without_a_checkpoint_cannot_continue_the_remote_task() -> None:
    agent = A2AAgent(RemoteSettings(url="http://127.0.0.1:9"))
    request = AgentRequest.from_messages(
        [], session_id="s", turn_id="t", resume=[Resume(Interrupt(id="i"), "resolved", "x")]
    )
    with pytest.raises(AgentError) as failed:
        await agent.run(request, emitter=RecordingEmitter())
    assert (failed.value.code, failed.value.status) == ("no_checkpoint", 409)


@pytest.mark.parametrize(
    ("url", "allowed", "expected"),
    [
        ("127.0.0.1:5000", ["http://127.0.0.1:5000"], ("127.0.0.1:5000", False)),
        (
            "agents.example.com:443",
            ["https://agents.example.com"],
            ("agents.example.com:443", True),
        ),
        (
            "grpcs://agents.example.com:8443",
            ["https://agents.example.com:8443/"],
            ("agents.example.com:8443", True),
        ),
        ("grpc://10.0.0.5:50051/", ["http://10.0.0.5:50051/"], ("10.0.0.5:50051", False)),
    ],
)
def test_a_grpc_interface_is_dialled_as_the_allow_list_says(
    url: str, allowed: list[str], expected: tuple[str, bool]
) -> None:
    assert grpc_target(url, allowed) == expected


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        # Another port, another host, a path prefix (an origin is needed).
        ("127.0.0.1:5001", ["http://127.0.0.1:5000"]),
        ("127.0.0.1.evil:5000", ["http://127.0.0.1:5000"]),
        ("agents.example.com:443", ["https://agents.example.com/rpc/"]),
        # Plaintext never satisfies an https-only allow-list, nor the reverse.
        ("grpc://agents.example.com:443", ["https://agents.example.com"]),
        ("grpcs://127.0.0.1:5000", ["http://127.0.0.1:5000"]),
        # No port, a path, credentials, an unknown scheme, nothing.
        ("agents.example.com", ["https://agents.example.com"]),
        ("127.0.0.1:5000/x", ["http://127.0.0.1:5000/"]),
        ("user@127.0.0.1:5000", ["http://127.0.0.1:5000"]),
        ("unix:///tmp/sock", ["http://127.0.0.1:5000"]),
        ("", ["http://127.0.0.1:5000"]),
    ],
)
def test_a_grpc_interface_outside_the_allow_list_is_refused(url: str, allowed: list[str]) -> None:
    with pytest.raises(NotAllowed):
        grpc_target(url, allowed)
