"""A remote A2A agent for the ``kind: a2a`` tests, built only from a2a-sdk's
own server classes (``DefaultRequestHandler``, ``TaskUpdater``, the Starlette
routes) and served by uvicorn on a loopback port, in its own process:
``python a2a_remote.py --ready-file F --log L [--token T]``.

It answers by cue, like the demo agent:

- anything else: an echo, streamed as three chunks of one artifact, that
  numbers the tasks it has seen in the message's context ("echo 2 in
  <context>: ...") so a test sees the remote kept the context;
- "ask": INPUT_REQUIRED ("Which city?"); the answer on the same task
  completes it ("Booked <answer> on <task>");
- "slow": one chunk, then waits until cancelled (``cancel`` is logged);
- "fail": FAILED with a message that must never reach the mesh's client;
- "reject": REJECTED with a reason meant for the user.

Two cards: ``/.well-known/agent-card.json`` names the JSON-RPC binding,
``/rest/.well-known/agent-card.json`` the HTTP+JSON one. With ``--token``,
every call but the cards' needs ``Authorization: Bearer <token>``. What it
sees goes to the log as JSON lines (``message``, ``cancel``, ``auth``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
from collections import Counter
from pathlib import Path
from typing import Any

import uvicorn
from a2a.helpers import get_message_text, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Task,
    TaskState,
    TaskStatus,
)
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send


class Log:
    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, **entry: Any) -> None:
        with self.path.open("a") as file:
            file.write(json.dumps(entry) + "\n")


class CueAgent(AgentExecutor):
    def __init__(self, log: Log) -> None:
        self.log = log
        self.tasks_in_context: Counter[str] = Counter()

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None and context.task_id and context.context_id
        text = get_message_text(context.message)
        task = context.current_task
        self.log.write(
            event="message",
            context_id=context.context_id,
            task_id=context.task_id,
            text=text,
            continues=task is not None,
        )
        if task is None:
            task = Task(
                id=context.task_id,
                context_id=context.context_id,
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                history=[context.message],
            )
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        if task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            await updater.add_artifact([new_text_part(f"Booked {text} on {task.id}")])
            await updater.complete()
            return
        await updater.start_work(new_text_message("thinking", context_id=context.context_id))
        if "ask" in text:
            await updater.requires_input(new_text_message("Which city?"))
        elif "slow" in text:
            await updater.add_artifact([new_text_part("working on it")], artifact_id="slow")
            await asyncio.Event().wait()  # until the task is cancelled
        elif "fail" in text:
            await updater.failed(new_text_message("Traceback: secret internal detail"))
        elif "reject" in text:
            await updater.reject(new_text_message("I only book trips."))
        else:
            self.tasks_in_context[context.context_id] += 1
            count = self.tasks_in_context[context.context_id]
            chunks = [f"echo {count} in {context.context_id}: ", text, "."]
            for index, chunk in enumerate(chunks):
                await updater.add_artifact(
                    [new_text_part(chunk)],
                    artifact_id="answer",
                    append=index > 0,
                    last_chunk=index == len(chunks) - 1,
                )
            await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        self.log.write(event="cancel", task_id=context.task_id)
        assert context.task_id and context.context_id
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def card(base: str, binding: str, url: str) -> AgentCard:
    return AgentCard(
        name="cue",
        description="An echo that asks, waits, fails or refuses on cue.",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding=binding, protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="echo", description="echoes", tags=["test"])],
    )


def app(port: int, log: Log, token: str | None) -> Starlette:
    base = f"http://127.0.0.1:{port}"
    jsonrpc_card = card(base, "JSONRPC", f"{base}/rpc")
    rest_card = card(base, "HTTP+JSON", f"{base}/rest/api")
    handler = DefaultRequestHandler(
        agent_executor=CueAgent(log), task_store=InMemoryTaskStore(), agent_card=jsonrpc_card
    )
    routes = [
        *create_agent_card_routes(jsonrpc_card),
        *create_agent_card_routes(rest_card, card_url="/rest/.well-known/agent-card.json"),
        *create_jsonrpc_routes(handler, rpc_url="/rpc"),
        *create_rest_routes(handler, path_prefix="/rest/api"),
    ]
    return Starlette(routes=routes, middleware=[Middleware(Bearer, log=log, token=token)])


class Bearer:
    """Plain ASGI (so SSE streams pass untouched): every call but the
    cards' needs the token, when there is one."""

    def __init__(self, app: ASGIApp, log: Log, token: str | None) -> None:
        self.app, self.log, self.token = app, log, token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token is not None and scope["type"] == "http" and "agent-card" not in scope["path"]:
            given = dict(scope["headers"]).get(b"authorization", b"").decode()
            self.log.write(event="auth", ok=given == f"Bearer {self.token}")
            if given != f"Bearer {self.token}":
                await JSONResponse({"error": "unauthorized"}, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--token")
    args = parser.parse_args()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # ready now: calls wait in the backlog until uvicorn takes them
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app(port, Log(args.log), args.token),
        log_level="warning",
        timeout_graceful_shutdown=2,  # a task left waiting must not hold the stop
    )
    args.ready_file.write_text(json.dumps({"port": port}))
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
