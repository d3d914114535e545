"""Walk one native Turn and one Responses request through a session server,
as a reader would, and count the modules it visits.

The server runs in this process (a router and an echo worker beside it, as
real processes on loopback); a profiler follows the request's own task in
server/ and records three walks: ``request``, the modules of the functions
the request is passed to in any of its forms (the TurnRequest, its
Admission, its Answers, the turn placed, the Responses request and
response: what a reader follows parameter by parameter); ``entered``, the
module of every function entered; ``control``, the module whose code runs
after each call and each return. A "stay" is a run of steps in one module; a
"return" is a stay in a module the walk had already left. Windows:
admission (the RPC's task from its handler's entry until the turn is placed
and followed), the run (the turn's own task, from the worker call to its
commit) and, for Responses, the whole request.

Usage: python scripts/walk_turn.py [--show]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import grpc
from google.api import httpbody_pb2

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "server"
sys.path.insert(0, str(ROOT))

from tests.support.mesh import Mesh  # noqa: E402
from turnmesh.server import ServerConfig, SessionServer  # noqa: E402
from turnmesh.v1 import session_service_pb2 as spb  # noqa: E402
from turnmesh.v1.compat_service_pb2_grpc import CompatServiceStub  # noqa: E402
from turnmesh.v1.session_service_pb2_grpc import SessionServiceStub  # noqa: E402


class Walk:
    """The server modules a task runs in, step by step."""

    def __init__(self, entry: str, task_entry: str, stop: tuple[str, str] | None = None) -> None:
        self.entry = entry  # the function whose task is followed
        self.task_entry = task_entry
        self.stop = stop  # the function whose call ends the window
        self.task: asyncio.Task[Any] | None = None
        self.steps: list[str] = []  # after each call and return
        self.entered: list[str] = []  # the module of each function entered
        self.path: list[str] = []  # ... of each function the request is passed to
        self.done = False
        # Frames entered (held, so that an id is never reused): a coroutine
        # or generator resumed after it waited is not entered again.
        self._frames: dict[int, FrameType] = {}

    def module(self, frame: FrameType | None) -> str | None:
        if frame is None:
            return None
        return _server_module(frame.f_code.co_filename)

    def event(self, frame: FrameType, kind: str) -> None:
        if self.done or kind not in ("call", "return"):
            return
        try:
            task = asyncio.current_task()
        except RuntimeError:
            return
        if self.task is None:
            if kind == "call" and frame.f_code.co_name == self.entry:
                if str(frame.f_code.co_filename).endswith(self.task_entry):
                    self.task = task
            if self.task is None:
                return
        if task is not self.task:
            return
        if kind == "call" and self.stop is not None and frame.f_code.co_name == self.stop[0]:
            if str(frame.f_code.co_filename).endswith(self.stop[1]):
                self.done = True
        here = frame if kind == "call" else frame.f_back
        module = self.module(here)
        if module is not None and (not self.steps or self.steps[-1] != module):
            self.steps.append(module)
        if kind == "call" and module is not None:
            if id(frame) in self._frames:
                return  # resumed
            self._frames[id(frame)] = frame
            if not self.entered or self.entered[-1] != module:
                self.entered.append(module)
            if _carries_request(frame) and (not self.path or self.path[-1] != module):
                self.path.append(module)

    def summary(self) -> dict[str, Any]:
        return {
            "control": _count(self.steps),
            "entered": _count(self.entered),
            "request": _count(self.path),
        }


# What the turn request is as it travels, whatever it is called: a function
# it is passed to (in any of these forms) is on its path.
CARRIERS = frozenset(
    {"TurnRequest", "StartTurnRequest", "Admission", "Answers", "PendingTurn"}
    | {"HttpBody", "ResponseRequest", "Response", "_Answers", "TurnAnswers"}
)


def _carries_request(frame: FrameType) -> bool:
    """Whether the request, in one of its forms, is passed to this function.
    A carrier's own methods (its constructor, properties, ``__bool__``) are
    reading the request, not a step on its way: they do not count."""
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount
    names = code.co_varnames[:count]
    if names and names[0] in ("self", "cls"):
        owner = frame.f_locals.get(names[0])
        kind = owner if isinstance(owner, type) else type(owner)
        if kind.__name__ in CARRIERS:
            return False
    return any(type(frame.f_locals.get(name)).__name__ in CARRIERS for name in names)


def _count(steps: list[str]) -> dict[str, Any]:
    seen: set[str] = set()
    returns = Counter[str]()
    for module in steps:
        if module in seen:
            returns[module] += 1
        seen.add(module)
    return {
        "stays": len(steps),
        "modules": len(seen),
        "returns": sum(returns.values()),
        "returns_by_module": dict(returns.most_common()),
    }


@functools.cache
def _server_module(filename: str) -> str | None:
    """A file's path in server/ (links resolved), or None outside it."""
    path = Path(filename).resolve()
    return str(path.relative_to(SERVER)) if path.is_relative_to(SERVER) else None


