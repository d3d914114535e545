"""Background turns: StartTurn answers once the turn is accepted, the turn
runs to its end with nobody connected, SubscribeTurn follows it later and
GetTurn reports it (state, times, usage, outcome, error) from any server of
the mesh, from a durable record that outlives its events; refused exactly as
Turn is; another principal never sees it; an owner that dies leaves it
FAILED owner_lost, never running."""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from httpx_sse import aconnect_sse
from standardwebhooks import Webhook

from tests.conftest import SharedMesh
from tests.support.mesh import Mesh, eventually, session_owned_by
from tests.support.webhooks import SECRET, Receiver, receiving
from turnmesh.client import (
    AsyncClient,
    AwaitingClientError,
    IdempotencyKeyReusedError,
    InvalidArgumentError,
    NotFoundError,
    NotWaitingError,
    SessionBusyError,
)
from turnmesh.server.stores import open_store
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb

WEATHER = message_pb2.ToolDefinition(name="get_weather", description="the weather in a city")
ACCEPTED = (spb.TURN_STATE_QUEUED, spb.TURN_STATE_RUNNING)


def _gate(probe_dir: Path) -> tuple[str, Path]:
    """A probe agent's gate: its turn runs (after its first delta) until the file exists."""
    name = uuid.uuid4().hex
    return name, probe_dir / f"gate-{name}"


async def _follow(client: AsyncClient, sid: str, turn_id: str) -> list[event_pb2.Event]:
    """Every event of the turn, once it ended (SubscribeTurn from the start)."""
    async with client.subscribe(sid, turn_id) as stream:
        return [event async for event in stream]


def _text(events: list[event_pb2.Event]) -> str:
    return "".join(e.delta for e in events if e.type == event_pb2.TEXT_MESSAGE_CONTENT)


# On the shared mesh: two servers, the typed client and REST through Envoy ----


async def test_a_background_turn_answers_at_once_and_runs_on_with_nobody_connected(
    client: AsyncClient, client2: AsyncClient, shared_mesh: SharedMesh
) -> None:
    sid = (await client.create_session(agent="probe")).session_id
    gate, opener = _gate(shared_mesh.mesh.probe_dir)
    started = await client.start_turn(
        sid, "go", metadata={"deltas": 3, "delay_ms": 1, "gate": gate}
    )
    # Answered while the turn cannot have ended (it waits for the gate).
    assert started.state in ACCEPTED
    assert (started.session_id, started.background) == (sid, True)
    assert started.HasField("create_time") and not started.HasField("end_time")

    # Nobody follows it, and it runs: a later subscription (on the other
    # server) sees it from its first event.
    events: list[event_pb2.Event] = []
    async with client2.subscribe(sid, started.turn_id) as stream:
        async for event in stream:
            events.append(event)
            if event.type == event_pb2.TEXT_MESSAGE_CONTENT and not opener.exists():
                running = await client2.get_turn(sid, started.turn_id)
                assert running.state == spb.TURN_STATE_RUNNING
                assert running.HasField("start_time") and not running.HasField("end_time")
                assert running.last_seq >= event.seq
                opener.write_text("open")
    assert events[0].type == event_pb2.RUN_STARTED
    assert events[-1].type == event_pb2.RUN_FINISHED
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert _text(events) == "part0 part1 part2 "

    for reader in (client, client2):
        done = await reader.get_turn(sid, started.turn_id)
        assert done.state == spb.TURN_STATE_FINISHED
        assert (done.turn_id, done.background, done.last_seq) == (
            started.turn_id,
            True,
            events[-1].seq,
        )
        assert done.create_time == started.create_time
        assert done.start_time.ToMilliseconds() == int(events[0].timestamp)
        assert done.end_time.ToMilliseconds() == int(events[-1].timestamp)
        assert (
            done.create_time.ToNanoseconds()
            <= done.start_time.ToNanoseconds()
            <= done.end_time.ToNanoseconds()
        )
        assert not done.error_code and not done.HasField("outcome")
    history = await client.history(sid)
    assert [(m.role, m.content, m.turn_id) for m in history] == [
        ("user", "go", started.turn_id),
        ("assistant", "part0 part1 part2 ", started.turn_id),
    ]


