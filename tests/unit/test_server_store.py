"""MemoryStore: the SessionStore contract on the in-memory backend."""

from __future__ import annotations

import pytest

from turnmesh.runtime.errors import AlreadyExists, NotFound
from turnmesh.server.stores.base import SessionRecord
from turnmesh.server.stores.memory import MemoryStore
from turnmesh.v1 import message_pb2


def record(session_id: str = "s1", last_activity: float = 100.0, **kw: object) -> SessionRecord:
    return SessionRecord(
        session_id=session_id,
        agent_name="echo",
        created_at=50.0,
        last_activity=last_activity,
        **kw,  # type: ignore[arg-type]
    )


def msg(content: str, role: str = "user") -> message_pb2.Message:
    return message_pb2.Message(role=role, content=content, turn_id="t1")


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


async def test_create_then_get(store: MemoryStore) -> None:
    await store.create(record(metadata={"k": "v"}))
    got = await store.get("s1")
    assert got is not None
    assert (got.session_id, got.agent_name, got.created_at, got.last_activity) == (
        "s1",
        "echo",
        50.0,
        100.0,
    )
    assert got.metadata == {"k": "v"}
    assert got.message_count == 0
    assert await store.history("s1") == []


async def test_get_of_a_missing_session_is_none(store: MemoryStore) -> None:
    assert await store.get("nope") is None


async def test_create_of_a_taken_id_raises_already_exists_and_keeps_the_first(
    store: MemoryStore,
) -> None:
    await store.create(record(last_activity=1.0))
    await store.append_messages("s1", [msg("a")], 2.0)
    with pytest.raises(AlreadyExists):
        await store.create(record(last_activity=99.0))
    got = await store.get("s1")
    assert got is not None
    assert got.last_activity == 2.0
    assert got.message_count == 1
    assert [m.content for m in await store.history("s1")] == ["a"]


async def test_get_returns_a_copy(store: MemoryStore) -> None:
    await store.create(record())
    got = await store.get("s1")
    assert got is not None
    got.message_count = 99
    got.last_activity = 0.0
    again = await store.get("s1")
    assert again is not None
    assert again is not got
    assert (again.message_count, again.last_activity) == (0, 100.0)


async def test_get_returns_a_copy_including_its_metadata(store: MemoryStore) -> None:
    await store.create(record(metadata={"k": "v"}))
    got = await store.get("s1")
    assert got is not None
    got.metadata["k"] = "changed"
    again = await store.get("s1")
    assert again is not None
    assert again.metadata == {"k": "v"}


async def test_append_updates_history_count_and_last_activity(store: MemoryStore) -> None:
    await store.create(record())
    await store.append_messages("s1", [msg("q"), msg("a", "assistant")], 200.0)
    await store.append_messages("s1", [msg("q2")], 300.0)
    got = await store.get("s1")
    assert got is not None
    assert got.message_count == 3
    assert got.last_activity == 300.0
    assert [(m.role, m.content) for m in await store.history("s1")] == [
        ("user", "q"),
        ("assistant", "a"),
        ("user", "q2"),
    ]


async def test_append_of_nothing_still_touches(store: MemoryStore) -> None:
    await store.create(record())
    await store.append_messages("s1", [], 150.0)
    got = await store.get("s1")
    assert got is not None
    assert (got.message_count, got.last_activity) == (0, 150.0)


async def test_history_returns_a_new_list(store: MemoryStore) -> None:
    await store.create(record())
    await store.append_messages("s1", [msg("a")], 1.0)
    history = await store.history("s1")
    history.append(msg("not stored"))
    assert len(await store.history("s1")) == 1


async def test_append_to_a_missing_session_raises_not_found(store: MemoryStore) -> None:
    with pytest.raises(NotFound):
        await store.append_messages("nope", [msg("a")], 1.0)


async def test_history_of_a_missing_session_raises_not_found(store: MemoryStore) -> None:
    with pytest.raises(NotFound):
        await store.history("nope")


async def test_touch_updates_last_activity_only(store: MemoryStore) -> None:
    await store.create(record())
    await store.touch("s1", 500.0)
    await store.touch("nope", 500.0)  # a missing session is ignored
    got = await store.get("s1")
    assert got is not None
    assert (got.last_activity, got.message_count) == (500.0, 0)
    assert await store.count() == 1


async def test_delete_is_idempotent(store: MemoryStore) -> None:
    await store.create(record())
    await store.append_messages("s1", [msg("a")], 1.0)
    assert await store.delete("s1") is True
    assert await store.delete("s1") is False
    assert await store.delete("never") is False
    assert await store.get("s1") is None
    with pytest.raises(NotFound):
        await store.history("s1")
    assert await store.count() == 0


async def test_a_deleted_id_can_be_created_again_with_empty_history(store: MemoryStore) -> None:
    await store.create(record())
    await store.append_messages("s1", [msg("a")], 1.0)
    await store.delete("s1")
    await store.create(record())
    assert await store.history("s1") == []


async def test_idle_sessions_are_strictly_before_the_cutoff(store: MemoryStore) -> None:
    await store.create(record("old", last_activity=10.0))
    await store.create(record("edge", last_activity=20.0))
    await store.create(record("new", last_activity=30.0))
    assert sorted(await store.idle_sessions(20.0)) == ["old"]
    assert sorted(await store.idle_sessions(20.001)) == ["edge", "old"]
    assert await store.idle_sessions(0.0) == []


async def test_activity_takes_a_session_out_of_the_idle_list(store: MemoryStore) -> None:
    await store.create(record("a", last_activity=10.0))
    await store.create(record("b", last_activity=10.0))
    await store.append_messages("a", [msg("x")], 100.0)
    await store.touch("b", 100.0)
    assert await store.idle_sessions(50.0) == []


async def test_count(store: MemoryStore) -> None:
    assert await store.count() == 0
    await store.create(record("a"))
    await store.create(record("b"))
    assert await store.count() == 2
    await store.delete("a")
    assert await store.count() == 1
