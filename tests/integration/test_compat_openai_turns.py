"""OpenAI semantics of a turn's life, with the official openai SDK through Envoy:
a client's abort cancels the turn (unless it asks to continue), and a turn
cancelled or failed on the server is a 4xx the SDK does not retry."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import SharedMesh
from tests.support.mesh import wait_for


@pytest.fixture
def counted(shared_mesh: SharedMesh) -> Iterator[Callable[..., Counted]]:
    made: list[Counted] = []

    def make(max_retries: int = 0, **headers: str) -> Counted:
        made.append(Counted(shared_mesh, max_retries, **headers))
        return made[-1]

    yield make
    for client in made:
        client.sdk.close()


@pytest.fixture
def http(shared_mesh: SharedMesh) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{shared_mesh.edge}", timeout=60) as client:
        yield client


class Counted:
    """An openai SDK whose HTTP requests are counted (its retries show)."""

    def __init__(self, shared_mesh: SharedMesh, max_retries: int = 0, **headers: str) -> None:
        self.requests = 0
        self.http = openai.DefaultHttpxClient(event_hooks={"request": [self._count]}, timeout=60)
        self.sdk = openai.OpenAI(
            base_url=f"http://{shared_mesh.edge}/v1",
            api_key="not-needed",
            max_retries=max_retries,
            http_client=self.http,
            default_headers=headers,
        )

    def _count(self, request: httpx.Request) -> None:
        self.requests += 1


def _probe(shared_mesh: SharedMesh) -> Path:
    return Path(shared_mesh.mesh.probe_dir)


def _turn_of(response_id: str) -> str:
    return response_id.removeprefix("resp_").split(".", 1)[0]


def test_an_aborted_responses_stream_cancels_its_turn(
    shared_mesh: SharedMesh, http: httpx.Client, counted: Callable[..., Counted]
) -> None:
    client = counted()
    gate = uuid.uuid4().hex  # never opened: the turn runs until cancelled
    stream = client.sdk.responses.create(
        model="probe", input="slow", stream=True, metadata={"gate": gate, "deltas": "3"}
    )
    response_id = ""
    for event in stream:
        if event.type == "response.created":
            response_id = event.response.id
        if event.type == "response.output_text.delta":
            break
    stream.close()  # the client's abort
    turn = _turn_of(response_id)
    wait_for((_probe(shared_mesh) / f"{turn}.cancelled").exists, what="the agent's cancel")
    # Nothing was saved: the response is cancelled, with no output, and the
    # session's history holds no turn the client never saw.
    wait_for(
        lambda: http.get(f"/v1/responses/{response_id}").json()["status"] == "cancelled",
        what="the response to say it was cancelled",
    )
    assert http.get(f"/v1/responses/{response_id}").json()["output"] == []
    follow = client.sdk.responses.create(
        model="probe",
        input="next",
        previous_response_id=response_id,
        metadata={"deltas": "1", "delay_ms": "1"},
    )
    assert follow.output_text == "part0 "


def test_an_aborted_chat_completion_leaves_the_sessions_history_unchanged(
    shared_mesh: SharedMesh, http: httpx.Client, counted: Callable[..., Counted]
) -> None:
    client = counted()
    sid = f"abort-{uuid.uuid4().hex[:12]}"
    stream = client.sdk.chat.completions.create(
        model="probe",
        messages=[{"role": "user", "content": "slow"}],
        stream=True,
        metadata={"gate": uuid.uuid4().hex, "deltas": "3"},
        extra_headers={"X-Session-Id": sid},
    )
    turn = ""
    for chunk in stream:
        turn = chunk.id.removeprefix("chatcmpl-")
        if chunk.choices and chunk.choices[0].delta.content:
            break
    stream.close()
    wait_for((_probe(shared_mesh) / f"{turn}.cancelled").exists, what="the agent's cancel")
    history = http.get(f"/v1/sessions/{sid}/history").json()
    assert history.get("messages", []) == []


def test_continue_lets_an_aborted_turn_finish_and_be_saved(
    shared_mesh: SharedMesh, http: httpx.Client, counted: Callable[..., Counted]
) -> None:
    client = counted(**{"X-Turnmesh-On-Disconnect": "continue"})
    gate = uuid.uuid4().hex
    stream = client.sdk.responses.create(
        model="probe",
        input="slow",
        stream=True,
        metadata={"gate": gate, "deltas": "3", "delay_ms": "1"},
    )
    response_id = ""
    for event in stream:
        if event.type == "response.created":
            response_id = event.response.id
        if event.type == "response.output_text.delta":
            break
    stream.close()
    (_probe(shared_mesh) / f"gate-{gate}").write_text("open")
    wait_for(
        lambda: http.get(f"/v1/responses/{response_id}").json()["status"] == "completed",
        what="the turn to finish without its client",
    )
    saved = client.sdk.responses.retrieve(response_id)
    assert saved.output_text == "part0 part1 part2 "
    assert not (_probe(shared_mesh) / f"{_turn_of(response_id)}.cancelled").exists()


def test_an_unknown_disconnect_policy_is_a_400(http: httpx.Client) -> None:
    answer = http.post(
        "/v1/chat/completions",
        json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]},
        headers={"X-Turnmesh-On-Disconnect": "sometimes"},
    )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "X-Turnmesh-On-Disconnect"
    assert "cancel or continue" in error["message"]


def test_a_turn_cancelled_on_the_server_is_a_409_the_sdk_does_not_retry(
    shared_mesh: SharedMesh, http: httpx.Client, counted: Callable[..., Counted]
) -> None:
    client = counted(max_retries=3)
    sid = f"cancelled-{uuid.uuid4().hex[:12]}"
    raised: list[BaseException] = []

    def complete() -> None:
        try:
            client.sdk.chat.completions.create(
                model="probe",
                messages=[{"role": "user", "content": "slow"}],
                metadata={"gate": uuid.uuid4().hex, "deltas": "3"},
                extra_headers={"X-Session-Id": sid},
            )
        except BaseException as exc:  # the test reads it below
            raised.append(exc)

    caller = threading.Thread(target=complete)
    caller.start()

    def running() -> str:
        answer = http.get(f"/v1/sessions/{sid}")
        return answer.json()["session"].get("runningTurnId", "") if answer.is_success else ""

    wait_for(running, what="the turn to start")
    turn = running()
    assert http.post(f"/v1/sessions/{sid}/turns/{turn}:cancel", json={}).is_success
    caller.join(60)
    (error,) = raised
    assert isinstance(error, openai.ConflictError)
    assert error.code == "turn_cancelled"
    assert error.response.headers["x-should-retry"] == "false"
    assert client.requests == 1  # no retry
    assert http.get(f"/v1/sessions/{sid}/history").json().get("messages", []) == []


def test_a_turn_its_agent_fails_is_a_400_the_sdk_does_not_retry(
    counted: Callable[..., Counted],
) -> None:
    client = counted(max_retries=3)
    with pytest.raises(openai.BadRequestError) as info:
        client.sdk.responses.create(
            model="probe", input="fail", metadata={"fail_once": uuid.uuid4().hex}
        )
    assert info.value.code == "turn_failed"
    assert "fails once, on purpose" in info.value.message
    assert info.value.response.headers["x-should-retry"] == "false"
    assert client.requests == 1


def test_continue_keeps_a_throwaway_session_until_its_turn_is_saved(
    shared_mesh: SharedMesh, http: httpx.Client, counted: Callable[..., Counted]
) -> None:
    client = counted(**{"X-Turnmesh-On-Disconnect": "continue"})
    gate = uuid.uuid4().hex
    with client.sdk.chat.completions.with_streaming_response.create(
        model="probe",
        messages=[{"role": "user", "content": "slow"}],
        stream=True,
        metadata={"gate": gate, "deltas": "3", "delay_ms": "1"},
    ) as raw:
        sid = raw.headers["x-session-id"]  # no X-Session-Id sent: a throw-away session
        for line in raw.iter_lines():
            if '"content":"part0' in line:
                break
    (_probe(shared_mesh) / f"gate-{gate}").write_text("open")
    wait_for(
        lambda: len(http.get(f"/v1/sessions/{sid}/history").json().get("messages", [])) == 2,
        what="the turn to be saved on its session",
    )