async def test_get_turn_reports_usage_and_times_of_any_turn(client: AsyncClient) -> None:
    sid = (await client.create_session(agent="demo")).session_id
    started = await client.start_turn(sid, "What is 6*7?")
    events = await _follow(client, sid, started.turn_id)
    assert "42" in _text(events)
    done = await client.get_turn(sid, started.turn_id)
    assert done.state == spb.TURN_STATE_FINISHED
    assert list(done.usage) == list(events[-1].usage)
    assert done.usage[0].input_tokens > 0
    # A turn streamed as usual is reported too, while its events are kept.
    streamed = await client.send(sid, "What did I ask first?")
    plain = await client.get_turn(sid, streamed.turn_id)
    assert (plain.state, plain.background) == (spb.TURN_STATE_FINISHED, False)
    assert list(plain.usage) == list(streamed.events[-1].usage)
    assert plain.end_time.ToMilliseconds() == int(streamed.events[-1].timestamp)


async def test_a_background_turn_that_pauses_reports_what_it_waits_for(
    client: AsyncClient, client2: AsyncClient
) -> None:
    sid = (await client.create_session(agent="demo")).session_id
    asked = await client.start_turn(sid, "what does get_weather say for Paris?", tools=[WEATHER])
    events = await _follow(client, sid, asked.turn_id)
    waiting = await client2.get_turn(sid, asked.turn_id)
    assert waiting.state == spb.TURN_STATE_FINISHED
    assert waiting.outcome == events[-1].outcome
    assert waiting.outcome.type == "success"
    (call_id,) = waiting.outcome.pending_tool_call_ids
    assert (await client.get_session(sid)).pause.turn_id == asked.turn_id

    # Refused exactly as Turn is: a plain message while it waits, answers to
    # the wrong call.
    with pytest.raises(AwaitingClientError):
        await client.start_turn(sid, "hello?")
    with pytest.raises(InvalidArgumentError) as wrong:
        await client2.start_turn(
            sid, "", tool_results=[message_pb2.ToolResult(tool_call_id="nope", content="x")]
        )
    assert all(field.startswith("turn.tool_results") for field in wrong.value.violations)

    answer = await client2.start_turn(
        sid, "", tool_results=[message_pb2.ToolResult(tool_call_id=call_id, content="sunny")]
    )
    answered = await _follow(client2, sid, answer.turn_id)
    assert 'Your get_weather returned: "sunny"' in _text(answered)
    done = await client.get_turn(sid, answer.turn_id)
    assert done.state == spb.TURN_STATE_FINISHED and not done.HasField("outcome")
    with pytest.raises(NotWaitingError):
        await client.start_turn(
            sid, "", tool_results=[message_pb2.ToolResult(tool_call_id=call_id, content="x")]
        )


async def test_policies_keys_and_disconnects_apply_as_they_do_to_turn(
    client: AsyncClient, client2: AsyncClient, shared_mesh: SharedMesh
) -> None:
    sid = (await client.create_session(agent="probe")).session_id
    gate, opener = _gate(shared_mesh.mesh.probe_dir)
    metadata = {"deltas": 2, "delay_ms": 1, "gate": gate}
    first = await client.start_turn(sid, "one", metadata=metadata, idempotency_key="k1")
    # The same key is the same turn, on either server; another request with it is refused.
    again = await client2.start_turn(sid, "one", metadata=metadata, idempotency_key="k1")
    assert again.turn_id == first.turn_id and again.state in ACCEPTED
    with pytest.raises(IdempotencyKeyReusedError):
        await client.start_turn(sid, "two", idempotency_key="k1")
    with pytest.raises(SessionBusyError):
        await client.start_turn(sid, "three", policy="reject")
    queued = await client2.start_turn(sid, "four", policy="enqueue", metadata={"deltas": 1})
    assert queued.state == spb.TURN_STATE_QUEUED and not queued.HasField("start_time")

    # A streamed retry of the key that asks to cancel on disconnect follows
    # the turn and leaves: the background turn runs on.
    async with client.stream_turn(
        sid, "one", metadata=metadata, idempotency_key="k1", cancel_on_disconnect=True
    ) as stream:
        async for event in stream:
            assert event.run_id == first.turn_id
            if event.type == event_pb2.TEXT_MESSAGE_CONTENT:
                break
    opener.write_text("open")
    events = await _follow(client2, sid, first.turn_id)
    assert events[-1].type == event_pb2.RUN_FINISHED
    assert _text(events) == "part0 part1 "
    after = await _follow(client, sid, queued.turn_id)
    assert after[-1].type == event_pb2.RUN_FINISHED
    assert (await client.get_turn(sid, queued.turn_id)).state == spb.TURN_STATE_FINISHED


