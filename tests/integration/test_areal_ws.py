"""AReaL's gateway WebSocket protocol at /ws, through a real Envoy to real
session servers (two, keyed, each with its /ws listener), spoken by a real
``websockets`` client in the seed's frames (SEED-CONTRACTS.md §3)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support.a2a_clients import open_gate
from tests.support.mesh import Mesh, eventually
from turnmesh.envoy.process import RunningEnvoy
from turnmesh.server.compat.areal_ws import gateway
from turnmesh.server.compat.areal_ws.gateway import MAX_QUEUED

MESH_KEY = "ws-mesh-key-0123456789abcdef"
ALICE, BOB = "alice-key-0123456789abcdef", "bob-key-0123456789abcdef"
RUN_ID = re.compile(r"^run-[0-9a-f]{12}$")
# Generous: a loaded 2-core machine, many processes.
TIMEOUT = 60.0


class WsMesh:
    def __init__(self, mesh: Mesh, envoy: RunningEnvoy) -> None:
        self.mesh = mesh
        self.envoy = envoy

    def url(self, key: str | None = ALICE) -> str:
        return f"ws://{self.envoy.listener_address}/ws" + (f"?token={key}" if key else "")

    def rest(self, key: str = ALICE) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=f"http://{self.envoy.listener_address}",
            headers={"authorization": f"Bearer {key}"},
            timeout=TIMEOUT,
        )


@pytest.fixture(scope="module")
def ws_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WsMesh]:
    mesh = Mesh(tmp_path_factory.mktemp("ws-mesh"), heartbeat_interval=1.0)
    try:
        keys = mesh.workdir / "keys"
        keys.write_text(f"alice\t{ALICE}\nbob\t{BOB}\n")
        mesh.router = router = mesh.spawn("router", "router", "--mesh-key", MESH_KEY)
        mesh.wait_ready(router)
        common = ("--router", router.address, "--mesh-key", MESH_KEY)
        workers = [
            mesh.spawn("worker-demo", "worker", *common, "--agent", "demo"),
            mesh.spawn("worker-probe", "worker", *common, "--agent", "probe_agent:ProbeAgent"),
        ]
        servers = [
            mesh.spawn(
                f"server-{i}", "server", *common, "--api-keys-file", str(keys), "--ws-port", "0"
            )
            for i in (1, 2)
        ]
        mesh.wait_ready(*workers, *servers)
        yield WsMesh(mesh, mesh.start_envoy(servers))
    finally:
        mesh.stop()


def req(message: str, session: str | None, request_id: Any = "r1", **params: Any) -> str:
    body: dict[str, Any] = {"message": message, **params}
    if session is not None:
        body["sessionKey"] = session
    return json.dumps({"type": "req", "id": request_id, "method": "agent", "params": body})


async def frame(ws: ClientConnection) -> dict[str, Any]:
    async with asyncio.timeout(TIMEOUT):
        answer: dict[str, Any] = json.loads(await ws.recv())
    return answer


async def until_final(ws: ClientConnection) -> list[dict[str, Any]]:
    """Frames up to the next final ``res`` (complete or failed)."""
    frames = []
    while True:
        f = await frame(ws)
        frames.append(f)
        if f["type"] == "res" and f["payload"]["status"] != "accepted":
            return frames


async def history(ws_mesh: WsMesh, session: str, key: str = ALICE) -> list[dict[str, Any]]:
    async with ws_mesh.rest(key) as rest:
        answer = await rest.get(f"/v1/sessions/{session}/history")
        assert answer.status_code == 200, answer.text
        messages: list[dict[str, Any]] = answer.json().get("messages", [])
        return messages


def user_texts(messages: list[dict[str, Any]]) -> list[str]:
    return [m.get("content", "") for m in messages if m.get("role") == "user"]


@pytest.fixture
async def ws(ws_mesh: WsMesh) -> AsyncIterator[ClientConnection]:
    async with connect(ws_mesh.url()) as socket:
        yield socket


async def probe_session(ws_mesh: WsMesh, session: str) -> None:
    """A session of the probe agent (gated turns), made over REST first: /ws
    then uses it as it is."""
    async with ws_mesh.rest() as rest:
        made = await rest.post("/v1/sessions", json={"sessionId": session, "agentName": "probe"})
        assert made.status_code == 200, made.text


async def test_exchange_through_the_edge(ws: ClientConnection) -> None:
    """accepted at once, the calculator's toolCall with its arguments, the
    deltas, then complete with the answer as summary."""
    await ws.send(req("What is 6*7?", "calc-1"))
    frames = await until_final(ws)
    accepted, *events, done = frames
    assert accepted == {
        "type": "res",
        "id": "r1",
        "ok": True,
        "payload": {"runId": accepted["payload"]["runId"], "status": "accepted"},
    }
    run = accepted["payload"]["runId"]
    assert RUN_ID.match(run)
    assert all(e["type"] == "event" and e["event"] == "agent" for e in events)
    assert all(e["payload"]["runId"] == run for e in events)
    calls = [e["payload"]["toolCall"] for e in events if "toolCall" in e["payload"]]
    assert calls == [{"name": "calculator", "args": calls[0]["args"]}]
    assert json.loads(calls[0]["args"]) == {"expression": "6*7"}
    text = "".join(e["payload"].get("delta", "") for e in events)
    assert "42" in text
    assert done["ok"] is True and done["id"] == "r1"
    assert done["payload"]["status"] == "complete" and done["payload"]["runId"] == run
    assert "42" in done["payload"]["summary"]


async def test_requests_on_one_socket_run_in_order(ws: ClientConnection) -> None:
    await ws.send(req("What is 2+3?", "order-1", "a"))
    await ws.send(req("What is 4+5?", "order-1", "b"))
    first = await until_final(ws)
    second = await until_final(ws)
    assert {f["id"] for f in first if f["type"] == "res"} == {"a"}
    assert {f["id"] for f in second if f["type"] == "res"} == {"b"}
    assert "5" in first[-1]["payload"]["summary"] and "9" in second[-1]["payload"]["summary"]
    assert first[0]["payload"]["runId"] != second[0]["payload"]["runId"]


async def test_a_second_socket_continues_the_session(ws_mesh: WsMesh) -> None:
    """Another socket (maybe to the other server) on the same sessionKey is
    the same conversation."""
    for message in ("What is 1+1?", "What is 2+2?"):
        async with connect(ws_mesh.url()) as socket:
            await socket.send(req(message, "continued-1"))
            assert (await until_final(socket))[-1]["payload"]["status"] == "complete"
    assert user_texts(await history(ws_mesh, "continued-1")) == ["What is 1+1?", "What is 2+2?"]


async def test_an_idempotency_key_retry_runs_once(ws: ClientConnection, ws_mesh: WsMesh) -> None:
    runs = []
    for _ in range(2):
        await ws.send(req("What is 3*3?", "idem-1", idempotencyKey="job-1"))
        frames = await until_final(ws)
        assert frames[-1]["payload"]["status"] == "complete"
        runs.append(frames[0]["payload"]["runId"])
    assert runs[0] == runs[1]
    assert user_texts(await history(ws_mesh, "idem-1")) == ["What is 3*3?"]


# Each bad frame, the id its answer names, and what its reason says.
MALFORMED = [
    ("not json", "unknown", "frame is not JSON"),
    ("[1, 2]", "unknown", "frame is not a JSON object"),
    ('{"id": "x1", "method": "agent"}', "x1", "frame type must be 'req'"),
    ('{"type": "event", "id": 7}', "7", "frame type must be 'req'"),
    ('{"type": "req", "id": "x2", "method": "chat"}', "x2", "unknown method 'chat'"),
    ('{"type": "req", "id": "x3", "method": "agent"}', "x3", "sessionKey is required"),
    (req("hi", None, "x4"), "x4", "sessionKey is required"),
    (req("hi", "no/slashes", "x5"), "x5", "sessionKey must be 1-128 characters"),
    (req("hi", "s" * 129, "x6"), "x6", "sessionKey must be 1-128 characters"),
    (req("", "bad-1", "x7"), "x7", "message: required"),
    (req("   ", "bad-1", "x8"), "x8", "message: must not be blank"),
    (req("a" * 10_001, "bad-1", "x9"), "x9", "message: must be at most 10000 characters"),
    ('{"type":"req","id":"y1","method":"agent","params":[]}', "y1", "params must be an object"),
    (
        '{"type":"req","id":"y2","method":"agent","params":{"sessionKey":"b","message":5}}',
        "y2",
        "message must be a string",
    ),
    (req("hi", "bad-1", "y3").replace('"hi"', '"\\ud800"'), "y3", "message must be a string"),
    (req("hi", None, {"an": "object"}), "unknown", "sessionKey is required"),
    ("[" * 10_000 + "]" * 10_000, "unknown", "nested deeper than 32 levels"),
]


async def test_malformed_frames_get_failed(ws: ClientConnection) -> None:
    """Each bad frame gets res failed with its reason (id "unknown" when it
    has none to answer), in words; the socket stays usable."""
    for sent, request_id, reason in MALFORMED:
        await ws.send(sent)
        answer = await frame(ws)
        assert answer["type"] == "res" and answer["ok"] is False, sent[:80]
        assert answer["id"] == request_id, sent[:80]
        assert answer["payload"]["status"] == "failed"
        assert reason in answer["payload"]["error"], (sent[:80], answer)
        assert "Traceback" not in answer["payload"]["error"]
    await ws.send(req("What is 1+2?", "after-bad"))
    assert (await until_final(ws))[-1]["payload"]["status"] == "complete"


async def test_binary_and_bad_utf8(ws_mesh: WsMesh) -> None:
    """A binary frame is refused in words; text that is not UTF-8 closes the
    socket (1007, the library's); the server serves the next socket."""
    async with connect(ws_mesh.url()) as socket:
        await socket.send(b'{"type": "req"}')
        answer = await frame(socket)
        assert answer["ok"] is False and "binary" in answer["payload"]["error"]
        await socket.send(b"\xff\xfe not utf-8", text=True)
        with pytest.raises(ConnectionClosed) as closed:
            await frame(socket)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
    async with connect(ws_mesh.url()) as socket:
        await socket.send(req("What is 2*2?", "after-utf8"))
        assert (await until_final(socket))[-1]["payload"]["status"] == "complete"


async def test_a_wrong_or_missing_token_closes_4001(ws_mesh: WsMesh) -> None:
    """As the seed: the socket opens, then closes with 4001; a right key works
    (every other test)."""
    for query in ("", "?token=", "?token=wrong-key", f"?token={ALICE}x"):
        async with connect(ws_mesh.url(None) + query) as socket:
            with pytest.raises(ConnectionClosed) as closed:
                await frame(socket)
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4001, "Invalid admin key")


