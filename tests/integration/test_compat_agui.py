"""The real AG-UI client (@ag-ui/client from npm, on Node.js) against /v1/agui."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import httpx

from tests.conftest import SharedMesh
from turnmesh.client import AsyncClient

CLIENT_DIR = Path(__file__).resolve().parents[2] / "clients" / "agui"


def _run_node(url: str, thread: str) -> tuple[dict[str, object], str]:
    node = shutil.which("node")
    assert node, "node is installed by `make install` (system-deps)"
    result = subprocess.run(
        [node, "run.mjs", url, thread],
        cwd=CLIENT_DIR,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def test_agui_client_runs_two_turns_on_one_thread(shared_mesh: SharedMesh) -> None:
    output, stderr = _run_node(f"http://{shared_mesh.edge}/v1/agui", "agui-thread-1")
    assert "error" not in output, output
    # The client's own verification passed, with no warning about our events.
    assert "warn" not in stderr.lower(), stderr
    events = output["events"]
    assert isinstance(events, list)
    assert events[0] == "RUN_STARTED"
    assert events.count("RUN_STARTED") == 2
    assert events[-1] == "RUN_FINISHED"
    messages = output["messages"]
    assert isinstance(messages, list)
    roles = [m["role"] for m in messages]
    assert roles == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert messages[1]["toolCalls"][0]["function"]["name"] == "calculator"
    assert messages[2]["content"] == "84"
    assert "What is 12*(3+4)?" in messages[-1]["content"]


async def test_the_thread_is_a_session(shared_mesh: SharedMesh, client: AsyncClient) -> None:
    _run_node(f"http://{shared_mesh.edge}/v1/agui", "agui-thread-2")
    history = await client.history("agui-thread-2")
    assert [m.role for m in history] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]


async def test_busy_thread_under_reject_is_409_with_retry_after(
    shared_mesh: SharedMesh, client: AsyncClient, rest: httpx.AsyncClient
) -> None:
    sid = (await client.create_session("agui-busy", agent="probe")).session_id
    body = {
        "threadId": sid,
        "runId": "r",
        "messages": [{"id": "m", "role": "user", "content": "hi"}],
        "forwardedProps": {"policy": "reject"},
    }
    async with client.stream_turn(sid, "slow", metadata={"deltas": 1000, "delay_ms": 50}) as s:
        async for event in s:
            if event.delta:
                response = await rest.post("/v1/agui", json=body)
                assert response.status_code == 409
                assert response.headers["retry-after"] == "1"
                assert response.headers["content-type"] == "application/problem+json"
                assert response.json()["reason"] == "SESSION_BUSY"
                await client.cancel_turn(sid, event.run_id)
                # Deltas already on their way still arrive: the session is
                # no longer busy for them.
                break


async def test_bad_run_input_is_400(rest: httpx.AsyncClient) -> None:
    response = await rest.post("/v1/agui", json={"threadId": "x", "messages": []})
    assert response.status_code == 400
    assert response.json()["violations"][0]["field"] == "messages"
