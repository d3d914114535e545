"""OpenTelemetry: one trace per turn across Envoy, the session servers and the
worker, exported over OTLP to a collector (in this process), with every span a
child of the hop before it."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from opentelemetry.proto.trace.v1 import trace_pb2

from tests.support.collector import Collector, Span
from tests.support.mesh import Component, Mesh, wait_for
from turnmesh.client import AsyncClient

SERVER = trace_pb2.Span.SPAN_KIND_SERVER
CLIENT = trace_pb2.Span.SPAN_KIND_CLIENT


@dataclass
class TracedMesh:
    mesh: Mesh
    collector: Collector
    edge: str
    servers: list[Component]


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TracedMesh]:
    collector = Collector().start()
    # The SDK's batch delay (default 5 s), read by the components at start.
    previous = os.environ.get("OTEL_BSP_SCHEDULE_DELAY")
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "100"
    mesh = Mesh(
        tmp_path_factory.mktemp("traced-mesh"),
        common_args=("--otlp-endpoint", collector.endpoint),
    )
    try:
        mesh.start_router()
        worker = mesh.spawn_worker("worker", "demo")
        servers = [mesh.spawn_server(f"server-{i}", "--log-format", "json") for i in (1, 2)]
        mesh.wait_ready(worker, *servers)
        envoy = mesh.start_envoy(servers, otlp_endpoint=collector.endpoint)
        yield TracedMesh(mesh, collector, envoy.listener_address, servers)
    finally:
        mesh.stop()
        collector.stop()
        if previous is None:
            os.environ.pop("OTEL_BSP_SCHEDULE_DELAY", None)
        else:
            os.environ["OTEL_BSP_SCHEDULE_DELAY"] = previous


def _chain(spans: list[Span], leaf: Span) -> list[Span]:
    """The leaf and its ancestors, nearest first, as far as they are known."""
    by_id = {s.span_id: s for s in spans}
    chain = [leaf]
    while chain[-1].parent_span_id in by_id:
        chain.append(by_id[chain[-1].parent_span_id])
    return chain


def _turn_trace(collector: Collector, trace_id: str) -> list[Span]:
    """Wait for the worker's span and the whole path above it up to Envoy's."""

    def complete() -> bool:
        spans = collector.spans(trace_id)
        runs = [s for s in spans if s.service == "turnmesh-worker"]
        return bool(runs) and _chain(spans, runs[0])[-1].service == "turnmesh-edge"

    wait_for(complete, timeout=30, what=f"the spans of trace {trace_id}")
    return collector.spans(trace_id)


def _assert_one_turn_path(spans: list[Span]) -> Span:
    """worker Run <- server's worker call <- server Turn (<- forwarding server
    Turn) <- Envoy; returns Envoy's span. A REST turn is Turn's SSE form,
    EventStreamService's StreamTurn."""
    (run,) = [s for s in spans if s.service == "turnmesh-worker"]
    assert (run.name, run.kind) == ("turnmesh.v1.WorkerService/Run", SERVER)
    chain = _chain(spans, run)
    call = chain[1]
    assert (call.service, call.name, call.kind) == (
        "turnmesh-server",
        "turnmesh.v1.WorkerService/Run",
        CLIENT,
    )
    turns = chain[2:-1]
    assert 1 <= len(turns) <= 2, [s.name for s in chain]  # two when forwarded
    for turn in turns:
        assert (turn.service, turn.name, turn.kind) == (
            "turnmesh-server",
            "turnmesh.v1.EventStreamService/StreamTurn",
            SERVER,
        )
    # The same turn id on the owner's span and the worker's.
    assert turns[0].attributes["turnmesh.turn_id"] == run.attributes["turnmesh.turn_id"]
    assert turns[0].attributes["turnmesh.session_id"] == run.attributes["turnmesh.session_id"]
    assert chain[-1].service == "turnmesh-edge"
    return chain[-1]


def test_a_rest_turn_continues_the_callers_trace(traced: TracedMesh) -> None:
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    with httpx.Client(base_url=f"http://{traced.edge}", timeout=30) as rest:
        sid = rest.post("/v1/sessions", json={}).json()["session"]["sessionId"]
        response = rest.post(
            f"/v1/sessions/{sid}/turns",
            json={"message": "What is 6*7?"},
            headers={"traceparent": f"00-{trace_id}-{parent}-01"},
        )
        assert response.status_code == 200
        assert "42" in response.text
    edge = _assert_one_turn_path(_turn_trace(traced.collector, trace_id))
    assert edge.parent_span_id == parent  # Envoy's span is the caller's child
    # The turn's log line names its trace.
    records = [
        json.loads(line)
        for server in traced.servers
        for line in server.log().splitlines()
        if line.startswith("{")
    ]
    ended = [r for r in records if r["message"] == "turn ended" and r["session_id"] == sid]
    assert [r.get("trace_id") for r in ended] == [trace_id]


