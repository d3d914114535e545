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

Cards: ``/.well-known/agent-card.json`` names the JSON-RPC binding,
``/rest/.well-known/agent-card.json`` the HTTP+JSON one and
``/grpc/.well-known/agent-card.json`` the gRPC one (a grpc.aio server with
a2a-sdk's ``GrpcHandler``, on a port of its own in the same event loop);
``/grpc-down/.well-known/agent-card.json`` names a gRPC port nothing
listens on. With ``--token``, every call but the cards' needs
``Authorization: Bearer <token>`` (gRPC: the ``authorization`` metadata).
What it sees goes to the log as JSON lines (``message``, ``cancel``,
``auth``, with ``binding``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import uvicorn
from a2a.helpers import get_message_text, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler, GrpcHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import a2a_pb2_grpc
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


def card(binding: str, url: str) -> AgentCard:
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


def app(
    base: str,
    grpc_port: int,
    down_port: int,
    handler: DefaultRequestHandler,
    log: Log,
    token: str | None,
) -> Starlette:
    routes = [
        *create_agent_card_routes(card("JSONRPC", f"{base}/rpc")),
        *create_agent_card_routes(
            card("HTTP+JSON", f"{base}/rest/api"), card_url="/rest/.well-known/agent-card.json"
        ),
        *create_agent_card_routes(
            card("GRPC", f"127.0.0.1:{grpc_port}"), card_url="/grpc/.well-known/agent-card.json"
        ),
        *create_agent_card_routes(
            card("GRPC", f"127.0.0.1:{down_port}"),
            card_url="/grpc-down/.well-known/agent-card.json",
        ),
        *create_jsonrpc_routes(handler, rpc_url="/rpc"),
        *create_rest_routes(handler, path_prefix="/rest/api"),
    ]
    return Starlette(routes=routes, middleware=[Middleware(Bearer, log=log, token=token)])


class GrpcBearer(grpc.aio.ServerInterceptor):
    """The token on gRPC calls, as ``Bearer`` checks it on HTTP ones."""

    def __init__(self, log: Log, token: str | None) -> None:
        self.log, self.token = log, token

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        if self.token is None:
            return await continuation(details)
        given = dict(details.invocation_metadata or ()).get("authorization", "")
        ok = given == f"Bearer {self.token}"
        self.log.write(event="auth", ok=ok, binding="GRPC")
        if ok:
            return await continuation(details)

        async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "unauthorized")

        handler = await continuation(details)
        if handler is not None and handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(
                refuse,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return grpc.unary_unary_rpc_method_handler(
            refuse,
            request_deserializer=handler.request_deserializer if handler else None,
            response_serializer=handler.response_serializer if handler else None,
        )


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


def _listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # ready now: calls wait in the backlog until uvicorn takes them
    return sock


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def serve(args: argparse.Namespace) -> None:
    log = Log(args.log)
    sock = _listening()
    port = sock.getsockname()[1]
    grpc_server = grpc.aio.server(interceptors=[GrpcBearer(log, args.token)])
    grpc_port = grpc_server.add_insecure_port("127.0.0.1:0")
    base = f"http://127.0.0.1:{port}"
    # One handler (one task store) behind every binding.
    handler = DefaultRequestHandler(
        agent_executor=CueAgent(log),
        task_store=InMemoryTaskStore(),
        agent_card=card("JSONRPC", f"{base}/rpc"),
    )
    down_port = _free_port()
    web = app(base, grpc_port, down_port, handler, log, args.token)
    servicer = GrpcHandler(handler)
    a2a_pb2_grpc.add_A2AServiceServicer_to_server(servicer, grpc_server)  # type: ignore[no-untyped-call]
    await grpc_server.start()
    config = uvicorn.Config(
        web,
        log_level="warning",
        timeout_graceful_shutdown=2,  # a task left waiting must not hold the stop
    )
    args.ready_file.write_text(
        json.dumps({"port": port, "grpc_port": grpc_port, "down_port": down_port})
    )
    try:
        await uvicorn.Server(config).serve(sockets=[sock])
    finally:
        await grpc_server.stop(grace=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--token")
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