async def test_the_token_never_reaches_the_access_log(ws_mesh: WsMesh) -> None:
    async with connect(ws_mesh.url()) as socket:
        await socket.send(req("What is 5+5?", "logged-1"))
        await until_final(socket)
    log = ws_mesh.mesh.workdir / "envoy.log"
    await eventually(lambda: _async_true('"GET /ws ' in log.read_text()), TIMEOUT, "the log line")
    assert ALICE not in log.read_text()


async def _async_true(value: bool) -> bool:
    return value


async def test_one_principal_cannot_reach_anothers_session(ws_mesh: WsMesh) -> None:
    """The same sessionKey is another session for another key."""
    for key, message in ((ALICE, "What is 7+1?"), (BOB, "What is 7+2?")):
        async with connect(ws_mesh.url(key)) as socket:
            await socket.send(req(message, "shared-key"))
            assert (await until_final(socket))[-1]["payload"]["status"] == "complete"
    assert user_texts(await history(ws_mesh, "shared-key", ALICE)) == ["What is 7+1?"]
    assert user_texts(await history(ws_mesh, "shared-key", BOB)) == ["What is 7+2?"]


async def test_a_frame_too_large_closes_1009(ws_mesh: WsMesh) -> None:
    async with connect(ws_mesh.url(), max_size=None) as socket:
        await socket.send(req("x" * (256 * 1024), "big-1"))
        with pytest.raises(ConnectionClosed) as closed:
            await frame(socket)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    async with connect(ws_mesh.url()) as socket:
        await socket.send(req("What is 6+6?", "big-1"))
        assert (await until_final(socket))[-1]["payload"]["status"] == "complete"


