"""Limits of the whole mesh on Redis: one request rate, one session quota and
one turn quota per principal, whichever server a call reaches; the scripts
behind them on one Redis and on a cluster; what happens when Redis is gone."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis.asyncio as redis
from google.protobuf import struct_pb2
from prometheus_client import REGISTRY

from tests.support.mesh import Component, Mesh, RedisServer, eventually
from tests.unit._server_fakes import FakeRunner, spin_until
from tests.unit.test_server_core import FakePool
from turnmesh.client import (
    AsyncClient,
    RateLimitedError,
    SessionQuotaExceededError,
    TurnmeshClientError,
    TurnQuotaExceededError,
)
from turnmesh.runtime.errors import SessionBusy, TurnQuotaExceeded, Unavailable
from turnmesh.runtime.interceptors import MESH_KEY_METADATA
from turnmesh.runtime.ratelimit import TokenBuckets
from turnmesh.runtime.serving import insecure_channel
from turnmesh.server.config import SessionLimits
from turnmesh.server.mesh.limits import MeshRates, TurnLeases
from turnmesh.server.mesh.limits_redis import RedisLimits, rate_key, turns_key
from turnmesh.server.sessions.admission import admit
from turnmesh.server.sessions.core import SessionCore
from turnmesh.server.sessions.eventlog import TurnLog
from turnmesh.server.sessions.turns import CancelReason
from turnmesh.server.stores.memory import MemoryStore
from turnmesh.server.stores.redis_client import connect
from turnmesh.v1 import event_pb2
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1 import session_service_pb2 as spb
from turnmesh.v1.router_service_pb2_grpc import RouterServiceStub

MESH_KEY = "tm-mesh-limits-key-0123456789"
KEYS = {name: f"key-of-{name}" for name in ("rate-a", "rate-b", "quota", "turns")}
# One request per 100 s after the burst: refill during a test is nil, so
# counts are exact.
RATE, BURST = 0.01, 20
SESSIONS, TURNS = 3, 1
DB = 11  # a database of its own on the shared server


def _db_url(redis_server: RedisServer, db: int) -> str:
    return redis_server.url.rpartition("/")[0] + f"/{db}"


async def _flush(url: str) -> None:
    raw = redis.Redis.from_url(url)
    await raw.flushdb()
    await raw.aclose()


# The scripts, on one Redis and on a cluster ----------------------------------


@pytest.fixture(params=["redis", "redis-cluster"])
async def url(request: pytest.FixtureRequest, redis_server: RedisServer) -> str:
    if request.param == "redis-cluster":
        return str(request.getfixturevalue("redis_cluster").url)
    url = _db_url(redis_server, DB)
    await _flush(url)
    return url


@pytest.fixture
async def two_servers(url: str) -> AsyncIterator[tuple[RedisLimits, RedisLimits, Any]]:
    """The limits as two servers see them (a client each), and a raw client."""
    clients = [connect(url) for _ in range(3)]
    yield RedisLimits(clients[0]), RedisLimits(clients[1]), clients[2]
    for client in clients:
        await client.aclose()


def _principal(name: str, request: pytest.FixtureRequest) -> str:
    # Each run its own principals: the cluster is shared by the whole session.
    return f"{name}-{abs(hash(request.node.nodeid)) % 10**8}"


async def test_the_shared_rate_answers_as_one_token_bucket(
    two_servers: tuple[RedisLimits, RedisLimits, Any], request: pytest.FixtureRequest
) -> None:
    one, two, raw = two_servers
    acme, beta = _principal("acme", request), _principal("beta", request)
    # A fractional burst, and a rate slow enough that nothing refills meanwhile.
    rate, burst = 0.001, 2.5
    local = TokenBuckets(rate, burst, clock=lambda: 0.0)
    expected = [local.take(b"acme") for _ in range(4)]
    assert expected[:2] == [0.0, 0.0] and expected[2] == pytest.approx(500.0)
    began = time.monotonic()
    shared = [await (one, two)[n % 2].wait(acme, rate, burst) for n in range(4)]
    elapsed = time.monotonic() - began
    assert shared[:2] == [0.0, 0.0]
    # Refused, nothing taken: each waits what the local bucket says, less
    # the time Redis's clock moved on since the first take (a busy machine
    # may take a second or more over the four calls).
    for wait in shared[2:]:
        assert expected[2] - elapsed - 0.01 <= wait <= expected[2] + 0.01
    assert await two.wait(beta, rate, burst) == 0.0  # another principal's own bucket
    # One key per principal, in its slot, gone once the bucket is full again.
    assert rate_key(acme) == f"tm:l:{{{acme}}}:r"
    assert 0 < await raw.pttl(rate_key(acme)) <= 2 / rate * 1000


async def test_turn_leases_hold_the_quota_across_servers_and_lapse_when_not_renewed(
    two_servers: tuple[RedisLimits, RedisLimits, Any], request: pytest.FixtureRequest
) -> None:
    one, two, raw = two_servers
    acme, beta = _principal("acme", request), _principal("beta", request)
    a, b = TurnLeases(one, "server-a", 6.0), TurnLeases(two, "server-b", 6.0)
    first = await a.take(acme, 2)
    second = await b.take(acme, 2)
    assert first is not None and second is not None
    assert await a.take(acme, 2) is None and await b.take(acme, 2) is None
    assert await b.take(beta, 2) is not None  # another principal's own quota
    second.release()
    second.release()  # once only
    await eventually(lambda: _leases(one, acme, 1), what="the released lease to go")
    assert await a.take(acme, 2) is not None
    await a.stop()
    await b.stop()

    # A server that crashed renews nothing: its leases lapse; a live one's
    # stay, renewed (a live lease of 6 s, renewed every 1.5 s: a busy
    # machine's stalls do not lapse it).
    gamma = _principal("gamma", request)
    crashed = TurnLeases(one, "crashed", 1.0)
    live = TurnLeases(two, "live", 6.0)
    live.start()
    try:
        assert await crashed.take(gamma, 2) is not None
        assert await live.take(gamma, 2) is not None
        (first_expiry,) = await _expiries(raw, gamma, "live|")
        newcomer = TurnLeases(one, "newcomer", 6.0)

        async def freed() -> bool:
            return await newcomer.take(gamma, 2) is not None

        async def renewed() -> bool:
            return (await _expiries(raw, gamma, "live|"))[0] > first_expiry

        await eventually(freed, what="the crashed server's lease to lapse")
        await eventually(renewed, what="the live server to renew its lease")
        assert await newcomer.take(gamma, 2) is None  # the live server's stays
    finally:
        await live.stop()
    assert turns_key(gamma) == f"tm:l:{{{gamma}}}:t"
    assert await raw.pttl(turns_key(gamma)) > 0  # the key goes with its last lease


async def _expiries(raw: Any, principal: str, prefix: str) -> list[float]:
    """When the principal's leases taken by one server lapse (ms)."""
    rows = await raw.zrange(turns_key(principal), 0, -1, withscores=True)
    return [score for lease, score in rows if lease.decode().startswith(prefix)]


