"""A2A tasks as durable records, with the real, pinned a2a-sdk client over
every binding: a task that waits for input is answered by a message on the
task (a question, an approval, a client tool), its turns one chain under one
task id; wrong and second answers refused; a task cancelled while it waits
reads CANCELED from then on, from the other server too; ListTasks pages the
caller's tasks (filters, keyset pages, total) and never another principal's."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import httpx
import pytest
from a2a.client import AuthInterceptor, Client, ClientConfig, ClientFactory
from a2a.client.auth import CredentialService
from a2a.types import a2a_pb2, a2a_pb2_grpc
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError, UnsupportedOperationError
from google.protobuf import json_format

from tests.conftest import SharedMesh
from tests.support.a2a_clients import Agents, S, answer, message, sent
from tests.support.mesh import Mesh

pytestmark = pytest.mark.integration

WEATHER = {"name": "get_weather", "description": "the weather in a city"}


def on_task(task: a2a_pb2.Task, text: str = "", data: Any = None) -> a2a_pb2.SendMessageRequest:
    """A message on the task (its answer)."""
    request = message(text, context_id=task.context_id)
    request.message.task_id = task.id
    if not text:
        del request.message.parts[:]
    if data is not None:
        json_format.ParseDict(data, request.message.parts.add().data)
    return request


def with_data(text: str, data: Any) -> a2a_pb2.SendMessageRequest:
    request = message(text)
    json_format.ParseDict(data, request.message.parts.add().data)
    return request


def texts(task: a2a_pb2.Task) -> list[tuple[int, str]]:
    return [(m.role, "".join(p.text for p in m.parts)) for m in task.history]


async def test_a_question_is_answered_by_a_message_on_its_task(agents: Agents) -> None:
    """The answer's turn joins the task: one id, its history the whole
    chain's, an artifact per turn; a second answer is refused."""
    client = await agents.client("demo", streaming=False)
    asked = await sent(client, message("please ask me something"))
    assert asked.status.state == S.TASK_STATE_INPUT_REQUIRED
    answered = await sent(client, on_task(asked, data={"color": "green"}))
    assert answered.id == asked.id and answered.context_id == asked.context_id
    assert answered.status.state == S.TASK_STATE_COMPLETED
    assert 'You answered: "green"' in answer(answered)
    read = await client.get_task(a2a_pb2.GetTaskRequest(id=asked.id))
    assert read.status.state == S.TASK_STATE_COMPLETED
    assert len(read.artifacts) == 2 and 'You answered: "green"' in answer(read)
    roles = [role for role, _ in texts(read)]
    assert roles[0] == a2a_pb2.ROLE_USER and roles.count(a2a_pb2.ROLE_AGENT) >= 2
    assert texts(read)[0][1] == "please ask me something"
    with pytest.raises(UnsupportedOperationError):
        await sent(client, on_task(asked, data={"color": "red"}))
    assert (await client.get_task(a2a_pb2.GetTaskRequest(id=asked.id))) == read


async def test_an_approval_is_answered_on_its_task_while_streaming(agents: Agents) -> None:
    client = await agents.client("demo")
    (first, *_, last) = [
        e async for e in client.send_message(message("What is 6*7, with approval?"))
    ]
    task_id = first.task.id
    assert last.status_update.status.state == S.TASK_STATE_INPUT_REQUIRED
    asked = await client.get_task(a2a_pb2.GetTaskRequest(id=task_id))
    assert asked.status.state == S.TASK_STATE_INPUT_REQUIRED
    events = [e async for e in client.send_message(on_task(asked, data={"approved": True}))]
    assert events[0].task.id == task_id
    assert {e.status_update.task_id for e in events[1:] if e.HasField("status_update")} == {task_id}
    assert events[-1].status_update.status.state == S.TASK_STATE_COMPLETED
    done = await client.get_task(a2a_pb2.GetTaskRequest(id=task_id))
    assert "Approved: calculator returned 42" in answer(done)


async def test_a_client_tool_is_answered_on_its_task(agents: Agents) -> None:
    """A data part declares the client's tool; its call waits; the message's
    text on the task is the call's result."""
    client = await agents.client("demo", streaming=False)
    asked = await sent(
        client, with_data("what does get_weather say for Paris?", {"tools": [WEATHER]})
    )
    assert asked.status.state == S.TASK_STATE_INPUT_REQUIRED
    (data,) = [p.data for p in asked.status.message.parts if p.HasField("data")]
    (call_id,) = data.struct_value.fields["pendingToolCallIds"].list_value.values
    assert call_id.string_value
    done = await sent(client, on_task(asked, text="sunny, 21 C"))
    assert done.id == asked.id and done.status.state == S.TASK_STATE_COMPLETED
    assert 'Your get_weather returned: "sunny, 21 C"' in answer(done)


