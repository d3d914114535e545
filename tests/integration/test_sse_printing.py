"""The REST event streams print events in Python (runtime/sse.py); these
tests hold that printing to the real thing, byte for byte: Envoy's JSON
transcoder printing the same events from ``SessionService.Turn``, on an edge
configured as ours is except that the turn route keeps the transcoder. Every
Unicode code point, doubles that print differently in Python and C++,
unknown enum values, nested structs and timestamps go through both.

Then the route as served: a REST turn and its replay through the edge, from
the session's owner and forwarded by another server, are the events gRPC
gives, printed so; a replay is one message for every event ready."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import httpx
import pytest
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2_grpc
from grpc_health.v1.health import HealthServicer

from tests.support.mesh import Component, Mesh, session_owned_by
from turnmesh.client import AsyncClient
from turnmesh.envoy import EdgeConfig
from turnmesh.envoy.config import EVENT_STREAM_PATHS, SESSION_SERVICE, render
from turnmesh.envoy.process import RunningEnvoy
from turnmesh.envoy.process import start as start_envoy
from turnmesh.runtime import sse
from turnmesh.v1 import event_pb2, event_stream_pb2_grpc, session_service_pb2_grpc
from turnmesh.v1 import session_service_pb2 as spb

TRANSCODER = "envoy.filters.http.grpc_json_transcoder"
# Code points per event in the sweep (the largest frame stays well under
# the transcoder's and gRPC's message limits).
SWEEP_CHUNK = 40_000


def _sweep() -> list[event_pb2.Event]:
    """Every code point but the surrogates (protobuf strings are UTF-8)."""
    points = [c for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF]
    return [
        event_pb2.Event(type=event_pb2.TEXT_MESSAGE_CONTENT, seq=n, delta="".join(map(chr, chunk)))
        for n, chunk in enumerate(
            (points[i : i + SWEEP_CHUNK] for i in range(0, len(points), SWEEP_CHUNK)), 1
        )
    ]


DOUBLES = (
    1796295938888.0,
    1.0,
    -0.0,
    0.1,
    1 / 3,
    2.0**53,
    2.0**53 + 2,
    123456789012345678.0,
    1e15,
    1e16,
    1e21,
    1.5e-7,
    5e-324,
    1.7976931348623157e308,
    -2.5e-5,
    math.nan,
    math.inf,
    -math.inf,
)


def _shapes() -> list[event_pb2.Event]:
    """Every kind of field an event has, with values printed differently by
    Python's json and protobuf's C++ writer."""
    events = [event_pb2.Event(type=event_pb2.CUSTOM, timestamp=value) for value in DOUBLES]
    events.append(event_pb2.Event(type=99, seq=-5, execution_time_ms=2**31 - 1))  # type: ignore[arg-type]
    finished = event_pb2.Event(
        type=event_pb2.RUN_FINISHED,
        thread_id="t<>\"\\'&\u2028",
        collected_messages=3,
        problem=event_pb2.Problem(type="about:blank", status=409),
    )
    finished.usage.add(input_tokens=1, output_tokens=0, total_tokens=1)
    finished.usage.add()
    # Keys inserted out of order, keys that need escaping, every Value kind.
    finished.result.update(
        {
            "zeta": 1,
            "alpha": {"y": [1.5, 2.0, "x", None, True, False, {"k": []}], "x": {}},
            "<key>\u2029": 0.1,
            "": -0.0,
            "big": 1e21,
        }
    )
    interrupt = finished.outcome.interrupts.add(id="i", reason="approval")
    interrupt.expires_at.FromNanoseconds(1_796_295_938_123_456_789)
    interrupt.response_schema.update({"type": "object", "required": ["a", "b"]})
    interrupt.metadata.SetInParent()  # set, and empty: {}
    for nanos in (0, 1_000_000, 1_000, 1):
        other = finished.outcome.interrupts.add(id=f"n{nanos}")
        other.expires_at.FromNanoseconds(1_796_295_938_000_000_000 + nanos)
    finished.outcome.pending_tool_call_ids.extend(["a", "b"])
    events = [*events, finished]
    values: tuple[Any, ...] = ({"s": "x"}, [], None, "text", 2.5, True)
    for value in values:
        custom = event_pb2.Event(type=event_pb2.CUSTOM, name="v")
        if value is None:
            custom.value.null_value = struct_pb2.NULL_VALUE
        elif isinstance(value, dict):
            custom.value.struct_value.update(value)
        elif isinstance(value, list):
            custom.value.list_value.SetInParent()
        elif isinstance(value, bool):
            custom.value.bool_value = value
        elif isinstance(value, str):
            custom.value.string_value = value
        else:
            custom.value.number_value = value
        events.append(custom)
    return events


CASES = {"sweep": _sweep, "shapes": _shapes}


class _Events(session_service_pb2_grpc.SessionServiceServicer):
    """Answers a turn with the crafted events its message names."""

    async def Turn(
        self, request: spb.TurnRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[event_pb2.Event]:
        for event in CASES[request.message]():
            yield event


@pytest.fixture
async def transcoded(tmp_path: Path) -> AsyncIterator[str]:
    """An edge as ours, but whose turn route keeps the transcoder (printing
    SessionService.Turn's events as it does on streamed routes), in front of
    a server that answers with crafted events. Yields its address."""
    server = grpc.aio.server()
    session_service_pb2_grpc.add_SessionServiceServicer_to_server(
        cast(Any, _Events)(),
        server,  # Turn only: the stub types the rest abstract
    )
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), server)  # serving
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    config = render(
        EdgeConfig(upstreams=[f"127.0.0.1:{port}"], port=0, admin_port=0, api_keys=False)
    )
    for route in _routes(config):
        if route["match"].get("safe_regex", {}).get("regex") == EVENT_STREAM_PATHS:
            options = route["typed_per_filter_config"][TRANSCODER]
            options["services"] = [SESSION_SERVICE]
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(config))
    with (tmp_path / "envoy.log").open("wb") as log:
        # In a thread: the loop keeps answering Envoy's health checks, which
        # its listener waits for before it accepts.
        envoy: RunningEnvoy = await asyncio.to_thread(start_envoy, path, tmp_path, stdout=log)
    try:
        await _accepting(envoy.listener_address)
        yield envoy.listener_address
    finally:
        envoy.proc.terminate()
        envoy.proc.wait(timeout=30)
        await server.stop(None)


async def _accepting(address: str) -> None:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + 60
    while True:
        try:
            _, writer = await asyncio.open_connection(host, int(port))
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return


def _routes(config: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for listener in config["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for network_filter in chain["filters"]:
                manager = network_filter["typed_config"]
                for host in manager.get("route_config", {}).get("virtual_hosts", []):
                    yield from host["routes"]


@pytest.mark.parametrize("case", sorted(CASES))
async def test_events_print_byte_for_byte_as_the_transcoder_prints_them(
    transcoded: str, case: str
) -> None:
    async with httpx.AsyncClient(base_url=f"http://{transcoded}", timeout=120) as rest:
        response = await rest.post("/v1/sessions/s/turns", json={"message": case})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == sse.CONTENT_TYPE
    events = CASES[case]()
    theirs = response.content.split(b"\n\n")
    ours = sse.frames(events).split(b"\n\n")
    assert len(theirs) == len(ours)
    for index, (event, a, b) in enumerate(zip(events, theirs, ours, strict=False)):
        if _has_struct(event):
            # C++ prints a Struct's members in its hash map's order, which no
            # client can rely on (ours are sorted): the same members, each
            # printed exactly alike (numbers kept as their text).
            assert _exact(a) == _exact(b), f"event {index}:\n{a!r}\n{b!r}"
        else:
            assert a == b, f"event {index}:\n{a!r}\n{b!r}"


def _has_struct(event: event_pb2.Event) -> bool:
    interrupts = event.outcome.interrupts
    return (
        event.HasField("result")
        or event.HasField("value")
        or any(i.HasField("response_schema") or i.HasField("metadata") for i in interrupts)
    )


def _exact(frame: bytes) -> Any:
    return json.loads(
        frame.removeprefix(b"data: "), parse_float=str, parse_int=str, parse_constant=str
    )


# -- the route as served -----------------------------------------------------------


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Mesh, str]]:
    """Two servers, an edge in front of the first only (the second's
    sessions are forwarded to it)."""
    mesh = Mesh(tmp_path_factory.mktemp("sse-streams"))
    try:
        mesh.start_router()
        worker = mesh.spawn_worker("worker-probe", "probe_agent:ProbeAgent")
        servers = [mesh.spawn_server(name, "--agent", "probe") for name in ("front", "back")]
        mesh.wait_ready(worker, *servers)
        edge = mesh.start_envoy(servers[:1])
        yield mesh, edge.listener_address
    finally:
        mesh.stop()


def _server(mesh: Mesh, name: str) -> Component:
    return next(c for c in mesh.components if c.name == name)


async def _grpc_events(address: str, sid: str, turn_id: str) -> list[event_pb2.Event]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = session_service_pb2_grpc.SessionServiceStub(channel)
        request = spb.SubscribeTurnRequest(session_id=sid, turn_id=turn_id)
        return [event async for event in stub.SubscribeTurn(request)]


async def _stream_messages(address: str, sid: str, turn_id: str) -> AsyncGenerator[bytes, None]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = event_stream_pb2_grpc.EventStreamServiceStub(channel)
        request = spb.SubscribeTurnRequest(session_id=sid, turn_id=turn_id)
        async for body in stub.StreamSubscribeTurn(request):
            yield body.data


@pytest.mark.parametrize("owner", ["front", "back"])
async def test_a_rest_turn_and_its_replay_are_the_grpc_events_printed(
    two_servers: tuple[Mesh, str], owner: str
) -> None:
    mesh, edge = two_servers
    front, held_by = _server(mesh, "front"), _server(mesh, owner)
    async with AsyncClient(front.address) as client:
        sid = await session_owned_by(client, mesh, held_by, "probe")
    body = {"message": "naïve <tags> \u2028", "metadata": {"deltas": 600, "delay_ms": 0}}
    async with httpx.AsyncClient(base_url=f"http://{edge}", timeout=120) as rest:
        turn = await rest.post(f"/v1/sessions/{sid}/turns", json=body)
        assert turn.status_code == 200, turn.text
        turn_id = json.loads(turn.content.split(b"\n\n")[0].removeprefix(b"data: "))["runId"]
        replay = await rest.get(f"/v1/sessions/{sid}/turns/{turn_id}/events")
        later = await rest.get(f"/v1/sessions/{sid}/turns/{turn_id}/events?afterSeq=600")
    events = await _grpc_events(held_by.address, sid, turn_id)
    assert len(events) > 600
    assert turn.content == replay.content == sse.frames(events)
    assert later.content == sse.frames(events[600:])
    # A finished turn's replay: every event ready at once, so each message
    # holds as many as a batch may (from the front server too, forwarded).
    messages = [m async for m in _stream_messages(front.address, sid, turn_id)]
    expected_messages = -(-len(events) // 256)  # MAX_BATCH_EVENTS a message
    assert len(messages) == expected_messages
    assert b"".join(messages) == sse.frames(events)
