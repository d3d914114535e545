"""What an A2A push notification costs (part of `make bench`): on each
store, echo tasks sent over A2A's gRPC binding (blocking SendMessage) to one
server, without a push config (the baseline, measured in the same run), then
with one (to a receiver on loopback that answers 200 at once), then native
turns without and with a webhook to the same receiver: each one's latency
p50 (interleaved, one of each at a time), the A2A push's ratio to its
baseline beside the native webhook's, and how long after the caller had its
answer each push and each native notice arrived (p50, p99). The machine's speed is
printed beside the figures. Loopback only, bounded, stops by itself.

Usage: python -m bench.a2a_push [--turns N] [--stores memory sqlite redis]
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
from a2a.types import a2a_pb2, a2a_pb2_grpc

from bench import per_store
from tests.support.mesh import Mesh, RedisServer
from tests.support.webhooks import SECRET, Receiver, receiving
from turnmesh.client import AsyncClient


def _request(context_id: str, url: str = "") -> a2a_pb2.SendMessageRequest:
    request = a2a_pb2.SendMessageRequest(tenant="echo")
    request.message.message_id = str(uuid.uuid4())
    request.message.role = a2a_pb2.ROLE_USER
    request.message.context_id = context_id
    request.message.parts.add(text="hello there")
    if url:
        request.configuration.task_push_notification_config.url = url
        request.configuration.task_push_notification_config.token = "bench-token"
    return request


async def _tasks(
    stub: Any, context_id: str, turns: int, url: str = ""
) -> tuple[list[float], dict[str, float]]:
    """Each task's latency (ms), and when each one's caller had its answer, by task id."""
    latencies: list[float] = []
    answered: dict[str, float] = {}
    for _ in range(turns):
        started = time.perf_counter()
        response = await stub.SendMessage(_request(context_id, url), timeout=60)
        answered[response.task.id] = time.time()
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies, answered


def _arrivals(hooks: Receiver, key: str) -> dict[str, float]:
    """When each push (by task id) or notice (by webhook id) first arrived."""
    out: dict[str, float] = {}
    for (headers, body), at in zip(hooks.seen, hooks.times, strict=True):
        if key == "task":
            found = json.loads(body).get("task", {}).get("id")
        else:
            found = headers.get("webhook-id") if "task" not in json.loads(body) else None
        if found:
            out.setdefault(found, at)
    return out


async def measure(store: str, turns: int, workdir: Path) -> dict[str, Any]:
    redis = RedisServer(workdir) if store == "redis" else None
    mesh = Mesh(workdir / "mesh")
    secret = workdir / "secret"
    secret.write_text(SECRET)
    try:
        async with receiving() as hooks:
            mesh.start_router()
            worker = mesh.spawn_worker("echo", "echo")
            flags = ["--webhook-allow", hooks.url, "--webhook-secret-file", str(secret)]
            if store == "sqlite":
                flags += ["--store", f"sqlite:{workdir / 'sessions.db'}"]
            elif redis is not None:
                flags += ["--store", redis.url]
            server = mesh.spawn_server("server", *flags)
            mesh.wait_ready(worker, server)
            plain: list[float] = []
            pushed: list[float] = []
            native_plain: list[float] = []
            native: list[float] = []
            answered: dict[str, float] = {}
            ended: dict[str, float] = {}
            async with (
                grpc.aio.insecure_channel(server.address) as channel,
                AsyncClient(server.address) as client,
            ):
                stub = a2a_pb2_grpc.A2AServiceStub(channel)  # type: ignore[no-untyped-call]
                context_id = f"bench-{uuid.uuid4()}"
                sid = (await client.create_session(agent="echo")).session_id
                for _ in range(10):  # warm up
                    await _tasks(stub, context_id, 1)
                    await client.send(sid, "warm up")
                # Interleaved, one of each at a time: a machine whose load
                # drifts slows all four alike.
                for _ in range(turns):
                    latencies, _ = await _tasks(stub, context_id, 1)
                    plain += latencies
                    latencies, at = await _tasks(stub, context_id, 1, hooks.url)
                    pushed += latencies
                    answered.update(at)
                    started = time.perf_counter()
                    await client.send(sid, "hello there")
                    native_plain.append((time.perf_counter() - started) * 1000)
                    started = time.perf_counter()
                    result = await client.send(sid, "hello there", webhook_url=hooks.url)
                    ended[f"msg_{result.turn_id}"] = time.time()
                    native.append((time.perf_counter() - started) * 1000)
            await hooks.requests(2 * turns)
            pushes = _arrivals(hooks, "task")
            notices = _arrivals(hooks, "webhook-id")
        push_lag = [(pushes[t] - at) * 1000 for t, at in answered.items()]
        notice_lag = [(notices[i] - at) * 1000 for i, at in ended.items()]
        baseline = statistics.median(plain)
        return {
            "store": store,
            "turns": turns,
            "a2a_task_p50_ms": round(baseline, 2),
            "a2a_task_with_push_p50_ms": round(statistics.median(pushed), 2),
            "ratio_to_task": round(statistics.median(pushed) / baseline, 2),
            "push_after_answer_p50_ms": per_store.quantile(push_lag, 0.5),
            "push_after_answer_p99_ms": per_store.quantile(push_lag, 0.99),
            "native_turn_p50_ms": round(statistics.median(native_plain), 2),
            "native_turn_with_webhook_p50_ms": round(statistics.median(native), 2),
            "native_ratio_to_turn": round(
                statistics.median(native) / statistics.median(native_plain), 2
            ),
            "notice_after_answer_p50_ms": per_store.quantile(notice_lag, 0.5),
            "notice_after_answer_p99_ms": per_store.quantile(notice_lag, 0.99),
        }
    finally:
        mesh.stop()
        if redis is not None:
            redis.stop()


def main() -> None:
    per_store.main(__doc__ or "", "a2a-push", ("turns", 200), measure)


if __name__ == "__main__":
    main()
