"""TurnRunner: one turn on a worker — events into the log, one transparent
retry, and history committed only when the turn finishes.

Store, pool, worker stubs and calls are fakes; nothing opens a socket.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2

from tests.unit._server_fakes import spin, spin_until
from turnmesh.runtime.errors import NotFound, Unavailable
from turnmesh.server.sessions.eventlog import TurnLog
from turnmesh.server.sessions.runner import TurnRunner
from turnmesh.server.sessions.turns import CancelReason, PendingTurn
from turnmesh.server.workers.pool import WorkerRef
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb
from turnmesh.v1 import worker_service_pb2 as wpb

ET = event_pb2.EventType
MD = (("x-turnmesh-mesh-key", "k"),)


def rpc_error() -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "worker gone"
    )


class FakeCall:
    """A worker's Run stream: yields scripted events; an exception in the
    script is raised, an asyncio.Event is waited on."""

    def __init__(self, script: list[Any]) -> None:
        self._script = script
        self.cancelled = False
        self.waiting = False
        self._reading: AsyncIterator[wpb.RunResponse] | None = None

    def cancel(self) -> None:
        self.cancelled = True

    async def read(self) -> Any:
        """The next response, or grpc.aio.EOF (as grpc's calls read)."""
        if self._reading is None:
            self._reading = self.__aiter__()
        try:
            return await anext(self._reading)
        except StopAsyncIteration:
            return grpc.aio.EOF

    async def __aiter__(self) -> AsyncIterator[wpb.RunResponse]:
        for item in self._script:
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, asyncio.Event):
                self.waiting = True
                await item.wait()
                continue
            yield wpb.RunResponse(events=[item])  # one event per response


class FakeStub:
    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.requests: list[tuple[wpb.RunRequest, Any]] = []
        self.calls: list[FakeCall] = []

    def Run(self, request: wpb.RunRequest, *, metadata: Any = None) -> FakeCall:
        self.requests.append((request, metadata))
        call = FakeCall(self.script)
        self.calls.append(call)
        return call


class FakePool:
    def __init__(self) -> None:
        self.workers: list[WorkerRef] = []
        self.on_refresh: list[WorkerRef] = []
        self.picks: list[set[str]] = []
        self.refreshes = 0
        self.failed: list[str] = []
        self.inflight: dict[str, int] = {}
        self.call_metadata = MD
        self.bases: dict[tuple[str, str], int] = {}

    def add(self, member_id: str, script: list[Any]) -> FakeStub:
        stub = FakeStub(script)
        self.workers.append(WorkerRef(member_id, f"{member_id}:1", "demo", stub))  # type: ignore[arg-type]
        return stub

    def pick(self, agent_name: str, session_id: str, exclude: set[str]) -> WorkerRef | None:
        self.picks.append(set(exclude))
        for worker in self.workers:
            if worker.agent_name == agent_name and worker.member_id not in exclude:
                return worker
        return None

    async def refresh(self) -> None:
        self.refreshes += 1
        self.workers.extend(self.on_refresh)
        self.on_refresh = []

    def relay(self, worker: WorkerRef) -> None:
        return None  # every turn streams on its Run call here

    def acquire(self, worker: WorkerRef, session_id: str) -> None:
        self.inflight[worker.member_id] = self.inflight.get(worker.member_id, 0) + 1

    def release(self, worker: WorkerRef) -> None:
        self.inflight[worker.member_id] -= 1

    def mark_failed(self, worker: WorkerRef) -> None:
        self.failed.append(worker.member_id)

    def history_base(self, worker: WorkerRef, session_id: str) -> int:
        return self.bases.get((worker.member_id, session_id), 0)

    def remember_history(self, worker: WorkerRef, session_id: str, count: int) -> None:
        self.bases[(worker.member_id, session_id)] = count

    def forget_history(self, worker: WorkerRef, session_id: str) -> None:
        self.bases.pop((worker.member_id, session_id), None)


