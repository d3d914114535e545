"""Conversations through the edge, for the multi-host test (run inside the
edge host's namespace): each conversation sends numbered turns with
idempotency keys and retries a turn, with its key, until it lands. Progress
(turns landed) goes to a file; when the stop file appears every conversation
finishes its current turn, every history is checked for lost, duplicated and
out-of-order turns, and a JSON report is printed."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from turnmesh.client import AsyncClient, TurnmeshClientError

T = TypeVar("T")


@dataclass
class State:
    stop_file: Path
    progress_file: Path
    deadline: float
    landed: int = 0
    per_conversation: Counter[int] = field(default_factory=Counter)
    stopping: bool = False
    failed_attempts: Counter[str] = field(default_factory=Counter)
    timeline: list[tuple[float, int]] = field(default_factory=list)

    def record(self, conversation: int) -> None:
        self.landed += 1
        self.per_conversation[conversation] += 1
        self.timeline.append((time.time(), self.landed))
        tmp = self.progress_file.with_suffix(".tmp")
        counts = [self.per_conversation[i] for i in range(max(self.per_conversation) + 1)]
        tmp.write_text(json.dumps({"landed": self.landed, "per_conversation": counts}))
        os.replace(tmp, self.progress_file)


def _text(conversation: int, turn: int) -> str:
    return f"turn {turn} of conversation {conversation}"


class Abandoned(Exception):
    """The run's time is up."""


async def _retrying(state: State, what: str, call: Callable[[], Awaitable[T]]) -> T:
    while True:
        if time.monotonic() > state.deadline:
            raise Abandoned(what)
        try:
            return await asyncio.wait_for(call(), 20)
        except (TurnmeshClientError, TimeoutError) as exc:
            state.failed_attempts[f"{what}: {type(exc).__name__}"] += 1
            await asyncio.sleep(0.3)


async def _watch_stop(state: State) -> None:
    # The test's stop file, or the time limit: the run always ends by itself.
    while not state.stop_file.exists() and time.monotonic() < state.deadline - 30:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    state.stopping = True


async def conversation(client: AsyncClient, index: int, state: State) -> tuple[str, int]:
    session = await _retrying(state, "create", client.create_session)
    turn = 0
    while not state.stopping:

        def send(turn: int = turn) -> Awaitable[object]:
            key = f"conv{index}-turn{turn}"
            return client.send(session.session_id, _text(index, turn), idempotency_key=key)

        await _retrying(state, "turn", send)
        turn += 1
        state.record(index)
    return session.session_id, turn


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--stop-file", type=Path, required=True)
    parser.add_argument("--progress-file", type=Path, required=True)
    parser.add_argument("--max-seconds", type=float, default=240)
    args = parser.parse_args()
    state = State(args.stop_file, args.progress_file, time.monotonic() + args.max_seconds)
    watcher = asyncio.create_task(_watch_stop(state))
    async with AsyncClient(args.target, api_key=args.api_key, timeout=20) as client:
        results = await asyncio.gather(
            *(conversation(client, i, state) for i in range(args.conversations))
        )
        lost = duplicated = out_of_order = 0
        for index, (session_id, turns) in enumerate(results):

            def history(session_id: str = session_id) -> Awaitable[list[object]]:
                return client.history(session_id)  # type: ignore[return-value]

            messages = await _retrying(state, "history", history)
            users = [m.content for m in messages if m.role == "user"]  # type: ignore[attr-defined]
            expected = [_text(index, t) for t in range(turns)]
            counts = Counter(users)
            lost += sum(1 for e in expected if e not in counts)
            duplicated += sum(n - 1 for n in counts.values())
            out_of_order += users != expected
    await watcher
    report = {
        "landed": state.landed,
        "lost": lost,
        "duplicated": duplicated,
        "out_of_order": out_of_order,
        "conversations": len(results),
        "failed_attempts": dict(state.failed_attempts),
        "timeline": state.timeline,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main())