async def test_wrong_answers_are_refused_and_change_nothing(agents: Agents) -> None:
    client = await agents.client("demo", streaming=False)
    asked = await sent(client, message("please ask me something"))
    bad = [
        on_task(asked, data={"resume": [{"interruptId": "nope", "payload": {"color": "x"}}]}),
        on_task(asked, data={"resume": "not a list"}),
        on_task(asked, data={"toolResults": [{"toolCallId": "c1", "content": "x"}]}),
    ]
    other_context = on_task(asked, data={"color": "blue"})
    other_context.message.context_id = "another-context"
    for request in [*bad, other_context]:
        with pytest.raises(InvalidParamsError):
            await sent(client, request)
    still = await client.get_task(a2a_pb2.GetTaskRequest(id=asked.id))
    assert still.status.state == S.TASK_STATE_INPUT_REQUIRED and len(still.artifacts) <= 1
    # A task this mesh never made, and one that ended: TaskNotFound, UnsupportedOperation.
    unknown = on_task(asked, data={"color": "blue"})
    unknown.message.task_id = "nope." + asked.id.partition(".")[2]
    with pytest.raises(TaskNotFoundError):
        await sent(client, unknown)
    done = await sent(client, message("hello"))
    with pytest.raises(UnsupportedOperationError):
        await sent(client, on_task(done, text="more"))


async def test_a_task_cancelled_while_it_waits_reads_canceled_from_any_server(
    shared_mesh: SharedMesh,
) -> None:
    """Straight to each server's A2AService: cancelled on one, the task reads
    CANCELED on the other, and still after its context moved on."""
    channels = [grpc.aio.insecure_channel(s.address) for s in shared_mesh.servers]
    try:
        one, two = (a2a_pb2_grpc.A2AServiceStub(c) for c in channels)  # type: ignore[no-untyped-call]
        question = message("please ask me something")
        question.tenant = "demo"
        asked = (await one.SendMessage(question)).task
        assert asked.status.state == S.TASK_STATE_INPUT_REQUIRED
        cancelled = await one.CancelTask(a2a_pb2.CancelTaskRequest(id=asked.id))
        assert cancelled.status.state == S.TASK_STATE_CANCELED
        read = await two.GetTask(a2a_pb2.GetTaskRequest(id=asked.id))
        assert read.status.state == S.TASK_STATE_CANCELED
        # The context goes on (its next turn answers the pause for the client).
        hello = message("hello again", context_id=asked.context_id)
        hello.tenant = "demo"
        later = (await two.SendMessage(hello)).task
        assert later.status.state == S.TASK_STATE_COMPLETED
        for stub in (one, two):
            again = await stub.GetTask(a2a_pb2.GetTaskRequest(id=asked.id))
            assert again.status.state == S.TASK_STATE_CANCELED
        late = on_task(asked, data={"color": "green"})
        late.tenant = "demo"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await two.SendMessage(late)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        listed = await one.ListTasks(
            a2a_pb2.ListTasksRequest(tenant="demo", context_id=asked.context_id)
        )
        states = {t.id: t.status.state for t in listed.tasks}
        assert states == {asked.id: S.TASK_STATE_CANCELED, later.id: S.TASK_STATE_COMPLETED}
    finally:
        for channel in channels:
            await channel.close()


# ListTasks on a keyed mesh: two principals -----------------------------------------

KEYS = {"acme": "key-of-acme-tasks", "beta": "key-of-beta-tasks"}