async def test_start_and_get_through_the_server_that_does_not_own_the_session(
    client: AsyncClient, client2: AsyncClient, shared_mesh: SharedMesh
) -> None:
    owner = shared_mesh.servers[0]
    sid = await session_owned_by(client2, shared_mesh.mesh, owner, "echo")
    # client2's server forwards both calls to the owner.
    started = await client2.start_turn(sid, "far away", metadata={"delay_ms": 1})
    assert started.state in ACCEPTED and started.background
    events = await _follow(client2, sid, started.turn_id)
    assert _text(events) == "far away"
    done = await client2.get_turn(sid, started.turn_id)
    assert done == await client.get_turn(sid, started.turn_id)
    assert done.state == spb.TURN_STATE_FINISHED
    assert done.usage[0].output_tokens == 2


async def test_unknown_turns_and_bad_ids_are_refused(client: AsyncClient) -> None:
    sid = (await client.create_session(agent="echo")).session_id
    with pytest.raises(NotFoundError):
        await client.get_turn(sid, "no-such-turn")
    with pytest.raises(NotFoundError):
        await client.get_turn(f"missing-{uuid.uuid4().hex}", "t")
    with pytest.raises(NotFoundError):
        await client.start_turn(f"missing-{uuid.uuid4().hex}", "hi")
    with pytest.raises(InvalidArgumentError) as bad:
        await client.get_turn("bad id!", "x" * 129)
    assert set(bad.value.violations) == {"session_id", "turn_id"}
    with pytest.raises(InvalidArgumentError) as blank:
        await client.start_turn(sid, "   ")
    assert list(blank.value.violations) == ["turn.message"]


async def test_rest_starts_and_reports_a_background_turn(
    rest: httpx.AsyncClient, shared_mesh: SharedMesh
) -> None:
    created = await rest.post("/v1/sessions", json={"agentName": "probe"})
    sid = created.json()["session"]["sessionId"]
    gate, opener = _gate(shared_mesh.mesh.probe_dir)
    response = await rest.post(
        f"/v1/sessions/{sid}/turns:start",
        json={"message": "go", "metadata": {"deltas": 2, "delay_ms": 1, "gate": gate}},
    )
    assert response.status_code == 200, response.text
    turn = response.json()["turn"]
    assert turn["state"] in ("TURN_STATE_QUEUED", "TURN_STATE_RUNNING")
    assert (turn["sessionId"], turn["background"]) == (sid, True)
    path = f"/v1/sessions/{sid}/turns/{turn['turnId']}"

    seen: list[dict[str, object]] = []
    async with aconnect_sse(rest, "GET", f"{path}/events") as source:
        async for sse in source.aiter_sse():
            seen.append(json.loads(sse.data))
            if seen[-1]["type"] == "TEXT_MESSAGE_CONTENT" and not opener.exists():
                running = (await rest.get(path)).json()["turn"]
                assert running["state"] == "TURN_STATE_RUNNING"
                opener.write_text("open")
    assert seen[-1]["type"] == "RUN_FINISHED"
    done = (await rest.get(path)).json()["turn"]
    assert done["state"] == "TURN_STATE_FINISHED"
    assert done["lastSeq"] == seen[-1]["seq"]
    assert {"createTime", "startTime", "endTime"} <= done.keys()
    assert done["errorCode"] == ""  # unary answers print every field


async def test_rest_bad_input_is_a_problem(rest: httpx.AsyncClient) -> None:
    sid = (await rest.post("/v1/sessions", json={"agentName": "echo"})).json()["session"][
        "sessionId"
    ]
    missing = await rest.get(f"/v1/sessions/{sid}/turns/no-such-turn")
    assert missing.status_code == 404, missing.text
    assert missing.headers["content-type"] == "application/problem+json"
    mismatch = await rest.post(
        f"/v1/sessions/{sid}/turns:start", json={"sessionId": "another", "message": "hi"}
    )
    assert mismatch.status_code == 400, mismatch.text
    assert [v["field"] for v in mismatch.json()["violations"]] == ["turn.session_id"]
    # Every problem at once, each named from the request.
    both = await rest.post(
        f"/v1/sessions/{sid}/turns:start",
        json={"sessionId": "another", "message": "", "policy": 42},
    )
    assert both.status_code == 400, both.text
    assert [v["field"] for v in both.json()["violations"]] == [
        "turn.session_id",
        "turn.message",
        "turn.policy",
    ]
    empty = await rest.post(f"/v1/sessions/{sid}/turns:start", json={"message": ""})
    assert empty.status_code == 400
    assert [v["field"] for v in empty.json()["violations"]] == ["turn.message"]
    long_id = await rest.get(f"/v1/sessions/{sid}/turns/{'x' * 129}")
    assert long_id.status_code == 400
    bad_session = await rest.post("/v1/sessions/bad%20id/turns:start", json={"message": "hi"})
    assert bad_session.status_code == 400
    assert [v["field"] for v in bad_session.json()["violations"]] == ["session_id"]
    same = await rest.post(
        f"/v1/sessions/{sid}/turns:start", json={"sessionId": sid, "message": "same id"}
    )
    assert same.status_code == 200, same.text