async def test_too_many_queued_requests_fail(ws_mesh: WsMesh) -> None:
    """One gated turn runs; MAX_QUEUED wait behind it; one more is refused
    at once; once the gate opens the queued ones run, in order."""
    session = "queue-1"
    await probe_session(ws_mesh, session)
    async with connect(ws_mesh.url()) as socket:
        await socket.send(req("gate:ws-queue", session, "held"))
        assert (await frame(socket))["payload"]["status"] == "accepted"
        for i in range(MAX_QUEUED):
            await socket.send(req(f"queued {i}", session, f"q{i}"))
        await socket.send(req("one too many", session, "over"))
        refused = await frame(socket)
        while refused["type"] == "event":  # the held turn's first delta
            refused = await frame(socket)
        assert refused["id"] == "over" and refused["ok"] is False
        assert refused["payload"]["code"] == "QUEUE_FULL"
        open_gate(ws_mesh.mesh.probe_dir, "ws-queue")
        finals = [(await until_final(socket))[-1] for _ in range(MAX_QUEUED + 1)]
    assert [f["id"] for f in finals] == ["held", *(f"q{i}" for i in range(MAX_QUEUED))]
    assert all(f["payload"]["status"] == "complete" for f in finals)


async def test_a_closed_socket_lets_its_turn_finish(ws_mesh: WsMesh) -> None:
    """As the seed's agent service does: the run goes on to its end and is
    saved; what was queued behind it on the socket never runs."""
    session = "closed-1"
    await probe_session(ws_mesh, session)
    async with connect(ws_mesh.url()) as socket:
        await socket.send(req("gate:ws-closed", session, "held"))
        assert (await frame(socket))["payload"]["status"] == "accepted"
        await socket.send(req("never runs", session, "queued"))
    open_gate(ws_mesh.mesh.probe_dir, "ws-closed")

    async def saved() -> bool:
        messages = await history(ws_mesh, session)
        return any(m.get("role") == "assistant" for m in messages)

    await eventually(saved, TIMEOUT, "the closed socket's turn to be saved")
    assert user_texts(await history(ws_mesh, session)) == ["gate:ws-closed"]


