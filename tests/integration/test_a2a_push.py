"""A2A push notifications over every binding, against a keyed mesh of two
servers on one Redis store with webhooks on: configs created, read, listed
and deleted with the real a2a-sdk client (secrets never read back); a push
received by a real receiver for a completed task and for one waiting for
input, with the config's token and Authorization, the outbox's signature,
and a body the a2a-sdk's own parser reads as a StreamResponse; a URL off the
allow-list refused before anything runs; another principal's task not
found; the bounds; and the secrets in no log line."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as redis
from a2a.client import AuthInterceptor, Client
from a2a.client.auth import CredentialService
from a2a.types import a2a_pb2
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
from a2a.utils.proto_utils import parse_lenient
from google.protobuf import json_format
from standardwebhooks import Webhook

from tests.support.a2a_clients import BINDINGS, Agents, S, answer, message, open_gate, sent
from tests.support.mesh import Mesh, RedisServer
from tests.support.webhooks import SECRET, Receiver, receiving
from turnmesh.runtime.errors import NotFound, ResourceExhausted
from turnmesh.server.compat.a2a import push_configs
from turnmesh.server.compat.a2a.push_configs import TOKEN_HEADER
from turnmesh.server.stores import open_store
from turnmesh.server.stores.base import SessionRecord, SessionStore
from turnmesh.server.stores.push_configs import PUSH_TASKS_PER_SESSION, MemoryPushConfigs
from turnmesh.server.webhooks.outbox import Delivery

pytestmark = pytest.mark.integration

KEYS = {"acme": "key-of-acme-push", "beta": "key-of-beta-push"}
MESH_KEY = "mesh-key-of-the-push-tests"
TOKEN = "tok-9f2c6a1e-never-logged"
CREDENTIALS = "cred-5b7d03e4-never-logged"
# Pushes are polled for, never waited out.
POLL_SECONDS = 0.05
POLL_LIMIT = 2400


class ThreadReceiver:
    """The tests' webhook receiver (tests.support.webhooks) on a loop of its
    own thread, so it outlives each test's loop and its port is known before
    the servers whose allow-list names it start."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._opened = receiving()
        self.receiver: Receiver = self._run(self._opened.__aenter__())

    def _run(self, coroutine: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(60)

    def close(self) -> None:
        self._run(self._opened.__aexit__(None, None, None))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(60)
        self._loop.close()


@dataclass
class Pushing:
    mesh: Mesh
    edge: str
    hooks: Receiver
    workdir: Path


@pytest.fixture(scope="module")
def pushing(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> Iterator[Pushing]:
    workdir = tmp_path_factory.mktemp("a2a-push")
    keys = workdir / "api-keys"
    keys.write_text("".join(f"{name}\t{key}\n" for name, key in KEYS.items()))
    secret = workdir / "webhook.secret"
    secret.write_text(SECRET + "\n")
    # A database of its own: other tests' servers share this Redis.
    store = redis_server.url.rsplit("/", 1)[0] + "/5"
    receiver = ThreadReceiver()
    mesh = Mesh(workdir / "mesh", common_args=("--mesh-key", MESH_KEY))
    try:
        mesh.start_router()
        workers = [
            mesh.spawn_worker("worker-demo", "demo"),
            mesh.spawn_worker("worker-probe", "probe_agent:ProbeAgent"),
        ]
        flags = [
            "--store",
            store,
            "--api-keys-file",
            str(keys),
            "--webhook-allow",
            receiver.receiver.url,
            "--webhook-secret-file",
            str(secret),
            "--webhook-retry-seconds",
            "0.05",
        ]
        servers = [mesh.spawn_server(f"server-{i}", *flags) for i in (1, 2)]
        mesh.wait_ready(*workers, *servers)
        envoy = mesh.start_envoy(servers)
        yield Pushing(mesh, envoy.listener_address, receiver.receiver, workdir)
    finally:
        mesh.stop()
        receiver.close()


class _Key(CredentialService):
    def __init__(self, principal: str) -> None:
        self._key = KEYS[principal]

    async def get_credentials(self, security_scheme_name: str, context: object) -> str | None:
        return self._key if security_scheme_name == "bearer" else None


@dataclass
class Callers:
    agents: Agents
    acme: Client
    beta: Client
    # acme's, of the probe agent (held on a gate).
    probe: Client


@pytest.fixture(params=BINDINGS)
async def callers(pushing: Pushing, request: pytest.FixtureRequest) -> AsyncIterator[Callers]:
    """acme's and beta's a2a-sdk clients of the demo agent over each binding."""
    agents = Agents(pushing.edge, request.param)
    acme, beta, probe = [
        await agents.client(agent, streaming=False, interceptors=[AuthInterceptor(_Key(who))])
        for who, agent in (("acme", "demo"), ("beta", "demo"), ("acme", "probe"))
    ]
    yield Callers(agents, acme, beta, probe)
    await agents.close()


def _config(
    task_id: str, url: str, config_id: str = "", *, secrets: bool = True
) -> a2a_pb2.TaskPushNotificationConfig:
    config = a2a_pb2.TaskPushNotificationConfig(task_id=task_id, id=config_id, url=url)
    if secrets:
        config.token = TOKEN
        config.authentication.scheme = "Bearer"
        config.authentication.credentials = CREDENTIALS
    return config


async def _pushes(
    hooks: Receiver, task_id: str, state: str, notices: int = 1
) -> list[tuple[dict[str, str], Any]]:
    """The pushes of the task in the state, once ``notices`` distinct ones
    have come: each with its headers (lower case) and its body as the
    a2a-sdk parses a StreamResponse, its Standard Webhooks signature
    verified (the library raises on a bad one)."""
    verifier = Webhook(SECRET)
    for _ in range(POLL_LIMIT):
        found = []
        for headers, body in list(hooks.seen):
            parsed = parse_lenient(body, a2a_pb2.StreamResponse())
            if parsed.task.id == task_id and S.Name(parsed.task.status.state) == state:
                verifier.verify(body, headers)
                found.append(({k.lower(): v for k, v in headers.items()}, parsed))
        if len({h["webhook-id"] for h, _ in found}) >= notices:
            return found
        await asyncio.sleep(POLL_SECONDS)
    raise AssertionError(f"no {state} push for {task_id}")


def _has_secrets(headers: dict[str, str]) -> None:
    assert headers["x-a2a-notification-token"] == TOKEN
    assert headers["authorization"] == f"Bearer {CREDENTIALS}"


async def test_configs_are_kept_read_without_secrets_and_pushed(
    pushing: Pushing, callers: Callers
) -> None:
    """CRUD over the binding; a config set on a completed task gets its
    push at once: the task with its answer, the config's token and
    Authorization, signed by the outbox."""
    acme = callers.acme
    task = await sent(acme, message("hello push"))
    assert task.status.state == S.TASK_STATE_COMPLETED
    url = pushing.hooks.url
    made = await acme.create_task_push_notification_config(_config(task.id, url, "b-second"))
    assert (made.id, made.task_id, made.url) == ("b-second", task.id, url)
    # Write-only secrets: the scheme is shown, never the token or credentials.
    assert made.token == "" and made.authentication.credentials == ""
    assert made.authentication.scheme == "Bearer"
    await acme.create_task_push_notification_config(
        _config(task.id, url + "?second", "a-first", secrets=False)
    )
    listed = await acme.list_task_push_notification_configs(
        a2a_pb2.ListTaskPushNotificationConfigsRequest(task_id=task.id)
    )
    assert [c.id for c in listed.configs] == ["a-first", "b-second"]
    assert TOKEN not in str(listed) and CREDENTIALS not in str(listed)
    got = await acme.get_task_push_notification_config(
        a2a_pb2.GetTaskPushNotificationConfigRequest(task_id=task.id, id="b-second")
    )
    assert got.url == url and got.token == ""

    # One push to each config (the one with secrets carries them).
    pushes = await _pushes(pushing.hooks, task.id, "TASK_STATE_COMPLETED", 2)
    (headers, body), *_ = [(h, b) for h, b in pushes if "x-a2a-notification-token" in h]
    _has_secrets(headers)
    assert body.task.context_id == task.context_id
    assert answer(body.task) == answer(task) and "hello push" in answer(body.task)
    assert headers["webhook-principal"] == "acme"

    await acme.delete_task_push_notification_config(
        a2a_pb2.DeleteTaskPushNotificationConfigRequest(task_id=task.id, id="a-first")
    )
    listed = await acme.list_task_push_notification_configs(
        a2a_pb2.ListTaskPushNotificationConfigsRequest(task_id=task.id)
    )
    assert [c.id for c in listed.configs] == ["b-second"]
    with pytest.raises(TaskNotFoundError):
        await acme.get_task_push_notification_config(
            a2a_pb2.GetTaskPushNotificationConfigRequest(task_id=task.id, id="a-first")
        )


async def test_a_running_task_is_pushed_as_it_ends(pushing: Pushing, callers: Callers) -> None:
    """A config set while the task runs (held on a gate): nothing is pushed
    until it ends (no SUBMITTED or WORKING pushes), then its end is, by the
    server that records it."""
    gate = str(uuid.uuid4())
    request = message("held for a push", gate=gate)
    request.configuration.return_immediately = True
    task = await sent(callers.probe, request)
    await callers.probe.create_task_push_notification_config(_config(task.id, pushing.hooks.url))
    running = await callers.probe.get_task(a2a_pb2.GetTaskRequest(id=task.id))
    assert running.status.state in (S.TASK_STATE_SUBMITTED, S.TASK_STATE_WORKING)
    open_gate(pushing.mesh.probe_dir, gate)
    ((headers, body),) = await _pushes(pushing.hooks, task.id, "TASK_STATE_COMPLETED")
    _has_secrets(headers)
    ended = await callers.probe.get_task(a2a_pb2.GetTaskRequest(id=task.id))
    assert answer(body.task) == answer(ended) != ""
    states = {
        parse_lenient(b, a2a_pb2.StreamResponse()).task.status.state
        for _, b in list(pushing.hooks.seen)
        if task.id.encode() in b
    }
    assert states == {S.TASK_STATE_COMPLETED}


async def test_a_task_waiting_for_input_is_pushed(pushing: Pushing, callers: Callers) -> None:
    """A config in the message itself: the task's INPUT_REQUIRED is pushed
    with what it asks."""
    request = message("please ask me something")
    request.configuration.task_push_notification_config.CopyFrom(_config("", pushing.hooks.url))
    request.configuration.return_immediately = True
    task = await sent(callers.acme, request)
    pushes = await _pushes(pushing.hooks, task.id, "TASK_STATE_INPUT_REQUIRED")
    # At least once, and the same push each time (one id).
    assert len({headers["webhook-id"] for headers, _ in pushes}) == 1
    headers, body = pushes[0]
    _has_secrets(headers)
    (data,) = [p.data for p in body.task.status.message.parts if p.HasField("data")]
    (interrupt,) = data.struct_value.fields["interrupts"].list_value.values
    assert interrupt.struct_value.fields["reason"].string_value == "question"
    (kept,) = (
        await callers.acme.list_task_push_notification_configs(
            a2a_pb2.ListTaskPushNotificationConfigsRequest(task_id=task.id)
        )
    ).configs
    assert kept.id == task.id  # none named: the task's own, as a2a-sdk's stores do


async def test_a_config_given_with_an_answer_is_told_how_the_task_ends(
    pushing: Pushing, callers: Callers
) -> None:
    """The config of a message that answers a task's question is kept for
    the task, and gets its end; one past the task's bound is refused before
    the answer is given (the task still waits)."""
    asked = await sent(callers.acme, message("please ask me something"))
    assert asked.status.state == S.TASK_STATE_INPUT_REQUIRED
    full = await sent(callers.acme, message("please ask me something"))
    for i in range(push_configs.MAX_CONFIGS_PER_TASK):
        made = _config(full.id, pushing.hooks.url, f"c{i}", secrets=False)
        await callers.acme.create_task_push_notification_config(made)
    past = _answering(full, _config("", pushing.hooks.url, "one-more"))
    with pytest.raises(InvalidParamsError):
        await sent(callers.acme, past)
    still = await callers.acme.get_task(a2a_pb2.GetTaskRequest(id=full.id))
    assert still.status.state == S.TASK_STATE_INPUT_REQUIRED

    answered = await sent(callers.acme, _answering(asked, _config("", pushing.hooks.url)))
    assert answered.status.state == S.TASK_STATE_COMPLETED
    ((headers, body),) = await _pushes(pushing.hooks, asked.id, "TASK_STATE_COMPLETED")
    _has_secrets(headers)
    assert 'You answered: "green"' in answer(body.task)
    (kept,) = (
        await callers.acme.list_task_push_notification_configs(
            a2a_pb2.ListTaskPushNotificationConfigsRequest(task_id=asked.id)
        )
    ).configs
    assert kept.id == asked.id


def _answering(
    task: a2a_pb2.Task, config: a2a_pb2.TaskPushNotificationConfig
) -> a2a_pb2.SendMessageRequest:
    """A message answering the task's question, with a push config."""
    request = message("", task.context_id)
    request.message.task_id = task.id
    del request.message.parts[:]
    json_format.ParseDict({"color": "green"}, request.message.parts.add().data)
    request.configuration.task_push_notification_config.CopyFrom(config)
    return request


async def test_refusals_change_nothing(pushing: Pushing, callers: Callers) -> None:
    """A URL off the allow-list, another principal's task, a config past the
    bounds: each a 4xx in A2A's terms, naming no secret, keeping nothing."""
    acme, beta = callers.acme, callers.beta
    task = await sent(acme, message("hello bounds"))
    for url in ("http://127.0.0.1:1/hook", "http://10.0.0.1/hook", "ftp://127.0.0.1/x"):
        with pytest.raises(InvalidParamsError):
            await acme.create_task_push_notification_config(_config(task.id, url))
    # In a message: refused before its task starts (its context is not made).
    context_id = f"push-{uuid.uuid4()}"
    request = message("never run", context_id)
    request.configuration.task_push_notification_config.url = "http://10.0.0.1/hook"
    with pytest.raises(InvalidParamsError):
        await sent(acme, request)
    async with httpx.AsyncClient(base_url=f"http://{pushing.edge}", timeout=30) as http:
        missing = await http.get(
            f"/v1/sessions/{context_id}", headers={"authorization": f"Bearer {KEYS['acme']}"}
        )
        assert missing.status_code == 404, missing.text

    # Another principal: not found, whatever it asks.
    with pytest.raises(TaskNotFoundError):
        await beta.create_task_push_notification_config(_config(task.id, pushing.hooks.url))
    with pytest.raises(TaskNotFoundError):
        await beta.list_task_push_notification_configs(
            a2a_pb2.ListTaskPushNotificationConfigsRequest(task_id=task.id)
        )
    with pytest.raises(TaskNotFoundError):
        await beta.delete_task_push_notification_config(
            a2a_pb2.DeleteTaskPushNotificationConfigRequest(task_id=task.id, id=task.id)
        )

    # Bounds: header-breaking or oversized secrets, never echoed.
    bad = _config(task.id, pushing.hooks.url, "x")
    bad.authentication.credentials = CREDENTIALS + "\r\nX-Evil: 1"
    with pytest.raises(InvalidParamsError) as refused:
        await acme.create_task_push_notification_config(bad)
    assert CREDENTIALS not in str(refused.value)
    long = _config(task.id, pushing.hooks.url, "y")
    long.token = "t" * 513
    with pytest.raises(InvalidParamsError):
        await acme.create_task_push_notification_config(long)
    # Five configs a task; a sixth is refused, replacing one is not.
    for n in range(5):
        await acme.create_task_push_notification_config(
            _config(task.id, pushing.hooks.url, f"c{n}", secrets=False)
        )
    with pytest.raises(InvalidParamsError):
        await acme.create_task_push_notification_config(
            _config(task.id, pushing.hooks.url, "c5", secrets=False)
        )
    await acme.create_task_push_notification_config(
        _config(task.id, pushing.hooks.url, "c0", secrets=False)
    )
    listed = await acme.list_task_push_notification_configs(
        a2a_pb2.ListTaskPushNotificationConfigsRequest(task_id=task.id)
    )
    assert [c.id for c in listed.configs] == [f"c{n}" for n in range(5)]


async def test_the_card_says_so_and_no_log_holds_a_secret(
    pushing: Pushing, callers: Callers
) -> None:
    """The card's capability is true where webhooks are on; after the pushes
    above (and one here), no server's log holds a config's token or
    credentials."""
    async with httpx.AsyncClient(base_url=f"http://{pushing.edge}", timeout=30) as http:
        card = (await http.get("/demo/.well-known/agent-card.json")).json()
    assert card["capabilities"]["pushNotifications"] is True
    task = await sent(callers.acme, message("hello logs"))
    await callers.acme.create_task_push_notification_config(_config(task.id, pushing.hooks.url))
    await _pushes(pushing.hooks, task.id, "TASK_STATE_COMPLETED")
    logs = [p for p in (pushing.workdir / "mesh").rglob("*.log")]
    assert logs
    for path in logs:
        text = path.read_text(errors="replace")
        assert TOKEN not in text and CREDENTIALS not in text, path


# The store contract: every backend keeps configs alike ---------------------

STORE_DB = 6  # a database of its own on the shared Redis, emptied per test


@pytest.fixture(params=["memory", "sqlite", "redis", "redis-cluster", "postgres"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, redis_server: RedisServer
) -> AsyncIterator[SessionStore]:
    if request.param == "redis-cluster":
        url = request.getfixturevalue("redis_cluster").url
    elif request.param == "postgres":
        url = request.getfixturevalue("postgres_server").database(f"push_{uuid.uuid4().hex[:12]}")
    elif request.param == "redis":
        url = redis_server.url.rpartition("/")[0] + f"/{STORE_DB}"
        raw = redis.Redis.from_url(url)
        await raw.flushdb()
        await raw.aclose()
    else:
        url = {"memory": "memory", "sqlite": f"sqlite:{tmp_path / 'sessions.db'}"}[request.param]
    opened = open_store(url, event_ttl_seconds=600)
    await opened.open()
    yield opened
    await opened.close()


async def _session(store: SessionStore) -> str:
    sid = f"acme/s-{uuid.uuid4().hex}"
    await store.create(SessionRecord(sid, "demo", 1000.0, 1000.0))
    return sid


async def test_every_store_keeps_configs_bounded_and_drops_them_with_the_session(
    store: SessionStore,
) -> None:
    configs = store.push_configs()
    sid = await _session(store)
    put = functools.partial(configs.put, limit=2, ttl_seconds=600)
    assert await put(sid, "task-1", "b", b"config-b")
    assert await put(sid, "task-1", "a", b"config-a")
    assert not await put(sid, "task-1", "c", b"config-c")  # at its limit: nothing kept
    assert await put(sid, "task-1", "b", b"config-b2")  # replacing one is not
    assert await configs.of_task(sid, "task-1") == [b"config-a", b"config-b2"]  # id order
    assert await configs.of_task(sid, "task-2") == []
    assert await configs.delete(sid, "task-1", "a")
    assert not await configs.delete(sid, "task-1", "a")
    assert await configs.of_task(sid, "task-1") == [b"config-b2"]
    # A session's most recently configured tasks stay; the oldest go first.
    for n in range(PUSH_TASKS_PER_SESSION):
        assert await put(sid, f"more-{n}", "x", b"x")
    assert await configs.of_task(sid, "task-1") == []
    assert await configs.of_task(sid, f"more-{PUSH_TASKS_PER_SESSION - 1}") == [b"x"]
    # Deleted with the session; a session made again under its id has none.
    await store.delete(sid)
    with pytest.raises(NotFound):
        await put(sid, "task-3", "a", b"a")
    await store.create(SessionRecord(sid, "demo", 2000.0, 2000.0))
    assert await configs.of_task(sid, "more-0") == []
    # Kept ttl_seconds: one of no time at all is gone (polled: Redis expires
    # it on its own clock).
    await configs.put(sid, "task-4", "a", b"a", limit=2, ttl_seconds=0.001)
    for _ in range(POLL_LIMIT):
        if await configs.of_task(sid, "task-4") == []:
            break
        await asyncio.sleep(POLL_SECONDS)
    assert await configs.of_task(sid, "task-4") == []


async def test_every_outbox_keeps_a_notices_own_headers(store: SessionStore) -> None:
    outbox = store.outbox()
    sent = {TOKEN_HEADER: TOKEN, "Authorization": f"Bearer {CREDENTIALS}"}
    notice = f"a2a_{uuid.uuid4().hex}"
    assert await outbox.add(Delivery(notice, "http://127.0.0.1:1/hook", b"{}", headers=sent), 100)
    plain = f"msg_{uuid.uuid4().hex}"
    assert await outbox.add(Delivery(plain, "http://127.0.0.1:1/hook", b"{}"), 100)
    claimed = {d.id: d for d in await outbox.claim(time.time() + 1, 30, 10)}
    assert claimed[notice].headers == sent
    assert claimed[plain].headers == {}
    assert CREDENTIALS not in repr(claimed[notice])


@pytest.fixture(scope="module")
def memory_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pushing]:
    """One keyless server on the default (memory) store, webhooks on."""
    workdir = tmp_path_factory.mktemp("a2a-push-memory")
    secret = workdir / "webhook.secret"
    secret.write_text(SECRET + "\n")
    receiver = ThreadReceiver()
    mesh = Mesh(workdir / "mesh")
    try:
        mesh.start_router()
        worker = mesh.spawn_worker("worker-demo", "demo")
        server = mesh.spawn_server(
            "server",
            "--webhook-allow",
            receiver.receiver.url,
            "--webhook-secret-file",
            str(secret),
        )
        mesh.wait_ready(worker, server)
        envoy = mesh.start_envoy([server])
        yield Pushing(mesh, envoy.listener_address, receiver.receiver, workdir)
    finally:
        mesh.stop()
        receiver.close()


async def test_the_memory_store_serves_and_pushes_configs(memory_mesh: Pushing) -> None:
    """The default store on one server: a config is kept, and a task's end
    pushed from it (the anonymous principal's)."""
    agents = Agents(memory_mesh.edge, BINDINGS[0])
    try:
        client = await agents.client("demo", streaming=False)
        request = message("hello memory")
        request.configuration.task_push_notification_config.url = memory_mesh.hooks.url
        request.configuration.task_push_notification_config.token = TOKEN
        task = await sent(client, request)
        ((headers, body),) = await _pushes(memory_mesh.hooks, task.id, "TASK_STATE_COMPLETED")
        assert headers["x-a2a-notification-token"] == TOKEN
        assert "hello memory" in answer(body.task)
        (kept,) = (
            await client.list_task_push_notification_configs(
                a2a_pb2.ListTaskPushNotificationConfigsRequest(task_id=task.id)
            )
        ).configs
        assert kept.url == memory_mesh.hooks.url and kept.token == ""
    finally:
        await agents.close()


async def test_the_memory_stores_bounds_are_shared_between_principals() -> None:
    """Past the server's bound a write takes room from the principal holding
    the most (a flood recycles its own configs), another's only while that
    one holds more than the writer will; with nothing to take it is refused
    (429) and nothing is dropped."""
    configs = MemoryPushConfigs(lambda _: True, max_tasks=4, max_bytes=1_000)

    async def put(principal: str, task: str, data: bytes = b"x" * 10, config: str = "c") -> bool:
        return await configs.put(f"{principal}/s", task, config, data, limit=5, ttl_seconds=600)

    async def held(principal: str, *tasks: str) -> list[bool]:
        return [bool(await configs.of_task(f"{principal}/s", t)) for t in tasks]

    for n in range(4):  # mallory's flood fills the server
        assert await put("mallory", f"m{n}")
    assert await put("mallory", "m4")  # and recycles her own oldest
    assert await held("mallory", "m0", "m1", "m4") == [False, True, True]
    # alice takes from mallory, the biggest holder, down to parity ...
    assert await put("alice", "a1")
    assert await put("alice", "a2")
    assert await held("mallory", "m1", "m2", "m3", "m4") == [False, False, True, True]
    # ... and no further: past it alice recycles her own, as mallory does.
    assert await put("alice", "a3")
    assert await held("alice", "a1", "a2", "a3") == [False, True, True]
    assert await put("mallory", "m5")
    assert await held("mallory", "m3", "m4", "m5") == [False, True, True]
    # A write that needs more bytes than anyone may give it is refused whole.
    with pytest.raises(ResourceExhausted):
        await put("bob", "b1", b"b" * 990)
    assert await held("bob", "b1") == [False]
    assert await held("alice", "a2", "a3") == [True, True]
    assert await held("mallory", "m4", "m5") == [True, True]
    # Another config of a task already held adds bytes, not a task.
    assert await put("alice", "a3", config="d")
    assert await configs.of_task("alice/s", "a3") == [b"x" * 10, b"x" * 10]
    assert await held("mallory", "m4", "m5") == [True, True]


async def test_past_the_bytes_alone_the_biggest_byte_holder_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Short of bytes (not of tasks), room comes from whoever holds the most
    bytes: one large task, not a tenant's many small ones. A new task past
    its session's cap counts the session's oldest, which goes anyway, as
    room: nobody else loses anything for it."""
    configs = MemoryPushConfigs(lambda _: True, max_tasks=100, max_bytes=1_000)

    async def put(session: str, task: str, size: int) -> bool:
        return await configs.put(session, task, "c", b"x" * size, limit=5, ttl_seconds=600)

    async def held(session: str, *tasks: str) -> list[bool]:
        return [bool(await configs.of_task(session, t)) for t in tasks]

    for n in range(2):
        assert await put("frank/s", f"f{n}", 300)
    for n in range(20):
        assert await put("carol/s", f"c{n}", 10)
    assert await put("eve/s", "e0", 300)  # 1,100 bytes: frank's oldest goes
    assert await held("frank/s", "f0", "f1") == [False, True]
    assert all(await held("carol/s", *(f"c{n}" for n in range(20))))
    # The session's cap: its oldest goes and makes the room.
    monkeypatch.setattr("turnmesh.server.stores.push_configs.PUSH_TASKS_PER_SESSION", 3)
    for n in range(3):
        assert await put("eve/t", f"t{n}", 60)  # 980 bytes
    assert await put("eve/t", "t3", 60)  # t0 goes: 980 again, nothing else taken
    assert await held("eve/t", "t0", "t1", "t2", "t3") == [False, True, True, True]
    assert await held("eve/s", "e0") == [True]
    assert await held("frank/s", "f1") == [True]
    assert all(await held("carol/s", *(f"c{n}" for n in range(20))))


async def test_the_memory_store_bounds_its_configs_bytes() -> None:
    """Past its bytes the memory store drops the least recently written tasks' configs."""
    configs = MemoryPushConfigs(lambda _: True, max_bytes=100)
    for n in range(3):
        assert await configs.put("s", f"task-{n}", "a", b"x" * 40, limit=5, ttl_seconds=600)
    assert await configs.of_task("s", "task-0") == []
    assert await configs.of_task("s", "task-2") == [b"x" * 40]
    assert await configs.delete("s", "task-2", "a")
    assert await configs.put("s", "task-3", "a", b"y" * 60, limit=5, ttl_seconds=600)
    assert await configs.of_task("s", "task-1") == [b"x" * 40]  # 100 bytes: room for both
