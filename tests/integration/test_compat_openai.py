"""The official openai SDK against /v1/chat/completions and /v1/responses, through Envoy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, cast

import openai
import pytest

from tests.conftest import SharedMesh


@pytest.fixture
def sdk(shared_mesh: SharedMesh) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(
        base_url=f"http://{shared_mesh.edge}/v1", api_key="not-needed", max_retries=0
    )
    yield client
    client.close()


def test_chat_completion(sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "What is 12*(3+4)?"}]
    )
    assert completion.object == "chat.completion"
    assert completion.model == "demo"
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert "84" in (choice.message.content or "")
    assert completion.usage is not None
    assert completion.usage.total_tokens > 0


def test_streamed_chat_completion_with_usage(sdk: openai.OpenAI) -> None:
    stream = sdk.chat.completions.create(
        model="echo",
        messages=[{"role": "user", "content": "one two three"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "one two three"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop"
    assert finishes.count("stop") == 1
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == 6
    assert len({c.id for c in chunks}) == 1


def test_stateless_client_gets_the_conversation_it_sent(sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.create(
        model="demo",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": [{"type": "text", "text": "What did I ask first?"}]},
        ],
    )
    assert "What is 2+2?" in (completion.choices[0].message.content or "")


def test_stateful_conversation_with_x_session_id(sdk: openai.OpenAI) -> None:
    headers = {"X-Session-Id": "openai-thread-1"}
    raw = sdk.chat.completions.with_raw_response.create(
        model="demo",
        messages=[{"role": "user", "content": "What is 12*(3+4)?"}],
        extra_headers=headers,
    )
    assert raw.headers["x-session-id"] == "openai-thread-1"
    # Only the new message: the server keeps the history.
    second = sdk.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "What did I ask first?"}],
        extra_headers=headers,
    )
    assert "What is 12*(3+4)?" in (second.choices[0].message.content or "")


def test_throwaway_sessions_are_named_and_removed(
    sdk: openai.OpenAI, shared_mesh: SharedMesh
) -> None:
    raw = sdk.chat.completions.with_raw_response.create(
        model="echo", messages=[{"role": "user", "content": "hi"}]
    )
    session_id = raw.headers["x-session-id"]
    assert session_id
    import httpx

    gone = httpx.get(f"http://{shared_mesh.edge}/v1/sessions/{session_id}")
    assert gone.status_code == 404


def test_unknown_model_raises_the_sdks_not_found_error(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        sdk.chat.completions.create(
            model="no-such-agent", messages=[{"role": "user", "content": "hi"}]
        )
    assert info.value.status_code == 404
    assert info.value.code == "model_not_found"
    assert info.value.param == "model"
    assert info.value.type == "invalid_request_error"


def test_bad_request_uses_openais_error_shape(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="demo", messages=[{"role": "user", "content": "  "}])
    # `param` names the caller's field, never the native API's `message`.
    assert info.value.param == "messages[0].content"
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(
            model="demo", messages=[{"role": "assistant", "content": "no user message"}]
        )
    assert info.value.param == "messages[0].role"
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(
            model="demo",
            messages=cast(Any, [{"role": "system", "content": "s"}, {"role": "robot"}]),
        )
    assert info.value.param == "messages[1].role"
    with pytest.raises(openai.BadRequestError) as info:
        sdk.responses.create(model="demo", input="   ")
    assert info.value.param == "input"
    with pytest.raises(openai.BadRequestError) as info:
        sdk.responses.create(model="demo", input=[{"role": "user", "content": "x" * 10_001}])
    assert info.value.param == "input[0].content"
    with pytest.raises(openai.BadRequestError) as info:
        sdk.responses.create(
            model="demo", input=cast(Any, [{"role": "user", "content": "a"}, {"role": "robot"}])
        )
    assert info.value.param == "input[1].role"  # not pydantic's union branch names
    with pytest.raises(openai.BadRequestError) as info:
        sdk.responses.create(model="demo", input=cast(Any, 5))
    assert info.value.param == "input"


def test_response_create_and_retrieve(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(model="demo", input="What is 6*7?")
    assert response.status == "completed"
    assert response.id.startswith("resp_")
    assert "42" in response.output_text
    assert response.usage is not None
    assert response.usage.total_tokens > 0
    stored = sdk.responses.retrieve(response.id)
    assert stored.id == response.id
    assert stored.output_text == response.output_text
    assert stored.model == "demo"
    assert stored.usage is not None
    assert stored.usage.total_tokens == response.usage.total_tokens


def test_streamed_response_and_previous_response_id(sdk: openai.OpenAI) -> None:
    first = sdk.responses.create(model="demo", input="What is 12*(3+4)?")
    with sdk.responses.stream(
        model="demo",
        input=[{"role": "user", "content": "What did I ask first?"}],
        previous_response_id=first.id,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert "response.output_text.delta" in kinds
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(numbers)
    assert len(set(numbers)) == len(numbers)
    assert "What is 12*(3+4)?" in final.output_text
    assert final.status == "completed"


def test_unknown_previous_response_is_not_found(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        sdk.responses.create(
            model="demo", input="hi", previous_response_id="resp_01J00000000000000000000000.bm9wZQ"
        )
    with pytest.raises(openai.BadRequestError) as info:
        sdk.responses.create(model="demo", input="hi", previous_response_id="garbage")
    assert info.value.param == "previous_response_id"


def test_every_error_on_openai_paths_has_openais_shape(shared_mesh: SharedMesh) -> None:
    import httpx

    base = f"http://{shared_mesh.edge}"
    with httpx.Client(base_url=base, timeout=60) as http:
        bad_json = http.post(
            "/v1/chat/completions", content=b"{oops", headers={"content-type": "application/json"}
        )
    assert bad_json.status_code == 400
    assert bad_json.headers["content-type"].startswith("application/json")
    assert bad_json.json()["error"]["param"] == "body"
    from tests.integration.test_edge_errors import _raw_request

    status, headers, body = _raw_request(
        shared_mesh.edge,
        "POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {150 * 1024 * 1024}\r\nExpect: 100-continue\r\n\r\n",
    )
    assert status == 413
    assert headers["content-type"].startswith("application/json")
    for error in (bad_json.json()["error"], json.loads(body)["error"]):
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error"


def test_a_streamed_responses_text_is_its_deltas(sdk: openai.OpenAI) -> None:
    # The demo agent calls its calculator: text streams before and after the tool.
    with sdk.responses.stream(model="demo", input="What is 6*7?") as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert done.text == deltas
    assert final.output_text == deltas
    assert "42" in deltas


def test_models_list_the_agents_the_mesh_serves(sdk: openai.OpenAI) -> None:
    models = {model.id: model for model in sdk.models.list()}
    assert {"demo", "echo"} <= set(models)
    for model in models.values():
        assert model.object == "model"
        assert model.owned_by == "turnmesh"
        assert model.created > 1_700_000_000
    demo = sdk.models.retrieve("demo")
    assert (demo.id, demo.object, demo.owned_by) == ("demo", "model", "turnmesh")
    # Each listed model is one a request can name.
    answer = sdk.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "listed and served"}]
    )
    assert answer.choices[0].message.content == "listed and served"


def test_an_unserved_model_is_openais_not_found(
    sdk: openai.OpenAI, shared_mesh: SharedMesh
) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        sdk.models.retrieve("no-such-agent")
    assert info.value.code == "model_not_found"
    assert info.value.param == "model"
    assert info.value.type == "invalid_request_error"
    assert "no-such-agent" in info.value.message
    import httpx

    with httpx.Client(base_url=f"http://{shared_mesh.edge}", timeout=60) as http:
        long_id = http.get("/v1/models/" + "x" * 5000)
    assert long_id.status_code == 404
    error = long_id.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "x" * 200 not in error["message"]  # not echoed back


@pytest.mark.parametrize(
    "path",
    [
        "/v1/embeddings",
        "/v1/completions",
        "/v1/images/generations",
        "/v1/audio/speech",
        "/v1/files",
        "/v1/moderations",
        "/v1/assistants",
        "/v1/threads/t1/runs",
        "/v1/batches",
    ],
)
def test_openai_apis_turnmesh_does_not_serve_are_openais_404(
    shared_mesh: SharedMesh, path: str
) -> None:
    import httpx

    with httpx.Client(base_url=f"http://{shared_mesh.edge}", timeout=60) as http:
        answer = http.post(path, json={"model": "demo", "input": "hi"})
    assert answer.status_code == 404
    assert answer.headers["content-type"].startswith("application/json")
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert "/v1/chat/completions" in error["message"]


def test_the_sdk_raises_not_found_for_an_unserved_api(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        sdk.embeddings.create(model="demo", input="hi")
    assert info.value.status_code == 404


def test_other_unknown_paths_keep_problem_json(shared_mesh: SharedMesh) -> None:
    import httpx

    with httpx.Client(base_url=f"http://{shared_mesh.edge}", timeout=60) as http:
        for path in ("/v1/nothing-here", "/v1/embeddingsx"):
            answer = http.post(path, json={})
            assert answer.status_code == 404, path
            assert answer.headers["content-type"] == "application/problem+json", path


def test_a_seeded_conversation_keeps_the_assistants_tool_calls(
    sdk: openai.OpenAI, shared_mesh: SharedMesh
) -> None:
    import httpx

    messages: Any = [
        {"role": "user", "content": "What is 6*7?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression":"6*7"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        {"role": "assistant", "content": "6*7 = 42."},
        {"role": "user", "content": "what did I ask first?"},
    ]
    answer = sdk.chat.completions.create(
        model="demo", messages=messages, extra_headers={"X-Session-Id": "seeded-with-tools"}
    )
    assert "What is 6*7?" in (answer.choices[0].message.content or "")
    with httpx.Client(base_url=f"http://{shared_mesh.edge}", timeout=60) as http:
        history = http.get("/v1/sessions/seeded-with-tools/history").json()["messages"]
    assert history[1]["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "calculator", "arguments": '{"expression":"6*7"}'},
        }
    ]
    assert history[2]["tool_call_id"] == "call_1"
