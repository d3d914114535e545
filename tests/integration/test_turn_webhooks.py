"""Webhooks end to end: a real receiver on loopback gets a signed notice when
a turn finishes, waits for the client or fails; a failing receiver is retried
with the same id, across a SIGKILL and restart of a SQLite server; a Redis
owner's death is notified by the server that settles its turn; a URL the
allow-list does not admit is refused before anything runs."""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as redis
from prometheus_client.parser import text_string_to_metric_families
from standardwebhooks import Webhook

from tests.support.mesh import Component, Mesh, RedisServer, eventually
from tests.support.webhooks import SECRET, Receiver, receiving
from turnmesh.client import AsyncClient, InvalidArgumentError, NotFoundError
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb

WEATHER = message_pb2.ToolDefinition(name="get_weather", description="the weather in a city")


def _flags(tmp_path: Path, receiver: Receiver) -> list[str]:
    secret = tmp_path / "webhook.secret"
    secret.write_text(SECRET + "\n")
    allow = receiver.url.rsplit("/", 1)[0] + "/"  # http://127.0.0.1:PORT/
    return [
        "--webhook-allow",
        allow,
        "--webhook-secret-file",
        str(secret),
        "--webhook-retry-seconds",
        "0.05",
        "--webhook-timeout-seconds",
        "2",
    ]


def _notices(receiver: Receiver) -> list[tuple[str, dict[str, Any]]]:
    """Each request's webhook-id and body, its signature checked with the
    Standard Webhooks library (it raises on a bad one)."""
    verifier = Webhook(SECRET)
    out = []
    for headers, body in receiver.seen:
        verifier.verify(body, headers)
        out.append((headers["webhook-id"], json.loads(body)))
    return out


def _server(mesh: Mesh, name: str, store: str, flags: list[str]) -> Component:
    return mesh.spawn_server(name, "--store", store, *flags)


async def test_notices_are_signed_retried_and_survive_a_restart(
    mesh_factory: Mesh, tmp_path: Path
) -> None:
    mesh = mesh_factory
    store = f"sqlite:{tmp_path / 'sessions.db'}"
    async with receiving() as hooks:
        flags = _flags(tmp_path, hooks)
        mesh.start_router()
        worker = mesh.spawn_worker("demo", "demo")
        first = _server(mesh, "server-a", store, flags)
        mesh.wait_ready(worker, first)
        async with AsyncClient(first.address) as client:
            sid = (await client.create_session()).session_id
            # Not under the allow-list: refused, nothing runs.
            for url in ("http://127.0.0.2/hook", "ftp://127.0.0.1/x", "http://127.0.0.1:1/hook"):
                with pytest.raises(InvalidArgumentError) as refused:
                    await client.send(sid, "hi", webhook_url=url)
                assert "webhook_url" in refused.value.violations
            assert await client.history(sid) == []

            # Finished (a background turn), after two failed attempts.
            hooks.script = [500, 503]
            started = await client.start_turn(sid, "hello", webhook_url=hooks.url + "?n=1")
            await hooks.requests(3)
            (done_id, done), *repeats = _notices(hooks)
            assert {notice_id for notice_id, _ in repeats} == {done_id}  # one notice, retried
            assert done["type"] == "turn.finished"
            assert (done["data"]["turnId"], done["data"]["state"]) == (
                started.turn_id,
                "TURN_STATE_FINISHED",
            )
            assert done["data"]["webhookUrl"] == hooks.url + "?n=1"

            # Waiting for the client (a streamed turn: it gets a record too).
            paused = await client.send(
                sid, "use get_weather for Oslo", tools=[WEATHER], webhook_url=hooks.url
            )
            assert paused.outcome is not None
            await hooks.requests(4)
            _, waiting = _notices(hooks)[3]
            assert waiting["type"] == "turn.waiting"
            assert waiting["data"]["outcome"]["pendingToolCallIds"] == list(
                paused.outcome.pending_tool_call_ids
            )
            assert (await client.get_turn(sid, paused.turn_id)).webhook_url == hooks.url

            # A receiver that keeps failing, and a server killed meanwhile.
            (call_id,) = paused.outcome.pending_tool_call_ids
            hooks.script = [500] * 1000
            answer = [message_pb2.ToolResult(tool_call_id=call_id, content="cold")]
            answered = await client.send(sid, "", tool_results=answer, webhook_url=hooks.url)
            await hooks.requests(6)  # two failed attempts: it waits in the outbox
        mesh.kill(first, signal.SIGKILL)

        hooks.script = []
        delivered = len(hooks.seen)
        second = _server(mesh, "server-b", store, flags)
        mesh.wait_ready(second)
        await hooks.requests(delivered + 1)
        after_restart = _notices(hooks)
        last_id, last = after_restart[-1]
        assert last["data"]["turnId"] == answered.turn_id and last["type"] == "turn.finished"
        assert {i for i, b in after_restart if b["data"]["turnId"] == answered.turn_id} == {last_id}
        async with AsyncClient(second.address) as client:
            kept = await client.get_turn(sid, answered.turn_id)
            assert (kept.state, kept.webhook_url) == (spb.TURN_STATE_FINISHED, hooks.url)


