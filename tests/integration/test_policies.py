"""50 concurrent turns on one session under each policy: history never interleaves."""

from __future__ import annotations

import asyncio

from turnmesh.client import AsyncClient, PolicyName, SessionBusyError
from turnmesh.v1 import event_pb2, message_pb2

N = 50
# What one caller got: all the turn's events, or the error before any event.
Outcome = list[event_pb2.Event] | SessionBusyError


async def _run(
    client: AsyncClient, sid: str, message: str, policy: PolicyName, delay_ms: int
) -> Outcome:
    """All events of one caller, or the client error it got before any event."""
    try:
        async with client.stream_turn(
            sid, message, policy=policy, metadata={"delay_ms": delay_ms}
        ) as stream:
            return [e async for e in stream]
    except SessionBusyError as exc:
        return exc


def _pairs(history: list[message_pb2.Message]) -> list[tuple[str, str]]:
    """History as (user, assistant) pairs; fails if turns interleave."""
    roles = [m.role for m in history]
    assert roles == ["user", "assistant"] * (len(history) // 2), roles
    return [(history[i].content, history[i + 1].content) for i in range(0, len(history), 2)]


async def _fan_out(
    clients: list[AsyncClient], sid: str, policy: PolicyName, delay_ms: int
) -> list[Outcome]:
    return await asyncio.gather(
        *(_run(clients[i % 2], sid, f"m{i:02d} x", policy, delay_ms) for i in range(N))
    )


def _streams(results: list[Outcome]) -> list[list[event_pb2.Event]]:
    """The results, which must all be streams of events (no caller refused)."""
    streams = [r for r in results if isinstance(r, list)]
    assert len(streams) == len(results), results
    return streams


async def test_reject_refuses_all_but_the_running_turn(
    client: AsyncClient, client2: AsyncClient
) -> None:
    sid = (await client.create_session(agent="echo")).session_id
    results = await _fan_out([client, client2], sid, "reject", 300)
    accepted = [r for r in results if isinstance(r, list)]
    rejected = [r for r in results if isinstance(r, SessionBusyError)]
    assert len(accepted) == 1
    assert len(rejected) == N - 1
    assert all(r.reason == "SESSION_BUSY" for r in rejected)
    assert accepted[0][-1].type == event_pb2.RUN_FINISHED
    pairs = _pairs(await client.history(sid))
    assert len(pairs) == 1
    assert pairs[0][0] == pairs[0][1]


async def test_enqueue_runs_every_turn_in_order(client: AsyncClient, client2: AsyncClient) -> None:
    sid = (await client.create_session(agent="echo")).session_id
    results = _streams(await _fan_out([client, client2], sid, "enqueue", 5))
    assert all(r[-1].type == event_pb2.RUN_FINISHED for r in results)
    turn_ids = [r[0].run_id for r in results]
    assert len(set(turn_ids)) == N
    history = await client.history(sid)
    pairs = _pairs(history)
    assert len(pairs) == N
    assert all(user == answer for user, answer in pairs)
    assert sorted(u for u, _ in pairs) == sorted(f"m{i:02d} x" for i in range(N))
    # Arrival order = run order: turn ids are ULIDs minted on arrival.
    history_turns = [history[i].turn_id for i in range(0, len(history), 2)]
    assert history_turns == sorted(history_turns)


async def test_collect_coalesces_and_loses_no_message(
    client: AsyncClient, client2: AsyncClient
) -> None:
    sid = (await client.create_session(agent="echo")).session_id
    results = _streams(await _fan_out([client, client2], sid, "collect", 100))
    assert all(r[-1].type == event_pb2.RUN_FINISHED for r in results)
    turn_ids = {r[0].run_id for r in results}
    assert len(turn_ids) < N
    history = await client.history(sid)
    users = [m.content for m in history if m.role == "user"]
    assert sorted(users) == sorted(f"m{i:02d} x" for i in range(N))
    # Each turn: its user messages, then one assistant answer covering all of them.
    by_turn: dict[str, list[message_pb2.Message]] = {}
    for m in history:
        by_turn.setdefault(m.turn_id, []).append(m)
    assert set(by_turn) == turn_ids
    for messages in by_turn.values():
        assert [m.role for m in messages][-1] == "assistant"
        assert all(m.role == "user" for m in messages[:-1])
        assert messages[-1].content == "\n\n".join(m.content for m in messages[:-1])
    # Every caller of a coalesced turn saw the same events.
    events_by_turn: dict[str, list[list[int]]] = {}
    for r in results:
        events_by_turn.setdefault(r[0].run_id, []).append([e.seq for e in r])
    assert all(all(s == seqs[0] for s in seqs) for seqs in events_by_turn.values())


async def test_interrupt_leaves_only_complete_turns(
    client: AsyncClient, client2: AsyncClient
) -> None:
    sid = (await client.create_session(agent="echo")).session_id
    results = _streams(await _fan_out([client, client2], sid, "interrupt", 100))
    finished = [r for r in results if r[-1].type == event_pb2.RUN_FINISHED]
    interrupted = [r for r in results if r[-1].type == event_pb2.RUN_ERROR]
    assert finished
    assert interrupted
    assert all(r[-1].code == "interrupted" for r in interrupted)
    pairs = _pairs(await client.history(sid))
    assert len(pairs) == len(finished)
    assert all(user == answer for user, answer in pairs)
