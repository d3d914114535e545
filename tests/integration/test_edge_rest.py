"""REST/JSON and SSE through the real Envoy, read with httpx and httpx-sse."""

from __future__ import annotations

import json
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from tests.conftest import SharedMesh
from turnmesh.client import AsyncClient

Event = dict[str, Any]


async def _create(rest: httpx.AsyncClient, **body: Any) -> str:
    response = await rest.post("/v1/sessions", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    return str(response.json()["session"]["sessionId"])


async def _turn(rest: httpx.AsyncClient, sid: str, message: str, **body: Any) -> list[Event]:
    async with aconnect_sse(
        rest, "POST", f"/v1/sessions/{sid}/turns", json={"message": message, **body}
    ) as source:
        assert source.response.headers["content-type"].startswith("text/event-stream")
        return [json.loads(sse.data) async for sse in source.aiter_sse()]


def _text(events: list[Event]) -> str:
    parts: list[str] = []
    for e in events:
        if e["type"] == "TOOL_CALL_RESULT":
            parts.clear()
        elif e["type"] == "TEXT_MESSAGE_CONTENT":
            parts.append(e["delta"])
    return "".join(parts)


async def test_rest_conversation_over_sse(rest: httpx.AsyncClient) -> None:
    sid = await _create(rest)
    first = await _turn(rest, sid, "What is 12*(3+4)?")
    assert first[0]["type"] == "RUN_STARTED"
    assert first[-1]["type"] == "RUN_FINISHED"
    assert [e["seq"] for e in first] == list(range(1, len(first) + 1))
    assert all(e["threadId"] == sid for e in first)
    assert isinstance(first[0]["timestamp"], int)  # AG-UI requires a safe integer
    assert first[-1]["usage"][0]["totalTokens"] > 0
    assert "84" in _text(first)
    tool = next(e for e in first if e["type"] == "TOOL_CALL_START")
    assert tool["toolCallName"] == "calculator"

    second = await _turn(rest, sid, "What did I ask first?")
    assert "What is 12*(3+4)?" in _text(second)

    history = (await rest.get(f"/v1/sessions/{sid}/history")).json()["messages"]
    roles = ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert [m["role"] for m in history] == roles
    assert history[1]["tool_calls"][0]["function"]["name"] == "calculator"
    assert history[2]["tool_call_id"] == history[1]["tool_calls"][0]["id"]

    summary = (await rest.get(f"/v1/sessions/{sid}")).json()["session"]
    assert summary["messageCount"] == 6

    deleted = await rest.delete(f"/v1/sessions/{sid}")
    assert deleted.json() == {"deleted": True}
    again = await rest.delete(f"/v1/sessions/{sid}")
    assert again.status_code == 200
    assert again.json() == {"deleted": False}  # unary answers print zero fields
    assert (await rest.get(f"/v1/sessions/{sid}")).status_code == 404


async def test_sse_events_arrive_while_the_turn_runs(rest: httpx.AsyncClient) -> None:
    sid = await _create(rest, agentName="probe")
    body = {"message": "go", "metadata": {"deltas": 30, "delay_ms": 100}}
    seen: list[Event] = []
    async with aconnect_sse(rest, "POST", f"/v1/sessions/{sid}/turns", json=body) as source:
        async for sse in source.aiter_sse():
            seen.append(json.loads(sse.data))
            if seen[-1]["type"] == "TEXT_MESSAGE_CONTENT" and len(seen) == 3:
                # The first delta is here while the agent still has 29 to go.
                session = (await rest.get(f"/v1/sessions/{sid}")).json()["session"]
                assert session["turnRunning"] is True
                assert session["runningTurnId"] == seen[0]["runId"]
    assert seen[-1]["type"] == "RUN_FINISHED"


async def test_disconnect_then_resume_over_rest(rest: httpx.AsyncClient) -> None:
    sid = await _create(rest, agentName="probe")
    body = {"message": "go", "metadata": {"deltas": 10, "delay_ms": 50}}
    seen: list[Event] = []
    async with aconnect_sse(rest, "POST", f"/v1/sessions/{sid}/turns", json=body) as source:
        async for sse in source.aiter_sse():
            seen.append(json.loads(sse.data))
            if len(seen) == 4:
                break  # leaving the block closes the HTTP stream
    turn_id, last = seen[0]["runId"], seen[-1]["seq"]
    async with aconnect_sse(
        rest, "GET", f"/v1/sessions/{sid}/turns/{turn_id}/events", params={"after_seq": last}
    ) as source:
        rest_events = [json.loads(sse.data) async for sse in source.aiter_sse()]
    assert [e["seq"] for e in rest_events] == list(range(last + 1, last + 1 + len(rest_events)))
    assert rest_events[-1]["type"] == "RUN_FINISHED"
    deltas = [e["delta"] for e in seen + rest_events if e["type"] == "TEXT_MESSAGE_CONTENT"]
    assert "".join(deltas) == "".join(f"part{i} " for i in range(10))


async def test_cancel_a_slow_turn_over_rest(rest: httpx.AsyncClient) -> None:
    sid = await _create(rest, agentName="probe")
    body = {"message": "slow", "metadata": {"deltas": 1000, "delay_ms": 50}}
    seen: list[Event] = []
    async with aconnect_sse(rest, "POST", f"/v1/sessions/{sid}/turns", json=body) as source:
        async for sse in source.aiter_sse():
            seen.append(json.loads(sse.data))
            if len(seen) == 3:
                response = await rest.post(
                    f"/v1/sessions/{sid}/turns/{seen[0]['runId']}:cancel", json={}
                )
                assert response.json() == {"state": "TURN_STATE_CANCELLED"}
    assert seen[-1]["type"] == "RUN_ERROR"
    assert seen[-1]["code"] == "cancelled"
    assert seen[-1]["problem"]["status"] == 499
    assert (await rest.get(f"/v1/sessions/{sid}/history")).json() == {"messages": []}


async def test_health_and_readiness_over_rest(rest: httpx.AsyncClient) -> None:
    health = (await rest.get("/health")).json()
    assert health["status"] in ("LIFECYCLE_STATE_READY", "LIFECYCLE_STATE_RUNNING")
    assert health["agentName"] == "demo"
    assert health["agentReady"] is True
    ready = await rest.get("/ready")
    assert ready.status_code == 200
    assert ready.json()["ready"] is True


async def test_native_grpc_and_typed_client_through_envoy(shared_mesh: SharedMesh) -> None:
    async with AsyncClient(shared_mesh.edge) as client:
        sid = (await client.create_session()).session_id
        result = await client.send(sid, "What is 6*7?")
        assert "42" in result.text
        assert len(await client.history(sid)) == 4


async def test_attachments_up_to_the_limit_pass_through_envoy(rest: httpx.AsyncClient) -> None:
    import base64

    sid = await _create(rest, agentName="echo")
    fifty_mb = base64.b64encode(b"a" * (50 * 1024 * 1024)).decode()
    files = [
        {"content": fifty_mb, "mime_type": "text/plain", "filename": f"part{i}.txt"} for i in (1, 2)
    ]
    events = await _turn(rest, sid, "two big files", files=files)
    assert events[-1]["type"] == "RUN_FINISHED"
    history = (await rest.get(f"/v1/sessions/{sid}/history")).json()["messages"]
    assert [f["size_bytes"] for f in history[0]["files"]] == [str(50 * 1024 * 1024)] * 2


async def test_an_idempotency_key_reused_with_another_body_is_409(
    rest: httpx.AsyncClient,
) -> None:
    """The key names its first turn: the same body replays it, another body
    is a conflict (never silently the old turn, never retryable)."""
    sid = await _create(rest, agentName="echo")
    first = await _turn(rest, sid, "once", idempotencyKey="key-409")
    again = await _turn(rest, sid, "once", idempotencyKey="key-409")
    assert again == first
    refused = await rest.post(
        f"/v1/sessions/{sid}/turns", json={"message": "other", "idempotencyKey": "key-409"}
    )
    assert refused.status_code == 409
    assert refused.headers["content-type"] == "application/problem+json"
    assert "retry-after" not in refused.headers
    problem = refused.json()
    assert problem["type"] == "https://turnmesh.dev/problems/idempotency-key-reused"
    assert problem["reason"] == "IDEMPOTENCY_KEY_REUSED"
    history = (await rest.get(f"/v1/sessions/{sid}/history")).json()["messages"]
    assert [m["content"] for m in history] == ["once", "once"]


def _empty_values(value: Any) -> list[Any]:
    """Every empty string, false, zero, empty list or object inside ``value``."""
    if isinstance(value, dict):
        return [v for item in value.values() for v in _empty_values(item)]
    if isinstance(value, list):
        return [value] if not value else [v for item in value for v in _empty_values(item)]
    return [value] if value in ("", False, 0) and value is not True else []


async def test_unary_answers_print_zero_fields_and_streams_keep_aguis_shapes(
    rest: httpx.AsyncClient,
) -> None:
    sid = await _create(rest, agent_name="echo")
    session = (await rest.get(f"/v1/sessions/{sid}")).json()["session"]
    assert session["messageCount"] == 0
    assert session["turnRunning"] is False
    assert session["runningTurnId"] == ""
    assert (await rest.get(f"/v1/sessions/{sid}/history")).json() == {"messages": []}
    health = (await rest.get("/health")).json()
    assert {"activeSessions", "runningTurns", "agentReady", "routerConnected"} <= set(health)
    listing = (await rest.get("/v1/sessions", params={"agent_name": "no-such"})).json()
    assert listing == {"sessions": [], "nextPageToken": ""}
    events = await _turn(rest, sid, "hello")
    # A streamed event holds only what it sets: the AG-UI client rejects an
    # empty `role` and other empty defined fields.
    for event in events:
        assert _empty_values(event) == [], event
    turn = events[0]["runId"]
    cancelled = await rest.post(f"/v1/sessions/{sid}/turns/{turn}:cancel", json={})
    assert cancelled.json() == {"state": "TURN_STATE_FINISHED"}
    assert (await rest.delete(f"/v1/sessions/{sid}-none")).json() == {"deleted": False}