async def test_a_sessions_webhook_notifies_each_turn_unless_a_turn_names_its_own(
    mesh_factory: Mesh, tmp_path: Path
) -> None:
    mesh = mesh_factory
    async with receiving() as hooks:
        mesh.start_router()
        worker = mesh.spawn_worker("demo", "demo")
        server = mesh.spawn_server("server", *_flags(tmp_path, hooks))  # the memory store
        mesh.wait_ready(worker, server)
        async with AsyncClient(server.address) as client:
            with pytest.raises(InvalidArgumentError) as refused:
                await client.create_session("not-made", webhook_url="http://127.0.0.2/h")
            assert "webhook_url" in refused.value.violations
            with pytest.raises(NotFoundError):
                await client.get_session("not-made")

            session = await client.create_session(webhook_url=hooks.url + "?session")
            sid = session.session_id
            assert session.webhook_url == hooks.url + "?session"
            first = await client.send(sid, "one")
            await hooks.requests(1)
            own = await client.send(sid, "two", webhook_url=hooks.url + "?turn")
            await hooks.requests(2)
            fork = await client.fork_session(sid, first.turn_id)
            assert fork.webhook_url == session.webhook_url
            forked = await client.send(fork.session_id, "three")
            await hooks.requests(3)
        urls = [(body["data"]["turnId"], body["data"]["webhookUrl"]) for _, body in _notices(hooks)]
        assert urls == [
            (first.turn_id, hooks.url + "?session"),
            (own.turn_id, hooks.url + "?turn"),
            (forked.turn_id, hooks.url + "?session"),
        ]
        assert [headers["webhook-id"] for headers, _ in hooks.seen] == [
            f"msg_{t}" for t in (first.turn_id, own.turn_id, forked.turn_id)
        ]


async def test_a_turn_lost_with_its_server_is_notified_after_the_restart(
    mesh_factory: Mesh, tmp_path: Path
) -> None:
    """Nobody asks for the turn: the restarted server finds its record open
    and settles it (failed, owner_lost), and its webhook is sent."""
    mesh = mesh_factory
    store = f"sqlite:{tmp_path / 'sessions.db'}"
    async with receiving() as hooks:
        flags = _flags(tmp_path, hooks)
        mesh.start_router()
        worker = mesh.spawn_worker("probe", "probe_agent:ProbeAgent")
        first = _server(mesh, "server-a", store, flags)
        mesh.wait_ready(worker, first)
        async with AsyncClient(first.address) as client:
            sid = (await client.create_session(agent="probe")).session_id
            gate = uuid.uuid4().hex  # never opened: it runs until its server dies
            started = await client.start_turn(
                sid, "go", metadata={"gate": gate, "deltas": 2}, webhook_url=hooks.url
            )
            async with client.subscribe(sid, started.turn_id) as stream:
                async for event in stream:
                    if event.type == event_pb2.TEXT_MESSAGE_CONTENT:
                        break  # running
        mesh.kill(first, signal.SIGKILL)
        assert hooks.seen == []

        second = _server(mesh, "server-b", store, flags)
        mesh.wait_ready(second)
        await hooks.requests(1)
        ((notice_id, notice),) = _notices(hooks)
        assert notice_id == f"msg_{started.turn_id}"
        assert notice["type"] == "turn.failed"
        assert (notice["data"]["turnId"], notice["data"]["errorCode"]) == (
            started.turn_id,
            "owner_lost",
        )
        async with AsyncClient(second.address) as client:
            lost = await client.get_turn(sid, started.turn_id)
            assert (lost.state, lost.error_code) == (spb.TURN_STATE_FAILED, "owner_lost")
            assert await client.history(sid) == []


async def test_a_notice_the_outbox_could_not_take_is_queued_again(
    mesh_factory: Mesh, tmp_path: Path, redis_server: RedisServer
) -> None:
    """Redis refuses the outbox's keys (an ACL: the sessions' keys work)
    when the turn ends: its notice is not queued, so its record's end is
    not written either, and once the outbox works again the sweep writes
    the end and queues the notice (at least once)."""
    mesh = mesh_factory
    user = f"nohooks-{uuid.uuid4().hex[:8]}"
    raw = redis.Redis.from_url(redis_server.url)  # the default user: every key
    # Every key but tm:{w...}: the outbox's slot is tm:{webhooks}.
    await raw.acl_setuser(
        user,
        enabled=True,
        passwords=["+pw"],
        keys=["tm:[^{]*", "tm:{[^w]*"],
        channels=["*"],
        commands=["+@all"],
    )
    store = f"redis://{user}:pw@127.0.0.1:{redis_server.port}/9"
    try:
        async with receiving() as hooks:
            mesh.start_router()
            worker = mesh.spawn_worker("demo", "demo")
            flags = [*_flags(tmp_path, hooks), "--turn-sweep-seconds", "0.2"]
            server = _server(mesh, "server", store, [*flags, "--metrics-port", "0"])
            mesh.wait_ready(worker, server)
            metrics = f"http://{server.info['metrics_address']}/metrics"
            async with AsyncClient(server.address) as client, httpx.AsyncClient() as http:
                sid = (await client.create_session()).session_id
                started = await client.start_turn(sid, "hello", webhook_url=hooks.url)

                async def refused() -> bool:
                    text = (await http.get(metrics)).text
                    return any(
                        # ("dropped" too: what a failing outbox was once counted as)
                        sample.labels.get("outcome") in ("unqueued", "dropped") and sample.value > 0
                        for family in text_string_to_metric_families(text)
                        for sample in family.samples
                    )

                # The turn ended and its notice could not be queued.
                await eventually(refused, 60, "the outbox to refuse the turn's notice")
                assert hooks.seen == []
                await raw.acl_setuser(user, enabled=True, keys=["tm:{webhooks}*"])
                await asyncio.wait_for(hooks.requests(1), 60)
                ((notice_id, notice),) = _notices(hooks)
                assert notice_id == f"msg_{started.turn_id}"
                assert notice["type"] == "turn.finished"
                turn = await client.get_turn(sid, started.turn_id)
                assert turn.state == spb.TURN_STATE_FINISHED
    finally:
        await raw.acl_deluser(user)
        await raw.aclose()