class FakeStore:
    def __init__(self) -> None:
        self.sessions: dict[str, list[message_pb2.Message]] = {"s1": []}
        self.appends = 0
        self.append_gate: asyncio.Event | None = None
        self.history_error: Exception | None = None
        # The commit writes, then the answer is lost: (written?, abandoned?).
        self.lost_answer: tuple[bool, bool] | None = None
        # Idempotency keys as written, in order, with the messages then kept.
        self.keys: list[tuple[str, str, int]] = []

    async def set_key(self, session_id: str, key: str, value: str) -> None:
        self.keys.append((key, value, len(self.sessions[session_id])))

    async def history(self, session_id: str, start: int = 0) -> list[message_pb2.Message]:
        if self.history_error is not None:
            raise self.history_error
        if session_id not in self.sessions:
            raise NotFound(session_id)
        return self.sessions[session_id][start:]

    async def append_messages(
        self, session_id: str, messages: list[message_pb2.Message], now: float
    ) -> None:
        self.appends += 1
        if self.append_gate is not None:
            await self.append_gate.wait()
        if session_id not in self.sessions:
            raise NotFound(session_id)
        self.sessions[session_id].extend(messages)

    async def commit_turn(
        self,
        session_id: str,
        messages: list[message_pb2.Message],
        final_event: event_pb2.Event,
        now: float,
        fence: str = "",
        pause: bytes = b"",
        checkpoint: bytes = b"",
    ) -> None:
        if self.lost_answer is not None and self.lost_answer[0]:
            await self.append_messages(session_id, messages, now)
        if self.lost_answer is not None:
            raise Unavailable("the session store is unavailable")
        await self.append_messages(session_id, messages, now)

    async def abandon_turn(self, session_id: str, turn_id: str) -> bool:
        assert self.lost_answer is not None
        written, _ = self.lost_answer
        return not written


@pytest.fixture
def store() -> FakeStore:
    return FakeStore()


@pytest.fixture
def pool() -> FakePool:
    return FakePool()


@pytest.fixture
def runner(store: FakeStore, pool: FakePool) -> TurnRunner:
    return TurnRunner(store, pool)  # type: ignore[arg-type]


def pending(
    *messages: str,
    files: list[message_pb2.File] | None = None,
    metadata: dict[str, Any] | None = None,
) -> PendingTurn:
    meta = struct_pb2.Struct()
    if metadata:
        meta.update(metadata)
    return PendingTurn(
        turn_id="t1",
        log=TurnLog("s1", "t1", 1000),
        messages=list(messages or ["hello"]),
        files=files or [],
        metadata=meta,
        collecting=False,
    )


def worker_event(type_: event_pb2.EventType.ValueType, **fields: Any) -> event_pb2.Event:
    # Workers leave seq and ids unset; whatever they send, the log numbers them.
    return event_pb2.Event(type=type_, seq=99, thread_id="w", run_id="w", **fields)


def answer(text: str = "hi", **finished: Any) -> list[Any]:
    # The worker's stream: the agent's events, then how it ended (the server
    # logs RUN_STARTED itself, before it picks a worker).
    return [
        worker_event(ET.TEXT_MESSAGE_START, message_id="m1", role="assistant"),
        worker_event(ET.TEXT_MESSAGE_CONTENT, message_id="m1", delta=text),
        worker_event(ET.TEXT_MESSAGE_END, message_id="m1"),
        worker_event(ET.RUN_FINISHED, **finished),
    ]


def types(log: TurnLog) -> list[int]:
    return [e.type for e in log._events]


def last(log: TurnLog) -> event_pb2.Event:
    return log._events[-1]


# --- the happy path ----------------------------------------------------------------


async def test_a_finished_turn_logs_its_events_and_commits_history(
    runner: TurnRunner, pool: FakePool, store: FakeStore
) -> None:
    result = struct_pb2.Struct()
    result.update({"model": "m"})
    usage = event_pb2.TokenUsage(input_tokens=1, output_tokens=2, total_tokens=3)
    stub = pool.add("w1", answer("hi", usage=[usage], result=result))
    store.sessions["s1"] = [message_pb2.Message(role="user", content="earlier")]
    turn = pending("hello", metadata={"k": "v"})

    await runner.run("s1", "demo", turn)

    log = turn.log
    assert types(log) == [
        ET.RUN_STARTED,
        ET.TEXT_MESSAGE_START,
        ET.TEXT_MESSAGE_CONTENT,
        ET.TEXT_MESSAGE_END,
        ET.RUN_FINISHED,
    ]
    assert [e.seq for e in log._events] == [1, 2, 3, 4, 5]
    assert {(e.thread_id, e.run_id) for e in log._events} == {("s1", "t1")}
    assert log._events[2].delta == "hi"
    done = last(log)
    assert list(done.usage) == [usage]
    assert done.result == result
    assert done.execution_time_ms >= 0
    assert log.state == spb.TURN_STATE_FINISHED
    assert log.done

    request, metadata = stub.requests[0]
    assert metadata == MD
    assert (request.session_id, request.turn_id, list(request.messages)) == ("s1", "t1", ["hello"])
    assert [m.content for m in request.history] == ["earlier"]
    assert request.metadata["k"] == "v"

    history = store.sessions["s1"]
    assert [(m.role, m.content) for m in history] == [
        ("user", "earlier"),
        ("user", "hello"),
        ("assistant", "hi"),
    ]
    user, reply = history[1], history[2]
    assert user.turn_id == reply.turn_id == "t1"
    assert user.created_at == reply.created_at
    assert user.created_at.seconds > 0
    assert user.metadata["k"] == "v"
    assert reply.metadata == result
    assert runner.inflight == 0
    assert pool.inflight == {"w1": 0}