async def test_the_cancel_header_cancels_a_closed_sockets_turn(ws_mesh: WsMesh) -> None:
    """With the other surfaces' X-Turnmesh-On-Disconnect: cancel, a closed
    socket cancels its turn and nothing of it is saved; another value is 400."""
    session = "cancelled-1"
    await probe_session(ws_mesh, session)
    probe = ws_mesh.mesh.probe_dir
    cancelled_before = set(probe.glob("*.cancelled"))
    headers = {"X-Turnmesh-On-Disconnect": "cancel"}
    async with connect(ws_mesh.url(), additional_headers=headers) as socket:
        await socket.send(req("gate:ws-cancelled", session, "held"))
        assert (await frame(socket))["payload"]["status"] == "accepted"
        # "accepted" can come before the agent runs; its first delta means
        # it is in the part that notes a cancellation (and waits at the gate).
        assert (await frame(socket))["payload"].get("delta") == "part0 "
    await eventually(
        lambda: _async_true(bool(set(probe.glob("*.cancelled")) - cancelled_before)),
        TIMEOUT,
        "the agent to be cancelled",
    )
    assert user_texts(await history(ws_mesh, session)) == []
    with pytest.raises(InvalidStatus) as refused:
        await connect(ws_mesh.url(), additional_headers={"X-Turnmesh-On-Disconnect": "later"})
    assert refused.value.response.status_code == 400