# Principals, and the record after the events are gone (a mesh with keys) ----

MESH_KEY = "tm-background-mesh-key-0123456789"
KEYS = {"acme": "key-of-acme", "beta": "key-of-beta"}


@dataclass
class Keyed:
    mesh: Mesh
    address: str


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keyed]:
    workdir = tmp_path_factory.mktemp("background")
    keys = workdir / "api-keys"
    keys.write_text("".join(f"{name}\t{key}\n" for name, key in KEYS.items()))
    mesh = Mesh(workdir / "mesh", common_args=("--mesh-key", MESH_KEY))
    try:
        mesh.start_router()
        worker = mesh.spawn_worker("worker-echo", "echo")
        # Events are kept one second after a turn ends; records, a week.
        server = mesh.spawn_server(
            "server", "--api-keys-file", str(keys), "--agent", "echo", "--event-log-ttl", "1"
        )
        mesh.wait_ready(worker, server)
        yield Keyed(mesh, server.address)
    finally:
        mesh.stop()


async def test_another_principal_never_sees_a_background_turn(keyed: Keyed) -> None:
    async with (
        AsyncClient(keyed.address, api_key=KEYS["acme"]) as acme,
        AsyncClient(keyed.address, api_key=KEYS["beta"]) as beta,
    ):
        sid = (await acme.create_session("shared-name")).session_id
        started = await acme.start_turn(sid, "acme only")
        await _follow(acme, sid, started.turn_id)
        assert (await acme.get_turn(sid, started.turn_id)).state == spb.TURN_STATE_FINISHED
        # beta names the same session and turn: exactly a missing one.
        with pytest.raises(NotFoundError):
            await beta.get_turn(sid, started.turn_id)
        with pytest.raises(NotFoundError):
            await beta.start_turn(sid, "beta's try")
        await beta.create_session("shared-name")  # beta's own, a different session
        with pytest.raises(NotFoundError):
            await beta.get_turn(sid, started.turn_id)


async def test_the_record_outlives_the_turns_events(keyed: Keyed) -> None:
    async with AsyncClient(keyed.address, api_key=KEYS["acme"]) as acme:
        sid = (await acme.create_session()).session_id
        started = await acme.start_turn(sid, "kept for days")
        events = await _follow(acme, sid, started.turn_id)
        streamed = await acme.send(sid, "kept while its events are")

        async def events_gone() -> bool:
            try:
                await _follow(acme, sid, started.turn_id)
            except NotFoundError:
                return True
            return False

        await eventually(events_gone, timeout=60, what="the turn's events to expire")
        kept = await acme.get_turn(sid, started.turn_id)
        assert (kept.state, kept.background) == (spb.TURN_STATE_FINISHED, True)
        assert list(kept.usage) == list(events[-1].usage)
        assert kept.end_time.ToMilliseconds() == int(events[-1].timestamp)
        assert kept.last_seq == events[-1].seq

        async def plain_gone() -> bool:
            try:
                await acme.get_turn(sid, streamed.turn_id)
            except NotFoundError:
                return True
            return False

        # A turn that was not started in the background has no record.
        await eventually(plain_gone, timeout=60, what="the streamed turn's events to expire")
        # Deleted with its session.
        await acme.delete_session(sid)
        await acme.create_session(sid)
        with pytest.raises(NotFoundError):
            await acme.get_turn(sid, started.turn_id)


# An owner that dies (Redis) ------------------------------------------------


async def test_a_background_turn_whose_owner_dies_is_failed_owner_lost(
    mesh_factory: Mesh, shared_store: str, tmp_path: Path
) -> None:
    async with receiving() as hooks:
        await _owner_dies(mesh_factory, shared_store, tmp_path, hooks)