async def test_a_coalesced_turn_says_how_many_messages_and_commits_each(
    runner: TurnRunner, pool: FakePool, store: FakeStore
) -> None:
    pool.add("w1", answer())
    files = [message_pb2.File(content=b"12345", mime_type="text/plain", filename="a.txt")]
    turn = pending("a", "b", files=files, metadata={"k": 1})
    await runner.run("s1", "demo", turn)
    assert turn.log._events[0].collected_messages == 2
    users = [m for m in store.sessions["s1"] if m.role == "user"]
    assert [m.content for m in users] == ["a", "b"]
    assert list(users[0].files) == []
    assert not users[0].HasField("metadata")
    assert [(f.mime_type, f.filename, f.size_bytes) for f in users[1].files] == [
        ("text/plain", "a.txt", 5)
    ]
    assert users[1].metadata["k"] == 1


async def test_a_single_message_turn_has_no_collected_count(
    runner: TurnRunner, pool: FakePool
) -> None:
    pool.add("w1", answer())
    turn = pending("a")
    await runner.run("s1", "demo", turn)
    assert turn.log._events[0].collected_messages == 0


# --- agent errors ------------------------------------------------------------------


async def test_an_agent_error_fails_the_turn_and_leaves_history_alone(
    runner: TurnRunner, pool: FakePool, store: FakeStore
) -> None:
    problem = event_pb2.Problem(type="https://x/p", title="T", status=500, detail="d")
    pool.add(
        "w1",
        [
            worker_event(ET.TEXT_MESSAGE_CONTENT, delta="partial"),
            worker_event(ET.RUN_ERROR, message="it broke", problem=problem),
        ],
    )
    turn = pending()
    await runner.run("s1", "demo", turn)
    error = last(turn.log)
    assert error.type == ET.RUN_ERROR
    assert (error.code, error.message, error.problem) == ("agent_error", "it broke", problem)
    assert turn.log.state == spb.TURN_STATE_FAILED
    assert store.appends == 0
    assert store.sessions["s1"] == []
    assert pool.failed == []


async def test_an_agent_error_code_is_kept(runner: TurnRunner, pool: FakePool) -> None:
    pool.add("w1", [worker_event(ET.RUN_ERROR, code="rate_limited", message="slow down")])
    turn = pending()
    await runner.run("s1", "demo", turn)
    assert last(turn.log).code == "rate_limited"
    assert not last(turn.log).HasField("problem")


# --- worker failures and the one retry -------------------------------------------------


@pytest.mark.parametrize(
    "broken",
    [
        [rpc_error()],
        # An older worker's RUN_STARTED is not content: the server started the run.
        [worker_event(ET.RUN_STARTED), rpc_error()],
        [],  # the stream ended without RUN_FINISHED or RUN_ERROR
    ],
)
async def test_a_worker_failing_before_any_content_is_retried_on_another(
    runner: TurnRunner, pool: FakePool, store: FakeStore, broken: list[Any]
) -> None:
    pool.add("w1", broken)
    pool.add("w2", answer("from w2"))
    turn = pending()
    await runner.run("s1", "demo", turn)
    assert pool.failed == ["w1"]
    assert pool.picks == [set(), {"w1"}]
    assert types(turn.log).count(ET.RUN_STARTED) == 1
    assert turn.log.state == spb.TURN_STATE_FINISHED
    assert [m.content for m in store.sessions["s1"]] == ["hello", "from w2"]
    assert pool.inflight == {"w1": 0, "w2": 0}


