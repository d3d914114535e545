"""The simple chat API (/v1/chat, /v1/chat:stream) with httpx and httpx-sse."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid

import httpx
from httpx_sse import aconnect_sse

from tests.conftest import SharedMesh
from tests.support.mesh import eventually, until
from turnmesh.client import AsyncClient


async def test_chat_starts_a_session_and_continues_it(rest: httpx.AsyncClient) -> None:
    first = await rest.post("/v1/chat", json={"message": "What is 12*(3+4)?"})
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["content"] == "12*(3+4) = 84."
    # HoloDeck's ChatResponse, every field present; a tool call's arguments
    # are an object, its status success (the raw JSON text rides along).
    assert set(body) == {
        "message_id",
        "content",
        "session_id",
        "tool_calls",
        "tokens_used",
        "execution_time_ms",
        "interrupts",
    }
    assert body["interrupts"] == []
    assert body["tool_calls"][0].pop("id").startswith("call_")
    assert body["tool_calls"] == [
        {
            "name": "calculator",
            "arguments": {"expression": "12*(3+4)"},
            "arguments_json": '{"expression":"12*(3+4)"}',
            "status": "success",
        }
    ]
    assert isinstance(body["execution_time_ms"], int)
    assert body["tokens_used"]["total_tokens"] == (
        body["tokens_used"]["prompt_tokens"] + body["tokens_used"]["completion_tokens"]
    )
    assert body["message_id"]
    session_id = body["session_id"]

    second = await rest.post(
        "/v1/chat", json={"message": "What did I ask first?", "session_id": session_id}
    )
    assert second.json()["session_id"] == session_id
    assert "What is 12*(3+4)?" in second.json()["content"]


async def test_unknown_session_id_starts_a_new_session(rest: httpx.AsyncClient) -> None:
    response = await rest.post(
        "/v1/chat", json={"message": "What did I ask first?", "session_id": "expired-or-never-was"}
    )
    assert response.status_code == 200
    body = response.json()
    assert body["session_id"] != "expired-or-never-was"
    # A fresh session: nothing was asked before.
    assert body["content"] == "You have not asked me anything before this message."


async def test_chat_stream_sends_native_events(rest: httpx.AsyncClient) -> None:
    async with aconnect_sse(
        rest, "POST", "/v1/chat:stream", json={"message": "hello there", "agent_name": "echo"}
    ) as source:
        events = [json.loads(sse.data) async for sse in source.aiter_sse()]
    assert events[0]["type"] == "RUN_STARTED"
    assert events[-1]["type"] == "RUN_FINISHED"
    text = "".join(e.get("delta", "") for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "hello there"


async def test_file_validation_errors_name_the_file(rest: httpx.AsyncClient) -> None:
    response = await rest.post(
        "/v1/chat",
        json={
            "message": "read this",
            "files": [{"content": "UEsDBA==", "mime_type": "application/zip", "filename": "a.zip"}],
        },
    )
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/problem+json"
    violation = response.json()["violations"][0]
    assert violation["field"] == "files[0].mime_type"
    assert "a.zip" in violation["description"]


async def test_text_files_reach_the_agent(rest: httpx.AsyncClient) -> None:
    response = await rest.post(
        "/v1/chat",
        json={
            "message": "here is a note",
            "agent_name": "echo",
            "files": [{"content": "aGVsbG8=", "mime_type": "text/plain", "filename": "n.txt"}],
        },
    )
    assert response.status_code == 200
    session_id = response.json()["session_id"]
    history = (await rest.get(f"/v1/sessions/{session_id}/history")).json()["messages"]
    assert history[0]["files"] == [
        {
            "mime_type": "text/plain",
            "filename": "n.txt",
            "size_bytes": "5",
            "sha256": hashlib.sha256(b"hello").hexdigest(),
            "text": "hello",
            "error": "",
            "truncated": False,
        }
    ]


async def test_zero_and_empty_fields_are_present(rest: httpx.AsyncClient) -> None:
    body = (await rest.post("/v1/chat", json={"message": "hi", "agent_name": "echo"})).json()
    assert body["tool_calls"] == []
    assert set(body["tokens_used"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    # An agent that reports no usage has none (the seed's null), not zeros.
    quiet = await rest.post("/v1/chat", json={"message": "hi", "agent_name": "probe"})
    assert quiet.status_code == 200 and "tokens_used" not in quiet.json()


async def test_requests_on_a_busy_session_each_get_their_own_answer(
    rest: httpx.AsyncClient, client: AsyncClient, shared_mesh: SharedMesh
) -> None:
    sid = (await client.create_session(agent="probe")).session_id
    gate = str(uuid.uuid4())
    body = {"session_id": sid, "agent_name": "probe"}
    first = asyncio.create_task(rest.post("/v1/chat", json={**body, "message": f"gate:{gate}"}))

    async def held() -> bool:
        return (await client.get_session(sid)).turn_running

    await eventually(held, 120, what="the first turn to start")
    # Two more while it runs: each queues a turn of its own.
    queued = [
        asyncio.create_task(rest.post("/v1/chat", json={**body, "message": text}))
        for text in ("second", "third")
    ]

    def sent_on() -> bool:
        # All three are with the servers (Envoy has passed them on).
        stat = shared_mesh.envoy.admin("/stats?filter=^cluster.session_servers.upstream_rq_active$")
        return int(stat.rsplit(":", 1)[-1]) >= 3

    await until(sent_on, 120, what="the queued requests")
    (shared_mesh.mesh.probe_dir / f"gate-{gate}").write_text("open")
    answers = [r.json() for r in await asyncio.gather(first, *queued)]
    assert len({a["message_id"] for a in answers}) == 3
    history = await client.history(sid)
    users = [m.content for m in history if m.role == "user"]
    assert users[0] == f"gate:{gate}" and sorted(users[1:]) == ["second", "third"]
    assert [m.role for m in history].count("assistant") == 3


async def test_holodecks_delete_path_deletes_the_session_idempotently(
    rest: httpx.AsyncClient,
) -> None:
    session_id = (await rest.post("/v1/chat", json={"message": "hi"})).json()["session_id"]
    first = await rest.delete(f"/sessions/{session_id}")
    assert (first.status_code, first.json()["deleted"]) == (200, True)
    again = await rest.delete(f"/sessions/{session_id}")
    assert (again.status_code, again.json()["deleted"]) == (200, False)
    assert (await rest.get(f"/v1/sessions/{session_id}")).status_code == 404


async def test_holodecks_paths_serve_json_too(rest: httpx.AsyncClient) -> None:
    answer = await rest.post("/agent/echo/chat", json={"message": "by the agent's path"})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["content"] == "by the agent's path"  # echo's answer
    session = (await rest.get(f"/v1/sessions/{body['session_id']}")).json()["session"]
    assert session["agentName"] == "echo"
    async with aconnect_sse(
        rest, "POST", "/agent/echo/chat/stream", json={"message": "streamed"}
    ) as source:
        events = [json.loads(e.data) async for e in source.aiter_sse()]
    # Set fields only, as /v1/chat:stream prints them.
    assert events[0]["type"] == "RUN_STARTED" and "delta" not in events[0]
    assert events[-1]["type"] == "RUN_FINISHED"
    health = await rest.get("/health/agent")
    assert health.status_code == 200
    same = (await rest.get("/v1/chat/health")).json()
    assert set(health.json()) == set(same)  # HoloDeck's shape, from any server
    assert (health.json()["status"], health.json()["agent_name"]) == ("healthy", same["agent_name"])
