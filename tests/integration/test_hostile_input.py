"""Hostile input the fuzz test does not reach by chance: deep nesting, lone
surrogates, wrong JSON types on the compatibility surfaces, zip files that
lie about their size. Every answer is a 4xx problem (never a 5xx, never an
exception's text), and the server's event loop keeps answering meanwhile."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import SharedMesh


def _deep(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def _deep_list(depth: int) -> str:
    return "[" * depth + "]" * depth


CASES = [
    ("POST", "/v1/sessions", '{"metadata": ' + _deep(60) + "}"),
    ("POST", "/v1/sessions", '{"metadata": ' + _deep(2000) + "}"),
    ("POST", "/v1/sessions/{sid}/turns", '{"message": "hi", "metadata": ' + _deep(60) + "}"),
    ("POST", "/v1/sessions/{sid}/turns", '{"message": "\\ud800"}'),
    ("POST", "/v1/sessions/{sid}/turns", '{"message": "ok \\udfff tail"}'),
    ("POST", "/v1/chat/completions", '{"model": "echo", "messages": ' + _deep_list(100_000) + "}"),
    (
        "POST",
        "/v1/chat/completions",
        '{"model": "echo", "messages": [{"role": "user", "content": "\\ud800"}]}',
    ),
    (
        "POST",
        "/v1/chat/completions",
        '{"model": "echo", "messages": [{"role": "user", "content": ' + _deep(5000) + "}]}",
    ),
    ("POST", "/v1/responses", '{"model": "echo", "input": ' + _deep_list(100_000) + "}"),
    ("POST", "/v1/responses", '{"model": "echo", "input": "\\udc00"}'),
    (
        "POST",
        "/v1/agui",
        '{"threadId": "t", "runId": "r", "forwardedProps": {"policy": []},'
        ' "messages": [{"id": "m", "role": "user", "content": "hi"}]}',
    ),
    (
        "POST",
        "/v1/agui",
        '{"threadId": "t", "runId": "r", "messages": ' + _deep_list(100_000) + "}",
    ),
    ("POST", "/v1/agui", '{"threadId": "\\ud800", "runId": "r", "messages": []}'),
    ("POST", "/v1/chat", '{"message": "\\ud800"}'),
]


@pytest.mark.parametrize(("method", "path", "body"), CASES, ids=range(len(CASES)))
def test_hostile_bodies_get_a_clear_4xx(
    shared_mesh: SharedMesh, method: str, path: str, body: str
) -> None:
    with httpx.Client(base_url=f"http://{shared_mesh.edge}", timeout=60) as rest:
        sid = rest.post("/v1/sessions", json={"agentName": "echo"}).json()["session"]["sessionId"]
        response = rest.request(
            method,
            path.replace("{sid}", sid),
            content=body.encode(),
            headers={"content-type": "application/json"},
        )
        assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
        assert "Traceback" not in response.text and "Error(" not in response.text
        problem = json.loads(response.text)
        # problem+json, or on the OpenAI paths OpenAI's error shape.
        assert "status" in problem or problem["error"]["type"] == "invalid_request_error"
