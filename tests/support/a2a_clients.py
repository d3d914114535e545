"""A2A clients for the tests: the real, pinned a2a-sdk client per agent over
one binding, made from the agent's card resolved by URL as any A2A client
does, and the small steps the A2A tests share (a message, its task, its
answer, a task polled to its end)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import grpc
import httpx
from a2a.client import Client, ClientCallInterceptor, ClientConfig, ClientFactory
from a2a.types import a2a_pb2

S = a2a_pb2.TaskState
# Generous: a task's end is polled for, never waited out.
POLL_SECONDS = 0.05
POLL_LIMIT = 1200

BINDINGS = ["GRPC", "HTTP+JSON", "JSONRPC"]


class Agents:
    """An a2a-sdk client per agent, over one binding, made from the agent's
    card resolved by URL as any A2A client does."""

    def __init__(self, edge: str, binding: str) -> None:
        self.edge = edge
        self.binding = binding
        self._http = httpx.AsyncClient(timeout=60)
        self._clients: list[Client] = []

    async def client(
        self,
        agent: str,
        *,
        streaming: bool = True,
        interceptors: list[ClientCallInterceptor] | None = None,
    ) -> Client:
        config = ClientConfig(
            streaming=streaming,
            httpx_client=self._http,
            grpc_channel_factory=grpc.aio.insecure_channel,
            supported_protocol_bindings=[self.binding],
        )
        created = await ClientFactory(config).create_from_url(
            f"http://{self.edge}/{agent}", interceptors=interceptors
        )
        self._clients.append(created)
        return created

    async def close(self) -> None:
        for created in self._clients:
            await created.close()
        await self._http.aclose()


def message(text: str, context_id: str = "", **metadata: str) -> a2a_pb2.SendMessageRequest:
    sent = a2a_pb2.Message(
        message_id=str(uuid.uuid4()), role=a2a_pb2.ROLE_USER, context_id=context_id
    )
    sent.parts.add(text=text)
    if metadata:
        sent.metadata.update(metadata)
    return a2a_pb2.SendMessageRequest(message=sent)


def answer(task: a2a_pb2.Task) -> str:
    return "".join(p.text for a in task.artifacts for p in a.parts)


async def sent(client: Client, request: a2a_pb2.SendMessageRequest) -> a2a_pb2.Task:
    """The task a non-streaming send answers with."""
    (response,) = [r async for r in client.send_message(request)]
    assert response.HasField("task")
    return response.task


async def ended(client: Client, task_id: str) -> a2a_pb2.Task:
    for _ in range(POLL_LIMIT):
        task = await client.get_task(a2a_pb2.GetTaskRequest(id=task_id))
        if task.status.state not in (S.TASK_STATE_SUBMITTED, S.TASK_STATE_WORKING):
            return task
        await asyncio.sleep(POLL_SECONDS)
    raise AssertionError(f"task {task_id} did not end")


def open_gate(probe_dir: Path, gate: str) -> None:
    (probe_dir / f"gate-{gate}").write_text("open")
