"""The worker's history cache: tails on top of what it holds, misses when not."""

from __future__ import annotations

import pytest

from turnmesh.runtime.errors import HistoryMiss
from turnmesh.v1 import message_pb2
from turnmesh.worker._convert import history_message
from turnmesh.worker.history_cache import HistoryCache, message_bytes


def m(i: int) -> dict[str, str]:
    return {"role": "user", "content": str(i)}


def test_a_tail_extends_the_held_history() -> None:
    cache = HistoryCache()
    assert cache.resolve("s", 0, [m(0), m(1)]) == [m(0), m(1)]
    assert cache.resolve("s", 2, [m(2), m(3)]) == [m(0), m(1), m(2), m(3)]
    assert cache.resolve("s", 4, []) == [m(0), m(1), m(2), m(3)]


@pytest.mark.parametrize("base", [1, 3])
def test_a_wrong_base_is_a_miss(base: int) -> None:
    cache = HistoryCache()
    cache.resolve("s", 0, [m(0), m(1)])
    with pytest.raises(HistoryMiss) as info:
        cache.resolve("s", base, [m(9)])
    assert info.value.reason == "HISTORY_MISS"


def test_unknown_and_evicted_sessions_miss() -> None:
    cache = HistoryCache(max_sessions=2)
    with pytest.raises(HistoryMiss):
        cache.resolve("nobody", 2, [])
    for sid in ("a", "b", "c"):
        cache.resolve(sid, 0, [m(0)])
    with pytest.raises(HistoryMiss):
        cache.resolve("a", 1, [])
    assert cache.resolve("c", 1, [m(1)]) == [m(0), m(1)]


def test_the_agent_cannot_change_the_cache() -> None:
    cache = HistoryCache()
    given = cache.resolve("s", 0, [m(0)])
    given.append(m(99))
    assert cache.resolve("s", 1, []) == [m(0)]


def test_the_cache_holds_no_more_bytes_than_its_bound() -> None:
    """Past its bytes the least recently used history goes (its next turn
    misses and gets the whole history again); a history larger than the
    whole bound is served but never kept."""
    big = "x" * 1000
    cache = HistoryCache(max_bytes=2500)
    cache.resolve("a", 0, [{"role": "user", "content": big}])
    cache.resolve("b", 0, [{"role": "user", "content": big}])
    cache.resolve("a", 1, [])  # a is the most recent now
    cache.resolve("c", 0, [{"role": "user", "content": big}])
    assert cache.bytes <= 2500
    with pytest.raises(HistoryMiss):
        cache.resolve("b", 1, [])
    assert cache.resolve("a", 1, []) == [{"role": "user", "content": big}]
    files = [{"filename": "f", "mime_type": "text/plain", "text": big * 3, "error": ""}]
    huge = [{"role": "user", "content": "", "files": files}]
    assert cache.resolve("d", 0, huge) == huge
    with pytest.raises(HistoryMiss):
        cache.resolve("d", 1, [])
    assert cache.bytes <= 2500


def test_a_final_answer_brings_its_agents_metadata_and_it_counts() -> None:
    answer = message_pb2.Message(role="assistant", content="hi")
    answer.metadata.update({"a2a": {"context_id": "c" * 1000}})
    converted = history_message(answer)
    assert converted["metadata"] == {"a2a": {"context_id": "c" * 1000}}
    assert message_bytes(converted) > 1000 + message_bytes({"role": "assistant", "content": "hi"})
    assert "metadata" not in history_message(message_pb2.Message(role="user", content="hi"))