async def _leases(limits: RedisLimits, principal: str, count: int) -> bool:
    return await limits.turns(principal) == count


# A server's turns and their leases ---------------------------------------------


@pytest.fixture
async def redis_limits(redis_server: RedisServer) -> AsyncIterator[tuple[RedisLimits, Any]]:
    url = _db_url(redis_server, DB + 2)
    await _flush(url)
    client, raw = connect(url), connect(url)
    yield RedisLimits(client), raw
    await client.aclose()
    await raw.aclose()


async def test_each_turn_holds_one_lease_from_placed_to_ended(
    redis_limits: tuple[RedisLimits, Any],
) -> None:
    limits, raw = redis_limits
    leases = TurnLeases(limits, "server-a", 6.0)
    core = SessionCore(
        MemoryStore(),
        FakePool("demo"),  # type: ignore[arg-type]
        "demo",
        SessionLimits(max_turns_per_principal=3),
        turn_leases=leases,
    )
    runner = FakeRunner()
    core.runner = runner  # type: ignore[assignment]
    for sid in ("acme/s1", "acme/s2"):
        await core.create_session(sid, "demo", struct_pb2.Struct())

    async def turn(sid: str, policy: spb.TurnPolicy.ValueType) -> TurnLog:
        request = spb.TurnRequest(session_id=sid, message="hi", policy=policy)
        return await core.start_turn(await admit(request, sid))

    async def held(count: int) -> bool:
        return bool(await raw.zcard(turns_key("acme")) == count)

    running = await turn("acme/s1", spb.TURN_POLICY_ENQUEUE)
    await spin_until(lambda: running.turn_id in runner.started)
    batch = await turn("acme/s1", spb.TURN_POLICY_COLLECT)
    assert await held(2)
    # A message that joins the batch gives back the lease it took.
    joined = await turn("acme/s1", spb.TURN_POLICY_COLLECT)
    assert joined.turn_id == batch.turn_id
    await eventually(lambda: held(2), what="the joined message's lease to go")
    # So does one refused after its lease was taken.
    with pytest.raises(SessionBusy):
        await turn("acme/s1", spb.TURN_POLICY_REJECT)
    await eventually(lambda: held(2), what="the refused turn's lease to go")
    await turn("acme/s2", spb.TURN_POLICY_ENQUEUE)
    with pytest.raises(TurnQuotaExceeded, match="in the mesh"):
        await turn("acme/s2", spb.TURN_POLICY_ENQUEUE)
    assert await held(3)  # the refused one took none
    for turns in core._turns.values():
        turns.cancel_all(CancelReason.CANCELLED)
        await turns.wait_idle()
    await eventually(lambda: held(0), what="every ended turn's lease to go")
    await leases.stop()