class _Key(CredentialService):
    def __init__(self, principal: str) -> None:
        self._key = KEYS[principal]

    async def get_credentials(self, security_scheme_name: str, context: object) -> str | None:
        return self._key if security_scheme_name == "bearer" else None


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A keyed mesh (two servers with their own stores, echo): its edge."""
    workdir = tmp_path_factory.mktemp("a2a-tasks")
    keys = workdir / "api-keys"
    keys.write_text("".join(f"{name}\t{key}\n" for name, key in KEYS.items()))
    mesh = Mesh(workdir / "mesh", common_args=("--mesh-key", "tm-a2a-tasks-mesh-key-0123456789"))
    try:
        mesh.start_router()
        worker = mesh.spawn_worker("worker-echo", "echo")
        servers = [
            mesh.spawn_server(f"server-{i}", "--api-keys-file", str(keys), "--agent", "echo")
            for i in (1, 2)
        ]
        mesh.wait_ready(worker, *servers)
        yield mesh.start_envoy(servers).listener_address
    finally:
        mesh.stop()


@pytest.fixture(params=["GRPC", "HTTP+JSON"])
async def principals(
    keyed: str, request: pytest.FixtureRequest
) -> AsyncIterator[dict[str, Client]]:
    async with httpx.AsyncClient(timeout=60) as http:
        made = {}
        for who in KEYS:
            config = ClientConfig(
                streaming=False,
                httpx_client=http,
                grpc_channel_factory=grpc.aio.insecure_channel,
                supported_protocol_bindings=[request.param],
            )
            made[who] = await ClientFactory(config).create_from_url(
                f"http://{keyed}/echo", interceptors=[AuthInterceptor(_Key(who))]
            )
        yield made
        for created in made.values():
            await created.close()


async def test_list_tasks_pages_filters_and_keeps_principals_apart(
    principals: dict[str, Client],
) -> None:
    acme, beta = principals["acme"], principals["beta"]
    context = f"list-{uuid.uuid4()}"
    made = [await sent(acme, message(f"task {n}", context_id=context)) for n in range(5)]
    assert {t.status.state for t in made} == {S.TASK_STATE_COMPLETED}
    newest_first = [t.id for t in reversed(made)]

    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page = await acme.list_tasks(
            a2a_pb2.ListTasksRequest(context_id=context, page_size=2, page_token=token)
        )
        pages += 1
        assert page.total_size == 5 and page.page_size == 2
        assert all(not t.history and not t.artifacts for t in page.tasks)  # by default
        seen += [t.id for t in page.tasks]
        token = page.next_page_token
        if not token:
            break
        assert pages < 10
    assert seen == newest_first and pages == 3

    rich = await acme.list_tasks(
        a2a_pb2.ListTasksRequest(
            context_id=context, page_size=1, history_length=1, include_artifacts=True
        )
    )
    (newest,) = rich.tasks
    assert newest.id == made[-1].id and len(newest.history) == 1
    assert "task 4" in answer(newest)

    done = await acme.list_tasks(
        a2a_pb2.ListTasksRequest(context_id=context, status=S.TASK_STATE_COMPLETED)
    )
    assert [t.id for t in done.tasks] == newest_first and done.total_size == 5
    waiting = await acme.list_tasks(
        a2a_pb2.ListTasksRequest(context_id=context, status=S.TASK_STATE_INPUT_REQUIRED)
    )
    assert not waiting.tasks and waiting.total_size == 0
    after = made[2].status.timestamp
    recent = await acme.list_tasks(
        a2a_pb2.ListTasksRequest(context_id=context, status_timestamp_after=after)
    )
    assert [t.id for t in recent.tasks] == newest_first[:2]

    # Beta sees none of acme's, with or without the context's id.
    theirs = await beta.list_tasks(a2a_pb2.ListTasksRequest(page_size=100))
    assert not {t.id for t in theirs.tasks} & set(newest_first)
    assert (await beta.list_tasks(a2a_pb2.ListTasksRequest(context_id=context))).total_size == 0
    with pytest.raises(TaskNotFoundError):
        await sent(beta, on_task(made[0], text="hi"))
    # Bad pages: InvalidParams.
    for bad in (
        a2a_pb2.ListTasksRequest(page_size=101),
        a2a_pb2.ListTasksRequest(page_token="not-a-token"),
        a2a_pb2.ListTasksRequest(history_length=-1),
    ):
        with pytest.raises(InvalidParamsError):
            await acme.list_tasks(bad)


async def test_clients_cannot_call_the_servers_internal_task_record_methods(
    shared_mesh: SharedMesh,
) -> None:
    """A client writes no task record: through the edge (which strips the
    mesh's own headers) nor straight to a server without claiming to be a
    forwarding mesh member (on a mesh with a mesh key, only a member can)."""
    calls = [
        (shared_mesh.edge, (("x-turnmesh-forwarded", "me"),)),
        (shared_mesh.servers[0].address, ()),
    ]
    for target, metadata in calls:
        async with grpc.aio.insecure_channel(target) as channel:
            put: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
                "/turnmesh.internal.A2ATaskRecords/Put"
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await put(b'["s", "t", "{}", 0]', metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED, target


async def test_a_task_whose_pause_expired_reads_failed_for_good(mesh_factory: Mesh) -> None:
    """Nobody answered in time: the task is FAILED (saying why), takes no
    answer, and stays FAILED after its context moves on."""
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("demo", "demo")
    # A millisecond: the pause has expired by the time the task is read.
    server = mesh.spawn_server("server", "--pause-timeout", "0.001")
    mesh.wait_ready(worker, server)
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = a2a_pb2_grpc.A2AServiceStub(channel)  # type: ignore[no-untyped-call]
        question = message("please ask me something")
        asked = (await stub.SendMessage(question)).task
        read = await stub.GetTask(a2a_pb2.GetTaskRequest(id=asked.id))
        assert read.status.state == S.TASK_STATE_FAILED
        assert "pause ended" in "".join(p.text for p in read.status.message.parts)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.SendMessage(on_task(asked, data={"color": "green"}))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        later = (await stub.SendMessage(message("hello", context_id=asked.context_id))).task
        assert later.status.state == S.TASK_STATE_COMPLETED
        again = await stub.GetTask(a2a_pb2.GetTaskRequest(id=asked.id))
        assert again.status == read.status