async def test_a_worker_failing_after_content_fails_the_turn_without_retry(
    runner: TurnRunner, pool: FakePool, store: FakeStore
) -> None:
    pool.add("w1", [worker_event(ET.TEXT_MESSAGE_CONTENT, delta="half"), rpc_error()])
    second = pool.add("w2", answer())
    turn = pending()
    await runner.run("s1", "demo", turn)
    error = last(turn.log)
    assert (error.code, error.problem.status) == ("worker_failed", 502)
    assert error.problem.type.endswith("/worker-failed")
    assert turn.log.state == spb.TURN_STATE_FAILED
    assert pool.failed == ["w1"]
    assert second.requests == []
    assert store.appends == 0


async def test_a_content_stream_that_just_ends_fails_the_turn(
    runner: TurnRunner, pool: FakePool
) -> None:
    pool.add("w1", [worker_event(ET.TEXT_MESSAGE_CONTENT, delta="half")])
    turn = pending()
    await runner.run("s1", "demo", turn)
    assert last(turn.log).code == "worker_failed"


async def test_only_one_retry(runner: TurnRunner, pool: FakePool, store: FakeStore) -> None:
    pool.add("w1", [rpc_error()])
    pool.add("w2", [rpc_error()])
    third = pool.add("w3", answer())
    turn = pending()
    await runner.run("s1", "demo", turn)
    error = last(turn.log)
    assert (error.code, error.problem.status) == ("worker_unavailable", 503)
    assert "failed before answering" in error.message
    assert pool.failed == ["w1", "w2"]
    assert third.requests == []
    assert turn.log.state == spb.TURN_STATE_FAILED
    assert store.appends == 0


async def test_no_worker_refreshes_once_then_fails(runner: TurnRunner, pool: FakePool) -> None:
    turn = pending()
    await runner.run("s1", "demo", turn)
    error = last(turn.log)
    assert (error.code, error.problem.status) == ("worker_unavailable", 503)
    assert "no live worker serves agent 'demo'" in error.message
    assert pool.refreshes == 1
    assert runner.inflight == 0


async def test_a_worker_found_by_the_refresh_runs_the_turn(
    runner: TurnRunner, pool: FakePool
) -> None:
    stub = FakeStub(answer())
    pool.on_refresh = [WorkerRef("w9", "w9:1", "demo", stub)]  # type: ignore[arg-type]
    turn = pending()
    await runner.run("s1", "demo", turn)
    assert pool.refreshes == 1
    assert turn.log.state == spb.TURN_STATE_FINISHED


# --- cancellation, deletion, internal errors ------------------------------------------


async def test_cancel_while_streaming_cancels_the_call_and_ends_with_the_reason(
    runner: TurnRunner, pool: FakePool, store: FakeStore
) -> None:
    block = asyncio.Event()
    stub = pool.add("w1", [worker_event(ET.TEXT_MESSAGE_CONTENT, delta="x"), block])
    turn = pending()
    task = asyncio.create_task(runner.run("s1", "demo", turn))
    await spin_until(lambda: bool(stub.calls) and stub.calls[0].waiting)
    turn.cancel_reason = CancelReason.INTERRUPTED
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    error = last(turn.log)
    assert (error.code, error.problem.status) == ("interrupted", 499)
    assert "history is unchanged" in error.message
    assert turn.log.state == spb.TURN_STATE_CANCELLED
    assert stub.calls[0].cancelled
    assert pool.inflight == {"w1": 0}
    assert pool.failed == []
    assert runner.inflight == 0
    assert store.appends == 0


async def test_cancel_without_a_reason_is_cancelled(runner: TurnRunner, pool: FakePool) -> None:
    block = asyncio.Event()
    stub = pool.add("w1", [block])
    turn = pending()
    task = asyncio.create_task(runner.run("s1", "demo", turn))
    await spin_until(lambda: bool(stub.calls) and stub.calls[0].waiting)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert last(turn.log).code == "cancelled"


async def test_a_session_deleted_before_the_turn_read_history(
    runner: TurnRunner, pool: FakePool, store: FakeStore
) -> None:
    pool.add("w1", answer())
    del store.sessions["s1"]
    turn = pending()
    await runner.run("s1", "demo", turn)
    assert last(turn.log).code == "session_deleted"
    assert turn.log.state == spb.TURN_STATE_CANCELLED


