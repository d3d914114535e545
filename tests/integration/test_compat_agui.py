"""The real AG-UI client (@ag-ui/client from npm, on Node.js) against /v1/agui."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import SharedMesh
from tests.support.mesh import eventually, until
from turnmesh.client import AsyncClient
from turnmesh.v1 import session_service_pb2 as spb

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


@pytest.mark.parametrize("on_disconnect", [None, "continue"])
async def test_abort_run_cancels_the_run_unless_told_to_continue(
    shared_mesh: SharedMesh, client: AsyncClient, on_disconnect: str | None
) -> None:
    node = shutil.which("node")
    assert node, "node is installed by `make install` (system-deps)"
    thread, gate = f"agui-abort-{uuid.uuid4()}", str(uuid.uuid4())
    # The run holds at its gate after a first delta, where the client aborts.
    command = [node, "abort.mjs", f"http://{shared_mesh.edge}/v1/agui", thread, f"gate:{gate}"]
    result = await asyncio.to_thread(
        subprocess.run,
        [*command, *([on_disconnect] if on_disconnect else [])],
        cwd=CLIENT_DIR,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert output["aborted"] and "TEXT_MESSAGE_CONTENT" in output["events"]
    assert "RUN_FINISHED" not in output["events"]
    probe = shared_mesh.mesh.probe_dir
    turn_id = next(
        p.name.removesuffix(".who")
        for p in probe.glob("*.who")
        if p.read_text().split()[-1] == thread
    )
    if on_disconnect is None:
        # The abort reached the agent as a cancellation; nothing was saved.
        await until(lambda: (probe / f"{turn_id}.cancelled").exists(), 120, what="the cancellation")
        turn = await client.get_turn(thread, turn_id)
        assert turn.state == spb.TURN_STATE_CANCELLED
        assert [m.role for m in await client.history(thread)] == []
    else:
        # The run goes on without its client and is saved.
        (probe / f"gate-{gate}").write_text("open")

        async def finished() -> bool:
            return (await client.get_turn(thread, turn_id)).state == spb.TURN_STATE_FINISHED

        await eventually(finished, 120, what="the run to finish")
        assert not (probe / f"{turn_id}.cancelled").exists()
        roles = [m.role for m in await client.history(thread)]
        assert roles == ["user", "assistant"]
    (probe / f"gate-{gate}").write_text("open")