# Redis unreachable ---------------------------------------------------------------


def _fallbacks() -> float:
    return REGISTRY.get_sample_value("turnmesh_rate_limit_fallbacks_total") or 0.0


async def test_without_redis_rates_fall_back_to_each_server_and_turn_quotas_fail_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as s:  # a port nothing listens on: refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = connect(f"redis://127.0.0.1:{port}/0")
    limits = RedisLimits(client)
    rates = MeshRates(limits, 0.001, 2)
    before = _fallbacks()
    with caplog.at_level(logging.WARNING, logger="turnmesh.server.mesh.limits"):
        waits = [await rates.admit(b"acme") for _ in range(3)]
    # This server's own bucket, exactly: a burst of two, then the rate.
    assert waits[:2] == [0.0, 0.0] and waits[2] == pytest.approx(1000.0, abs=1.0)
    assert _fallbacks() - before == 3
    said = [r for r in caplog.records if r.name == "turnmesh.server.mesh.limits"]
    assert len(said) == 1 and "alone" in said[0].getMessage()  # once per outage
    with pytest.raises(Unavailable):
        await TurnLeases(limits, "server-a", 6.0).take("acme", 1)
    await client.aclose()


# Two servers on one Redis ----------------------------------------------------------


@dataclass
class Shared:
    mesh: Mesh
    servers: list[Component]
    edge: str
    redis_url: str


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[Shared]:
    workdir = tmp_path_factory.mktemp("mesh-limits")
    keys = workdir / "api-keys"
    keys.write_text("".join(f"{name}\t{key}\n" for name, key in KEYS.items()))
    url = _db_url(redis_server, DB + 1)
    asyncio.run(_flush(url))
    mesh = Mesh(workdir / "mesh", common_args=("--mesh-key", MESH_KEY))
    try:
        mesh.start_router()
        worker = mesh.spawn_worker("worker", "probe_agent:ProbeAgent")
        limits = [
            *("--rate-limit", str(RATE), "--rate-burst", str(BURST)),
            *("--max-sessions-per-principal", str(SESSIONS)),
            *("--max-turns-per-principal", str(TURNS)),
        ]
        servers = [
            mesh.spawn_server(
                name, "--store", url, "--api-keys-file", str(keys), "--agent", "probe", *limits
            )
            for name in ("server-1", "server-2")
        ]
        mesh.wait_ready(worker, *servers)
        envoy = mesh.start_envoy(servers)
        yield Shared(mesh, servers, envoy.listener_address, url)
    finally:
        mesh.stop()


@pytest.fixture
async def clients(shared: Shared) -> AsyncIterator[dict[str, list[AsyncClient]]]:
    """Per principal, a client of each server."""
    made = {
        name: [AsyncClient(s.address, api_key=key) for s in shared.servers]
        for name, key in KEYS.items()
    }
    yield made
    for pair in made.values():
        for client in pair:
            await client.close()


