"""The SessionStore contract, on every backend: memory, SQLite, real Redis."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.mesh import RedisServer
from turnmesh.runtime.errors import AlreadyExists, NotFound
from turnmesh.server.store import SessionRecord, SessionStore, TurnAbandoned, open_store
from turnmesh.v1 import event_pb2, message_pb2


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, redis_server: RedisServer
) -> AsyncIterator[SessionStore]:
    url = {
        "memory": "memory",
        "sqlite": f"sqlite:{tmp_path / 'sessions.db'}",
        "redis": redis_server.url,
    }[request.param]
    opened = open_store(url, event_ttl_seconds=600)
    yield opened
    await opened.close()


def _record(session_id: str, at: float = 1000.0) -> SessionRecord:
    return SessionRecord(session_id, "demo", at, at, {"k": "v"})


def _message(role: str, content: str) -> message_pb2.Message:
    return message_pb2.Message(role=role, content=content, turn_id="t")


def _sid() -> str:
    return f"s-{uuid.uuid4().hex}"


async def test_create_get_and_duplicate(store: SessionStore) -> None:
    sid = _sid()
    await store.create(_record(sid), [_message("system", "be brief")])
    got = await store.get(sid)
    assert got is not None
    assert (got.agent_name, got.metadata, got.message_count) == ("demo", {"k": "v"}, 1)
    assert [m.content for m in await store.history(sid)] == ["be brief"]
    with pytest.raises(AlreadyExists):
        await store.create(_record(sid))
    assert await store.get(_sid()) is None


async def test_commit_appends_a_turn_and_its_final_event(store: SessionStore) -> None:
    sid = _sid()
    await store.create(_record(sid))
    final = event_pb2.Event(type=event_pb2.RUN_FINISHED, seq=3, thread_id=sid, run_id="t1")
    await store.append_events(
        sid,
        "t1",
        [
            event_pb2.Event(type=event_pb2.RUN_STARTED, seq=1),
            event_pb2.Event(type=event_pb2.TEXT_MESSAGE_CONTENT, seq=2),
        ],
    )
    await store.commit_turn(
        sid, [_message("user", "hi"), _message("assistant", "hello")], final, 2000.0
    )
    assert [m.content for m in await store.history(sid)] == ["hi", "hello"]
    record = await store.get(sid)
    assert record is not None
    assert (record.message_count, record.last_activity) == (2, 2000.0)
    if store.persists_events:
        events = await store.read_events(sid, "t1")
        assert events is not None
        assert [e.seq for e in events] == [1, 2, 3]
        assert events[-1].type == event_pb2.RUN_FINISHED
    # A second turn appends after the first.
    await store.append_messages(sid, [_message("user", "again")], 3000.0)
    assert [m.content for m in await store.history(sid)] == ["hi", "hello", "again"]


async def test_deleted_sessions_are_gone_and_commits_to_them_fail(store: SessionStore) -> None:
    sid = _sid()
    await store.create(_record(sid))
    await store.append_events(sid, "t1", [event_pb2.Event(type=event_pb2.RUN_STARTED, seq=1)])
    await store.set_key(sid, "key", "t1")
    assert await store.delete(sid) is True
    assert await store.delete(sid) is False
    assert await store.get(sid) is None
    with pytest.raises(NotFound):
        await store.history(sid)
    with pytest.raises(NotFound):
        await store.commit_turn(sid, [_message("user", "x")], event_pb2.Event(run_id="t2"), 1.0)
    assert await store.get(sid) is None  # a late commit did not bring it back
    assert await store.read_events(sid, "t1") is None
    assert await store.get_key(sid, "key") is None


async def test_idle_sessions_and_count(store: SessionStore) -> None:
    old, fresh = _sid(), _sid()
    before = await store.count()
    await store.create(_record(old, at=100.0))
    await store.create(_record(fresh, at=100.0))
    await store.touch(fresh, 5000.0)
    idle = await store.idle_sessions(1000.0)
    assert old in idle
    assert fresh not in idle
    assert await store.count() == before + 2


async def test_events_and_keys_persist_where_promised(store: SessionStore) -> None:
    sid = _sid()
    await store.create(_record(sid))
    await store.append_events(sid, "t1", [event_pb2.Event(type=event_pb2.RUN_STARTED, seq=1)])
    await store.set_key(sid, "retry-1", "t1")
    if store.persists_events:
        events = await store.read_events(sid, "t1")
        assert events is not None
        assert [e.seq for e in events] == [1]
        assert await store.get_key(sid, "retry-1") == "t1"
        assert await store.read_events(sid, "unknown") is None
    else:
        assert await store.read_events(sid, "t1") is None


async def test_history_of_two_thousand_messages_round_trips(store: SessionStore) -> None:
    sid = _sid()
    await store.create(_record(sid))
    for turn in range(1000):
        await store.append_messages(
            sid, [_message("user", f"q{turn}"), _message("assistant", f"a{turn}")], float(turn)
        )
    history = await store.history(sid)
    assert len(history) == 2000
    assert history[0].content == "q0"
    assert history[-1].content == "a999"


def test_unknown_store_url_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown store"):
        open_store("postgres://x", 1)


async def test_a_turn_either_commits_or_is_abandoned_never_both(store: SessionStore) -> None:
    """The fence against a cut-off owner committing a turn that another server
    gave up for lost (and whose caller re-ran it there)."""
    sid = _sid()
    await store.create(_record(sid))

    def final(turn_id: str) -> event_pb2.Event:
        return event_pb2.Event(type=event_pb2.RUN_FINISHED, seq=2, thread_id=sid, run_id=turn_id)

    # Committed first: it can no longer be abandoned.
    await store.commit_turn(sid, [_message("user", "one")], final("t1"), 1001.0)
    if store.persists_events:
        assert await store.abandon_turn(sid, "t1") is False
    # Abandoned first: its late commit writes nothing.
    assert await store.abandon_turn(sid, "t2") is True
    assert await store.abandon_turn(sid, "t2") is True  # and stays so
    if store.persists_events:
        with pytest.raises(TurnAbandoned):
            await store.commit_turn(sid, [_message("user", "two")], final("t2"), 1002.0)
        assert [m.content for m in await store.history(sid)] == ["one"]
        assert await store.read_events(sid, "t2") is None
        record = await store.get(sid)
        assert record is not None and record.message_count == 1