def profiled(walks: list[Walk]):  # type: ignore[no-untyped-def]
    def profile(frame: FrameType, kind: str, arg: object) -> None:
        for walk in walks:
            walk.event(frame, kind)

    return profile


async def walk(show: bool) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="walk-"))
    mesh = Mesh(workdir)
    try:
        router = mesh.start_router()
        worker = mesh.spawn_worker("worker", "echo")
        mesh.wait_ready(worker)
        server = SessionServer(ServerConfig(router_address=router.address, log_level="WARNING"))
        await server.start()
        address = server._process.address  # type: ignore[union-attr]
        channel = grpc.aio.insecure_channel(address)
        stub = SessionServiceStub(channel)
        compat = CompatServiceStub(channel)
        for _ in range(200):
            if server.workers.has_agent("echo"):
                break
            await asyncio.sleep(0.05)
        created = await stub.CreateSession(spb.CreateSessionRequest(agent_name="echo"))
        sid = created.session.session_id
        warm = [e async for e in stub.Turn(spb.TurnRequest(session_id=sid, message="warm"))]
        assert warm
        results: dict[str, Any] = {}
        # The native turn: its admission, then its run.
        follow = ("follow", "eventlog.py")
        for name, entry, file, stop in (
            ("turn: admission", "Turn", "service.py", follow),
            ("turn: run", "run", "runner.py", None),
        ):
            w = Walk(entry, file, stop)
            sys.setprofile(profiled([w]))
            if name.endswith("admission"):
                # The window closes once the turn is placed and followed.
                call = stub.Turn(spb.TurnRequest(session_id=sid, message="hello"))
                w_events = [e async for e in call]
            else:
                w_events = [
                    e async for e in stub.Turn(spb.TurnRequest(session_id=sid, message="again"))
                ]
            sys.setprofile(None)
            assert w_events
            results[name] = (w.summary(), w.path)
        body = json.dumps({"model": "echo", "input": "hello"}).encode()
        request = httpbody_pb2.HttpBody(content_type="application/json", data=body)
        assert [b async for b in compat.CreateResponse(request)]
        for name, stop in (("responses: admission", follow), ("responses: whole", None)):
            w = Walk("CreateResponse", "compat/service.py", stop)
            sys.setprofile(profiled([w]))
            assert [b async for b in compat.CreateResponse(request)]
            sys.setprofile(None)
            results[name] = (w.summary(), w.path)
        await channel.close()
        await server.stop()
    finally:
        sys.setprofile(None)
        mesh.stop()
    out = {}
    for name, (summary, steps) in results.items():
        out[name] = summary
        if show:
            print(f"== {name}: {json.dumps(summary)}")
            print("   " + " -> ".join(steps))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--show", action="store_true", help="print every step")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(walk(args.show)), indent=2))


if __name__ == "__main__":
    main()