async def test_a_pause_completes_with_its_interrupts(ws_mesh: WsMesh) -> None:
    """A turn that waits for an approval ends in res complete carrying
    ``interrupts`` (the extension); the next request on that session fails
    with the reason while the pause waits."""
    session = "paused-1"
    await probe_session(ws_mesh, session)
    async with connect(ws_mesh.url()) as socket:
        await socket.send(req("mixed approval", session, "p1"))
        done = (await until_final(socket))[-1]
        assert done["ok"] is True and done["payload"]["status"] == "complete"
        (asked,) = done["payload"]["interrupts"]
        assert asked["message"] == "deploy?" and asked["id"] and asked["toolCallId"]
        assert done["payload"]["summary"] == "deploy?"
        await socket.send(req("next", session, "p2"))
        refused = (await until_final(socket))[-1]
        assert refused["ok"] is False and refused["payload"]["code"] == "AWAITING_CLIENT"


async def test_followup_queues_behind_a_running_turn(ws_mesh: WsMesh) -> None:
    """queueMode followup is ENQUEUE: a second socket's message on a busy
    session becomes a turn of its own once the first ends."""
    session = "followup-1"
    await probe_session(ws_mesh, session)
    async with connect(ws_mesh.url()) as first, connect(ws_mesh.url()) as second:
        await first.send(req("gate:ws-followup", session, "f1"))
        assert (await frame(first))["payload"]["status"] == "accepted"
        await second.send(req("later", session, "f2", queueMode="followup"))
        open_gate(ws_mesh.mesh.probe_dir, "ws-followup")
        one, two = (await until_final(first))[-1], (await until_final(second))[-1]
    assert one["payload"]["status"] == two["payload"]["status"] == "complete"
    assert one["payload"]["runId"] != two["payload"]["runId"]
    assert user_texts(await history(ws_mesh, session)) == ["gate:ws-followup", "later"]


async def test_ws_without_an_upgrade_is_426(ws_mesh: WsMesh) -> None:
    async with ws_mesh.rest() as rest:
        answer = await rest.get("/ws")
    assert answer.status_code == 426
    assert "WebSocket" in answer.text


async def test_the_edge_health_checks_each_ws_listener(ws_mesh: WsMesh) -> None:
    """Each listener answers its health path (the route to it is Envoy's
    checker's own: through the edge it is no /ws), and Envoy's checks of
    every listener pass."""
    servers = [c for c in ws_mesh.mesh.components if c.name.startswith("server-")]
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        for server in servers:
            answer = await http.get(f"http://{server.info['ws_address']}{gateway.HEALTH_PATH}")
            assert (answer.status_code, answer.text) == (200, "ok\n")
        async with ws_mesh.rest() as rest:
            assert (await rest.get(gateway.HEALTH_PATH)).status_code == 404
    clusters = ws_mesh.envoy.admin("/clusters")
    hosts = [line for line in clusters.splitlines() if line.startswith("session_websockets::")]
    flags = [line for line in hosts if "::health_flags::" in line]
    assert len(flags) == len(servers)
    assert all(line.endswith("::health_flags::healthy") for line in flags), flags
    stats = ws_mesh.envoy.admin("/stats?filter=^cluster.session_websockets.health_check.success$")
    assert int(stats.split(":")[1]) >= len(servers)


def test_ready_file_names_the_ws_listener(ws_mesh: WsMesh) -> None:
    servers = [c for c in ws_mesh.mesh.components if c.name.startswith("server-")]
    assert all(Path(c.ready_file).exists() and c.info.get("ws_address") for c in servers)


def test_the_readme_example_runs(ws_mesh: WsMesh, tmp_path: Path) -> None:
    """README's AReaL example, as written (the edge's address and a key in)."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    match = re.search(r"<!-- example: areal-ws -->\s*```python\n(.*?)```", readme, re.S)
    assert match, "README example 'areal-ws' not found"
    script = tmp_path / "areal_ws_example.py"
    script.write_text(
        match.group(1).replace("127.0.0.1:8080/ws", ws_mesh.url().removeprefix("ws://"))
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert "accepted" in lines[0] and "calculator" in done.stdout
    assert "42" in lines[-1]