async def test_a_session_deleted_while_the_turn_ran(
    runner: TurnRunner, pool: FakePool, store: FakeStore
) -> None:
    block = asyncio.Event()
    stub = pool.add("w1", [*answer()[:-1], block, answer()[-1]])
    turn = pending()
    task = asyncio.create_task(runner.run("s1", "demo", turn))
    await spin_until(lambda: bool(stub.calls) and stub.calls[0].waiting)
    del store.sessions["s1"]
    block.set()
    await task
    assert last(turn.log).code == "session_deleted"
    assert turn.log.state == spb.TURN_STATE_CANCELLED
    assert types(turn.log).count(ET.RUN_FINISHED) == 0


@pytest.mark.parametrize("written", [True, False])
async def test_a_commit_whose_answer_was_lost_is_settled_not_guessed(
    runner: TurnRunner, pool: FakePool, store: FakeStore, written: bool
) -> None:
    """The store wrote (or not) and then failed to answer: the runner asks
    (abandoning is atomic against the commit) instead of failing a turn that
    is in the history, which a retry with its key would then run again."""
    pool.add("w1", answer("kept"))
    store.lost_answer = (written, not written)
    turn = pending()
    await runner.run("s1", "demo", turn)
    if written:
        assert turn.log.state == spb.TURN_STATE_FINISHED
        assert last(turn.log).type == ET.RUN_FINISHED
        assert len(store.sessions["s1"]) == 2
    else:
        assert turn.log.state == spb.TURN_STATE_FAILED
        assert store.sessions["s1"] == []


async def test_an_unexpected_error_fails_the_turn_with_no_detail_leaked(
    runner: TurnRunner, pool: FakePool, store: FakeStore
) -> None:
    pool.add("w1", answer("never sent"))
    store.history_error = RuntimeError("db password is hunter2")
    turn = pending()
    await runner.run("s1", "demo", turn)
    error = last(turn.log)
    assert (error.code, error.problem.status) == ("internal", 500)
    assert "hunter2" not in str(error)
    assert turn.log.state == spb.TURN_STATE_FAILED
    assert runner.inflight == 0


async def test_a_cancel_during_the_history_write_still_finishes_the_turn(
    runner: TurnRunner, pool: FakePool, store: FakeStore
) -> None:
    pool.add("w1", answer("kept"))
    store.append_gate = asyncio.Event()
    turn = pending()
    task = asyncio.create_task(runner.run("s1", "demo", turn))
    await spin_until(lambda: store.appends == 1)
    task.cancel()  # e.g. an INTERRUPT or CancelTurn arriving during the write
    await spin()  # the cancel is delivered while the write is still blocked
    store.append_gate.set()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await spin_until(lambda: len(store.sessions["s1"]) == 2)
    # The turn is in history, so its log must say it finished.
    assert [m.content for m in store.sessions["s1"]] == ["hello", "kept"]
    assert last(turn.log).type == ET.RUN_FINISHED
    assert turn.log.state == spb.TURN_STATE_FINISHED


async def test_a_second_cancel_during_the_history_write_still_finishes_the_turn(
    runner: TurnRunner, pool: FakePool, store: FakeStore
) -> None:
    pool.add("w1", answer("kept"))
    store.append_gate = asyncio.Event()
    turn = pending()
    task = asyncio.create_task(runner.run("s1", "demo", turn))
    await spin_until(lambda: store.appends == 1)
    task.cancel()
    await spin()
    task.cancel()  # a second cancel while the write is still blocked
    await spin()
    store.append_gate.set()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await spin()
    assert [m.content for m in store.sessions["s1"]] == ["hello", "kept"]
    assert last(turn.log).type == ET.RUN_FINISHED
    assert turn.log.state == spb.TURN_STATE_FINISHED


async def test_a_turns_idempotency_keys_count_from_its_end(
    runner: TurnRunner, pool: FakePool, store: FakeStore
) -> None:
    """Written again once the turn committed: a retry within the event-log
    window of its end (not of its start) finds the turn, however long it
    queued or ran."""
    pool.add("w1", answer("hi"))
    turn = pending("hello")
    turn.keys = {"k1": "t1 digest", "k2": "t1 other"}
    await runner.run("s1", "demo", turn)
    assert turn.log.state == spb.TURN_STATE_FINISHED
    assert store.keys == [("k1", "t1 digest", 2), ("k2", "t1 other", 2)]  # after the commit