async def _owner_dies(mesh: Mesh, shared_store: str, tmp_path: Path, hooks: Receiver) -> None:
    mesh.start_router()
    workers = [mesh.spawn_worker("probe", "probe_agent:ProbeAgent")]
    secret = tmp_path / "webhook.secret"
    secret.write_text(SECRET)
    webhooks = [
        "--webhook-allow",
        hooks.url,
        "--webhook-secret-file",
        str(secret),
        "--turn-sweep-seconds",
        "0.2",
    ]
    # Short leases: a killed owner's sessions move within 2 s, not 6.
    servers = [
        mesh.spawn_server(f"s{i}", "--store", shared_store, "--lease-seconds", "2", *webhooks)
        for i in (1, 2)
    ]
    mesh.wait_ready(*workers, *servers)
    victim, survivor = servers
    store = open_store(shared_store, event_ttl_seconds=600)
    await store.open()
    async with AsyncClient(survivor.address) as client:
        sid = await session_owned_by(client, mesh, victim, "probe")
        # A turn that committed, whose record (as if its owner died between
        # the commit and the record's end) still says it runs.
        committed = await client.send(sid, "one", metadata={"deltas": 1, "delay_ms": 1})
        stale = spb.Turn(
            turn_id=committed.turn_id,
            session_id=sid,
            state=spb.TURN_STATE_RUNNING,
            background=True,
        )
        assert await store.put_turn(
            sid, committed.turn_id, stale.SerializeToString(), ended=False, ttl_seconds=600
        )
        # One background turn running on the owner, one queued behind it.
        gate, _ = _gate(mesh.probe_dir)
        running = await client.start_turn(
            sid, "two", metadata={"gate": gate, "deltas": 2}, webhook_url=hooks.url
        )
        queued = await client.start_turn(sid, "three", policy="enqueue")
        assert queued.state == spb.TURN_STATE_QUEUED
        # Another session's background turn that nobody asks about again.
        unread_sid = await session_owned_by(client, mesh, victim, "probe")
        unread_gate, _ = _gate(mesh.probe_dir)
        unread = await client.start_turn(
            unread_sid, "four", metadata={"gate": unread_gate}, webhook_url=hooks.url
        )
        async with client.subscribe(unread_sid, unread.turn_id) as stream:
            async for event in stream:
                if event.type == event_pb2.TEXT_MESSAGE_CONTENT:
                    break
        async with client.subscribe(sid, running.turn_id) as stream:
            async for event in stream:
                if event.type == event_pb2.TEXT_MESSAGE_CONTENT:
                    break
        mesh.kill(victim, signal.SIGKILL)

        lost = await client.get_turn(sid, running.turn_id)
        assert (lost.state, lost.error_code, lost.background) == (
            spb.TURN_STATE_FAILED,
            "owner_lost",
            True,
        )
        assert lost.HasField("start_time") and lost.HasField("end_time")
        # The survivor sends their notices (from the shared outbox): the
        # unread turn's too, settled by its sweep with nobody asking.
        await hooks.requests(2)
        notices = [Webhook(SECRET).verify(body, headers) for headers, body in hooks.seen]
        assert sorted(
            (n["type"], n["data"]["turnId"], n["data"]["errorCode"]) for n in notices
        ) == sorted(
            ("turn.failed", turn_id, "owner_lost") for turn_id in (running.turn_id, unread.turn_id)
        )
        never_ran = await client.get_turn(sid, queued.turn_id)
        assert (never_ran.state, never_ran.error_code) == (spb.TURN_STATE_FAILED, "owner_lost")
        assert not never_ran.HasField("start_time")
        # The event log (the commit) wins over a record that says it runs.
        finished = await client.get_turn(sid, committed.turn_id)
        assert finished.state == spb.TURN_STATE_FINISHED
        assert finished.end_time.ToMilliseconds() == int(committed.events[-1].timestamp)
        # Settled in the store: no reader sees them running again.
        for turn_id, state in (
            (running.turn_id, spb.TURN_STATE_FAILED),
            (queued.turn_id, spb.TURN_STATE_FAILED),
            (committed.turn_id, spb.TURN_STATE_FINISHED),
        ):
            record = await store.get_turn(sid, turn_id)
            assert record is not None and spb.Turn.FromString(record).state == state
        assert (await client.get_turn(sid, running.turn_id)) == lost
        # The session goes on.
        after = await client.start_turn(sid, "four", metadata={"deltas": 1})
        assert _text(await _follow(client, sid, after.turn_id)) == "part0 "
    await store.close()