async def test_a_principal_has_one_request_rate_across_servers(
    shared: Shared, clients: dict[str, list[AsyncClient]]
) -> None:
    one, two = clients["rate-a"]
    # Exactly the burst, wherever the calls land (per server it was twice that).
    for n in range(BURST):
        await (one, two)[n % 2].list_sessions()
    for client in (one, two):
        with pytest.raises(RateLimitedError) as refused:
            await client.list_sessions()
        assert refused.value.retry_after is not None
        assert 1 / RATE * 0.9 < refused.value.retry_after <= 1 / RATE
    async with httpx.AsyncClient(base_url=f"http://{shared.edge}") as rest:
        response = await rest.get(
            "/v1/sessions", headers={"Authorization": f"Bearer {KEYS['rate-a']}"}
        )
        assert response.status_code == 429, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert 1 / RATE * 0.9 < int(response.headers["retry-after"]) <= 1 / RATE
        other = await rest.get(
            "/v1/sessions", headers={"Authorization": f"Bearer {KEYS['rate-b']}"}
        )
        assert other.status_code == 200, other.text  # its own rate, untouched


async def test_a_principal_has_one_session_quota_across_servers(
    shared: Shared, clients: dict[str, list[AsyncClient]]
) -> None:
    one, two = clients["quota"]

    async def create(n: int) -> str | TurnmeshClientError:
        try:
            return (await (one, two)[n % 2].create_session()).session_id
        except TurnmeshClientError as exc:
            return exc

    # Creates racing at the quota on both servers never pass it together.
    raced = await asyncio.gather(*(create(n) for n in range(8)))
    made = [r for r in raced if isinstance(r, str)]
    assert len(made) <= SESSIONS
    assert all(isinstance(r, SessionQuotaExceededError) for r in raced if r not in made)
    for n in range(SESSIONS - len(made)):
        made.append((await (one, two)[n % 2].create_session()).session_id)
    for client in (one, two):
        with pytest.raises(SessionQuotaExceededError):
            await client.create_session()
    listed = await two.list_sessions()
    assert sorted(s.session_id for s in listed.sessions) == sorted(made)
    await one.delete_session(made[0])
    await two.create_session()  # a place freed in the whole mesh


async def _owner(mesh: Mesh, session_id: str) -> str:
    assert mesh.router is not None
    async with insecure_channel(mesh.router.address) as channel:
        route = await RouterServiceStub(channel).Route(
            rpb.RouteRequest(session_id=session_id, lookup_only=True),
            metadata=((MESH_KEY_METADATA, MESH_KEY),),
        )
    return route.owner.member_id


async def test_a_principal_has_one_turn_quota_across_servers(
    shared: Shared, clients: dict[str, list[AsyncClient]]
) -> None:
    by_server: dict[str, str] = {}
    for _ in range(SESSIONS):  # sessions are spread round-robin
        sid = (await clients["turns"][0].create_session()).session_id
        by_server.setdefault(await _owner(shared.mesh, f"turns/{sid}"), sid)
    owners = [s.member_id for s in shared.servers]
    assert set(by_server) == set(owners)
    first, second = (by_server[owner] for owner in owners)
    one, two = clients["turns"]
    slow = {"deltas": 1000, "delay_ms": 20}
    async with one.stream_turn(first, "slow", metadata=slow) as stream:
        async for event in stream:
            if event.type == event_pb2.TEXT_MESSAGE_CONTENT:
                # Running on server 1: server 2 refuses this principal's next turn.
                with pytest.raises(TurnQuotaExceededError) as refused:
                    await two.send(second, "hi")
                assert "in the mesh" in str(refused.value)
                await one.cancel_turn(first, event.run_id)
                break
    raw = redis.Redis.from_url(shared.redis_url)
    try:

        async def released() -> bool:
            return await raw.zcard(turns_key("turns")) == 0

        await eventually(released, what="the cancelled turn's lease to go")
    finally:
        await raw.aclose()
    assert (await two.send(second, "hi", metadata={"deltas": 1, "delay_ms": 1})).text
