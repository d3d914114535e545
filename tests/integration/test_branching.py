"""Branches of a conversation: ForkSession (native gRPC and REST), a Responses
`previous_response_id` naming an older response, and item references, with
the typed client, the openai SDK and the Vercel AI SDK."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest

from tests.conftest import SharedMesh
from turnmesh.client import (
    AlreadyExistsError,
    AsyncClient,
    InvalidArgumentError,
    NotFoundError,
)

AISDK_DIR = Path(__file__).resolve().parents[2] / "clients" / "aisdk"


@pytest.fixture
def sdk(shared_mesh: SharedMesh) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(
        base_url=f"http://{shared_mesh.edge}/v1", api_key="not-needed", max_retries=0
    )
    yield client
    client.close()


@pytest.fixture
def http(shared_mesh: SharedMesh) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{shared_mesh.edge}", timeout=60) as client:
        yield client


async def test_fork_keeps_the_history_up_to_a_turn_and_leaves_the_source(
    client: AsyncClient, client2: AsyncClient
) -> None:
    source = await client.create_session(agent="echo", metadata={"team": "a"})
    turns = [(await client.send(source.session_id, text)).turn_id for text in "abc"]
    # Forked through the other server: the fork reads where the source lives.
    fork = await client2.fork_session(source.session_id, turns[1])
    assert fork.session_id != source.session_id
    assert fork.agent_name == "echo"
    assert dict(fork.metadata) == {"team": "a"}
    kept = await client.history(fork.session_id)
    assert [m.content for m in kept] == ["a", "a", "b", "b"]
    assert [m.turn_id for m in kept] == [turns[0]] * 2 + [turns[1]] * 2
    # The branch goes on on its own; the source is as it was.
    await client.send(fork.session_id, "z")
    assert [m.content for m in await client.history(fork.session_id)][-2:] == ["z", "z"]
    assert [m.content for m in await client.history(source.session_id)] == list("aabbcc")
    whole = await client.fork_session(source.session_id, new_session_id=f"{source.session_id}-b")
    assert whole.session_id == f"{source.session_id}-b"
    assert len(await client.history(whole.session_id)) == 6
    renamed = await client.fork_session(source.session_id, turns[0], metadata={})
    assert dict(renamed.metadata) == {}


async def test_fork_refuses_what_it_cannot_do_and_changes_nothing(client: AsyncClient) -> None:
    source = await client.create_session(agent="echo")
    await client.send(source.session_id, "one")
    with pytest.raises(NotFoundError) as missing:
        await client.fork_session(source.session_id, "no-such-turn")
    assert "not in the session's history" in str(missing.value)
    with pytest.raises(NotFoundError):
        await client.fork_session("no-such-session")
    with pytest.raises(InvalidArgumentError) as bad:
        await client.fork_session(source.session_id, "t" * 129, new_session_id="bad id!")
    assert set(bad.value.violations) == {"at_turn_id", "new_session_id"}
    with pytest.raises(AlreadyExistsError):
        await client.fork_session(source.session_id, new_session_id=source.session_id)
    assert [m.content for m in await client.history(source.session_id)] == ["one", "one"]


def test_fork_over_rest(http: httpx.Client) -> None:
    sid = http.post("/v1/sessions", json={"agent_name": "echo"}).json()["session"]["sessionId"]
    events = http.post(f"/v1/sessions/{sid}/turns", json={"message": "hello"}).text
    turn = json.loads(events.strip().splitlines()[0].removeprefix("data: "))["runId"]
    forked = http.post(f"/v1/sessions/{sid}:fork", json={"at_turn_id": turn})
    assert forked.status_code == 200, forked.text
    fork = forked.json()["session"]["sessionId"]
    history = http.get(f"/v1/sessions/{fork}/history").json()["messages"]
    assert [m["content"] for m in history] == ["hello", "hello"]
    unknown = http.post(f"/v1/sessions/{sid}:fork", json={"at_turn_id": "nope"})
    assert unknown.status_code == 404
    assert unknown.headers["content-type"] == "application/problem+json"
    assert unknown.json()["reason"] == "TURN_NOT_FOUND"


def test_an_older_previous_response_branches(sdk: openai.OpenAI) -> None:
    first = sdk.responses.create(model="demo", input="alpha")
    second = sdk.responses.create(model="demo", input="bravo", previous_response_id=first.id)
    # From `first` again: a branch that never saw "bravo".
    branch = sdk.responses.create(
        model="demo", input="what did I ask before?", previous_response_id=first.id
    )
    assert "alpha" in branch.output_text
    assert "bravo" not in branch.output_text
    assert branch.previous_response_id == first.id
    # Later responses chain from the branch.
    after = sdk.responses.create(
        model="demo", input="what did I ask before?", previous_response_id=branch.id
    )
    assert "what did I ask before?" in after.output_text
    # The first line stays as it was, and still continues in place.
    assert sdk.responses.retrieve(second.id).output_text == second.output_text
    main = sdk.responses.create(
        model="demo", input="what did I ask before?", previous_response_id=second.id
    )
    assert "bravo" in main.output_text
    assert main.id.split(".", 1)[1] == second.id.split(".", 1)[1]  # the same session
    assert branch.id.split(".", 1)[1] != first.id.split(".", 1)[1]  # a fork


def test_item_references_resolve_against_the_conversation(
    sdk: openai.OpenAI, http: httpx.Client
) -> None:
    first = sdk.responses.create(model="demo", input="What is 6*7?")
    (item,) = first.output
    answer = sdk.responses.create(
        model="demo",
        input=cast(
            Any,
            [
                {"role": "user", "content": "What is 6*7?"},
                {"type": "item_reference", "id": item.id},
                {"role": "user", "content": "what did I ask first?"},
            ],
        ),
    )
    assert "What is 6*7?" in answer.output_text
    encoded = answer.id.split(".", 1)[1]
    session = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    seeded = http.get(f"/v1/sessions/{session}/history").json()["messages"]
    assert seeded[1] | {"content": first.output_text} == seeded[1]  # the answer itself
    assert seeded[1]["role"] == "assistant"
    reply = http.post(
        "/v1/responses",
        json={
            "model": "demo",
            "input": [
                {"role": "user", "content": "hi"},
                {"type": "item_reference", "id": "msg_01J00000000000000000000000.bm9wZQ"},
                {"role": "user", "content": "and?"},
            ],
        },
    )
    assert reply.status_code == 404
    assert reply.json()["error"]["param"] == "input[1].id"
    assert reply.json()["error"]["code"] == "item_not_found"
    for bad in ({"type": "item_reference"}, {"type": "function_call", "id": "x"}):
        refused = http.post(
            "/v1/responses",
            json={"model": "demo", "input": [bad, {"role": "user", "content": "x"}]},
        )
        assert refused.status_code == 400, refused.text
        # A function_call without its call_id (a reference without its id).
        assert refused.json()["error"]["param"] in ("input[0].id", "input[0].call_id")


def test_the_vercel_ai_sdk_holds_a_conversation_with_its_defaults(
    shared_mesh: SharedMesh,
) -> None:
    node = shutil.which("node")
    assert node, "node is installed by `make install` (system-deps)"
    result = subprocess.run(
        [node, "run.mjs", f"http://{shared_mesh.edge}/v1", "demo"],
        cwd=AISDK_DIR,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    first, second, third = output["texts"]
    assert "42" in first
    assert "What is 6*7?" in second
    assert "what did I ask first?" in third
    # It did send its earlier answers as item references (its default).
    references = [
        item
        for body in output["sent"]
        for item in body["input"]
        if item.get("type") == "item_reference"
    ]
    assert len(references) == 3  # one in the second request, two in the third


def test_a_continuation_racing_a_running_one_branches(
    sdk: openai.OpenAI, shared_mesh: SharedMesh
) -> None:
    first = sdk.responses.create(model="demo", input="alpha")
    # The first continuation is still streaming when the second arrives.
    with sdk.responses.stream(
        model="demo",
        input="what did I ask before? (one)",
        previous_response_id=first.id,
        metadata={"delay_ms": "50"},
    ) as running:
        for event in running:
            if event.type == "response.output_text.delta":
                break
        second = sdk.responses.create(
            model="demo", input="what did I ask before? (two)", previous_response_id=first.id
        )
        one = running.get_final_response()
    for answer in (one, second):
        assert "alpha" in answer.output_text, answer.output_text
    assert one.id != second.id
    assert "(one)" not in second.output_text


def test_references_are_bounded_and_named_as_the_callers_fields(http: httpx.Client) -> None:
    first = http.post("/v1/responses", json={"model": "echo", "input": "x" * 9000}).json()
    item = first["output"][0]["id"]
    many = [{"type": "item_reference", "id": item}] * 999
    refused = http.post(
        "/v1/responses",
        json={"model": "echo", "input": [*many, {"role": "user", "content": "and?"}]},
    )
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "input[888].id"  # past 8,000,000 characters
    long = http.post(
        "/v1/responses",
        json={
            "model": "echo",
            "instructions": "be brief",
            "input": [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "y" * 100_001},
                {"role": "user", "content": "b"},
            ],
        },
    )
    assert long.status_code == 400, long.text
    assert long.json()["error"]["param"] == "input[1].content"
    # A plain string input is the user's message: its own limit, not the list's.
    assert http.post("/v1/responses", json={"model": "echo", "input": "z" * 5000}).is_success