def test_a_turn_without_a_traceparent_starts_its_trace_at_envoy(traced: TracedMesh) -> None:
    with httpx.Client(base_url=f"http://{traced.edge}", timeout=30) as rest:
        sid = rest.post("/v1/sessions", json={}).json()["session"]["sessionId"]
        before = {s.trace_id for s in traced.collector.spans()}
        response = rest.post(f"/v1/sessions/{sid}/turns", json={"message": "hello"})
        assert response.status_code == 200

    def new_worker_span() -> bool:
        return any(
            s.service == "turnmesh-worker" and s.trace_id not in before
            for s in traced.collector.spans()
        )

    wait_for(new_worker_span, timeout=30, what="the worker's span")
    (trace_id,) = {
        s.trace_id
        for s in traced.collector.spans()
        if s.service == "turnmesh-worker" and s.trace_id not in before
    }
    edge = _assert_one_turn_path(_turn_trace(traced.collector, trace_id))
    assert edge.parent_span_id == ""  # the root


async def test_a_grpc_turn_forwarded_between_servers_is_one_trace(traced: TracedMesh) -> None:
    async with AsyncClient(traced.servers[0].address) as first:
        sid = (await first.create_session()).session_id
        await first.send(sid, "hi")  # makes sure the session has an owner
    # Through each server directly: one of the two calls is forwarded.
    callers = {}
    for server in traced.servers:
        trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
        callers[trace_id] = parent
        traceparent = f"00-{trace_id}-{parent}-01"
        async with AsyncClient(server.address, metadata=(("traceparent", traceparent),)) as c:
            await c.send(sid, "What is 6*7?")
    depths = []
    for trace_id, parent in callers.items():

        def reaches_caller(trace_id: str = trace_id, parent: str = parent) -> bool:
            spans = traced.collector.spans(trace_id)
            runs = [s for s in spans if s.service == "turnmesh-worker"]
            return bool(runs) and _chain(spans, runs[0])[-1].parent_span_id == parent

        wait_for(reaches_caller, timeout=30, what="the whole path of the turn")
        spans = traced.collector.spans(trace_id)
        (run,) = [s for s in spans if s.service == "turnmesh-worker"]
        chain = _chain(spans, run)
        assert [s.service for s in chain[1:]] == ["turnmesh-server"] * (len(chain) - 1)
        depths.append(len(chain))
    # Owner: Run <- call <- Turn. Forwarder adds its own Turn above the owner's.
    assert sorted(depths) == [3, 4]


def test_heartbeats_and_health_checks_start_no_traces(traced: TracedMesh) -> None:
    trace_id = secrets.token_hex(16)
    with httpx.Client(base_url=f"http://{traced.edge}", timeout=30) as rest:
        assert rest.get("/ready").status_code == 200
        # One caller's trace for both calls: creating the session asks the
        # router for an owner, and that Route call joins the trace.
        headers = {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}
        created = rest.post("/v1/sessions", json={}, headers=headers)
        sid = created.json()["session"]["sessionId"]
        rest.post(f"/v1/sessions/{sid}/turns", json={"message": "What is 6*7?"}, headers=headers)
    _turn_trace(traced.collector, trace_id)

    def routed() -> bool:
        return any(s.service == "turnmesh-router" for s in traced.collector.spans(trace_id))

    wait_for(routed, timeout=30, what="the router's span")
    # Every router and worker span belongs to a trace some turn started.
    for span in traced.collector.spans():
        if span.service in ("turnmesh-router", "turnmesh-worker"):
            assert span.parent_span_id, span
        assert "Health" not in span.name
        assert "Readiness" not in span.name
        assert "Heartbeat" not in span.name
    # No message content is put on spans.
    assert "6*7" not in json.dumps([s.attributes for s in traced.collector.spans()])


def test_tracing_off_costs_no_spans_and_keeps_the_callers_context() -> None:
    from turnmesh.runtime import tracing

    # Without a provider the API is a no-op, yet a caller's traceparent passes on.
    parent = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    ctx = tracing.extract((("traceparent", parent),))
    (name, value), *_ = tracing.inject(ctx)
    assert (name, value) == ("traceparent", parent)
