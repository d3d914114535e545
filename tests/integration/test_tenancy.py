"""Sessions belong to the principal that created them: through every REST
path, every gRPC method and every compatibility surface, another principal's
session answers exactly like one that does not exist; ids are per principal;
admins read (only read) anyone's, logged; listings are each principal's own,
in keyset pages that hold under concurrent writes; quotas are per principal."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from a2a.client import A2AClientError, AuthInterceptor, Client, ClientConfig, ClientFactory
from a2a.client.auth import CredentialService
from a2a.types import a2a_pb2
from a2a.utils.errors import TaskNotFoundError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.certs import TestCA
from tests.support.mesh import Component, Mesh, until
from turnmesh.client import (
    AsyncClient,
    NotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
    UnavailableError,
)
from turnmesh.runtime.serving import insecure_channel
from turnmesh.v1 import compat_service_pb2 as cpb
from turnmesh.v1 import event_pb2
from turnmesh.v1 import router_service_pb2 as rpb
from turnmesh.v1 import session_service_pb2 as spb
from turnmesh.v1.compat_service_pb2_grpc import CompatServiceStub
from turnmesh.v1.router_service_pb2_grpc import RouterServiceStub
from turnmesh.v1.session_service_pb2_grpc import SessionServiceStub

MESH_KEY = "tm-tenancy-mesh-key-0123456789"
KEYS = {"acme": "key-of-acme", "beta": "key-of-beta", "ops": "key-of-ops", "pager": "key-pager"}
BARE = "a-bare-key-with:colons"


def _auth(principal: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS.get(principal, BARE)}"}


def _keys_file(path: Path) -> Path:
    lines = [f"{name}\t{key}" + ("\tadmin" if name == "ops" else "") for name, key in KEYS.items()]
    digest = hashlib.sha256(BARE.encode()).hexdigest()
    path.write_text("\n".join([*lines, f"sha256:{digest}"]) + "\n")
    return path


@dataclass
class Tenants:
    mesh: Mesh
    servers: list[Component]
    edge: str


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    workdir = tmp_path_factory.mktemp("tenancy")
    keys = _keys_file(workdir / "api-keys")
    mesh = Mesh(workdir / "mesh", common_args=("--mesh-key", MESH_KEY))
    try:
        mesh.start_router()
        workers = [
            mesh.spawn_worker("worker-echo", "echo"),
            mesh.spawn_worker("worker-probe", "probe_agent:ProbeAgent"),
        ]
        servers = [
            mesh.spawn_server(f"server-{i}", "--api-keys-file", str(keys), "--agent", "echo")
            for i in (1, 2)
        ]
        mesh.wait_ready(*workers, *servers)
        envoy = mesh.start_envoy(servers)
        yield Tenants(mesh, servers, envoy.listener_address)
    finally:
        mesh.stop()


@pytest.fixture
async def rest(tenants: Tenants) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=f"http://{tenants.edge}", timeout=60) as client:
        yield client


async def _turn(rest: httpx.AsyncClient, who: str, sid: str, text: str, **extra: object) -> str:
    """Run a turn over REST/SSE; its turn id."""
    response = await rest.post(
        f"/v1/sessions/{sid}/turns", json={"message": text, **extra}, headers=_auth(who)
    )
    assert response.status_code == 200, response.text
    events = [
        json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")
    ]
    assert events[-1]["type"] == "RUN_FINISHED", events
    return str(events[0]["runId"])


async def _history(rest: httpx.AsyncClient, who: str, sid: str, **params: str) -> str:
    response = await rest.get(f"/v1/sessions/{sid}/history", headers=_auth(who), params=params)
    assert response.status_code == 200, response.text
    return response.text


async def test_another_principals_session_is_exactly_a_missing_one_on_every_rest_path(
    rest: httpx.AsyncClient,
) -> None:
    created = await rest.post(
        "/v1/sessions", json={"sessionId": "my-thread", "agentName": "echo"}, headers=_auth("acme")
    )
    assert created.status_code == 200, created.text
    assert created.json()["session"]["sessionId"] == "my-thread"  # the public id, unscoped
    turn_id = await _turn(rest, "acme", "my-thread", "acme's secret plan")

    paths = [
        ("GET", "/v1/sessions/my-thread", None),
        ("GET", "/v1/sessions/my-thread/history", None),
        ("POST", "/v1/sessions/my-thread/turns", {"message": "what did they say?"}),
        ("POST", f"/v1/sessions/my-thread/turns/{turn_id}:cancel", {}),
        ("GET", f"/v1/sessions/my-thread/turns/{turn_id}/events", None),
        ("POST", "/v1/sessions/my-thread:fork", {}),
        ("DELETE", "/v1/sessions/my-thread", None),
    ]
    for method, path, body in paths:
        # beta (no such session of its own) and the bare key's principal
        # (nothing at all) get the same answer, byte for byte.
        answers = [
            await rest.request(method, path, json=body, headers=_auth(who))
            for who in ("beta", "bare")
        ]
        assert answers[0].status_code == answers[1].status_code, path
        # Byte for byte, but for each request's own id (a problem's `instance`).
        bodies = [a.content.replace(a.headers["x-request-id"].encode(), b"ID") for a in answers]
        assert bodies[0] == bodies[1], path
        assert "secret" not in answers[0].text
        if method == "DELETE":
            assert answers[0].json() == {"deleted": False}  # as for any missing id
        else:
            assert answers[0].status_code == 404, (path, answers[0].text)

    # Nothing changed for acme; beta has a my-thread of its own.
    assert "acme's secret plan" in await _history(rest, "acme", "my-thread")
    mine = await rest.post("/v1/sessions", json={"sessionId": "my-thread"}, headers=_auth("beta"))
    assert mine.status_code == 200, mine.text
    await _turn(rest, "beta", "my-thread", "beta's own words")
    beta_history = await _history(rest, "beta", "my-thread")
    assert "beta's own words" in beta_history and "secret" not in beta_history
    assert "beta's own words" not in await _history(rest, "acme", "my-thread")


async def test_every_grpc_method_keeps_principals_apart_on_any_server(tenants: Tenants) -> None:
    targets = [tenants.edge, *(s.address for s in tenants.servers)]
    async with AsyncClient(targets[1], api_key=KEYS["acme"]) as acme:
        session = await acme.create_session(agent="probe")
        sid = session.session_id
        stream = aiter(acme.stream_turn(sid, "held open", metadata={"gate": f"grpc-{sid}"}))
        first = await anext(stream)
        turn_id = first.run_id
        for target in targets:
            async with AsyncClient(target, api_key=KEYS["beta"]) as beta:
                with pytest.raises(NotFoundError):
                    await beta.get_session(sid)
                with pytest.raises(NotFoundError):
                    await beta.history(sid)
                with pytest.raises(NotFoundError):
                    await beta.send(sid, "let me in")
                with pytest.raises(NotFoundError):
                    await beta.cancel_turn(sid, turn_id)
                with pytest.raises(NotFoundError):
                    await beta.fork_session(sid)
                with pytest.raises(NotFoundError):
                    async for _ in beta.subscribe(sid, turn_id):
                        pass
                assert await beta.delete_session(sid) is False
                listed = await beta.list_sessions(page_size=100)
                assert sid not in [s.session_id for s in listed.sessions]
                # Asking for another principal is for admins only.
                with pytest.raises(PermissionDeniedError):
                    await beta.get_session(sid, principal="acme")
        # The turn ran on, untouched, and its agent was told whose it is.
        (tenants.mesh.probe_dir / f"gate-grpc-{sid}").write_text("open")
        events = [first, *[e async for e in stream]]
        assert events[-1].type == event_pb2.RUN_FINISHED
        who = (tenants.mesh.probe_dir / f"{turn_id}.who").read_text()
        assert who == f"acme acme/{sid}"
        assert sid in [s.session_id for s in (await acme.list_sessions()).sessions]


async def test_compatibility_surfaces_resolve_ids_within_the_callers_principal(
    rest: httpx.AsyncClient,
) -> None:
    chat = {"model": "echo", "messages": [{"role": "user", "content": "acme chat secret"}]}
    first = await rest.post(
        "/v1/chat/completions", json=chat, headers={**_auth("acme"), "X-Session-Id": "chat-1"}
    )
    assert first.status_code == 200, first.text
    chat["messages"] = [{"role": "user", "content": "beta asks"}]
    other = await rest.post(
        "/v1/chat/completions", json=chat, headers={**_auth("beta"), "X-Session-Id": "chat-1"}
    )
    assert other.status_code == 200, other.text
    assert "acme chat secret" not in other.text
    assert "acme chat secret" not in await _history(rest, "beta", "chat-1")
    assert "beta asks" not in await _history(rest, "acme", "chat-1")

    made = await rest.post(
        "/v1/responses",
        json={"model": "echo", "input": "acme response secret"},
        headers=_auth("acme"),
    )
    assert made.status_code == 200, made.text
    response_id = made.json()["id"]
    assert (
        await rest.get(f"/v1/responses/{response_id}", headers=_auth("acme"))
    ).status_code == 200
    stolen = await rest.get(f"/v1/responses/{response_id}", headers=_auth("beta"))
    assert stolen.status_code == 404 and "secret" not in stolen.text
    follow = await rest.post(
        "/v1/responses",
        json={"model": "echo", "input": "and then?", "previous_response_id": response_id},
        headers=_auth("beta"),
    )
    assert follow.status_code == 404 and "secret" not in follow.text
    item = made.json()["output"][0]["id"]
    referenced = await rest.post(
        "/v1/responses",
        json={
            "model": "echo",
            "input": [
                {"role": "user", "content": "hi"},
                {"type": "item_reference", "id": item},
                {"role": "user", "content": "what did you say?"},
            ],
        },
        headers=_auth("beta"),
    )
    assert referenced.status_code == 404 and "secret" not in referenced.text

    run = {
        "threadId": "ag-1",
        "runId": "r1",
        "messages": [{"id": "m1", "role": "user", "content": "acme agui secret"}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
    }
    assert (await rest.post("/v1/agui", json=run, headers=_auth("acme"))).status_code == 200
    run["messages"] = [{"id": "m2", "role": "user", "content": "beta agui"}]
    theirs = await rest.post("/v1/agui", json=run, headers=_auth("beta"))
    assert theirs.status_code == 200 and "acme agui secret" not in theirs.text
    assert "acme agui secret" not in await _history(rest, "beta", "ag-1")

    simple = await rest.post(
        "/v1/chat",
        json={"message": "acme simple secret", "agentName": "echo"},
        headers=_auth("acme"),
    )
    assert simple.status_code == 200, simple.text
    acme_sid = simple.json()["session_id"]
    reused = await rest.post(
        "/v1/chat", json={"message": "beta simple", "session_id": acme_sid}, headers=_auth("beta")
    )
    assert reused.status_code == 200, reused.text
    assert reused.json()["session_id"] != acme_sid  # a session of beta's own, not acme's
    assert "acme simple secret" not in reused.text


async def test_admins_read_any_principals_sessions_and_are_logged(
    rest: httpx.AsyncClient, tenants: Tenants
) -> None:
    created = await rest.post(
        "/v1/sessions", json={"sessionId": "support-me", "agentName": "echo"}, headers=_auth("acme")
    )
    assert created.status_code == 200
    await _turn(rest, "acme", "support-me", "please help with invoice 42")
    ops = _auth("ops")
    got = await rest.get("/v1/sessions/support-me", params={"principal": "acme"}, headers=ops)
    assert got.status_code == 200 and got.json()["session"]["sessionId"] == "support-me"
    assert "invoice 42" in await _history(rest, "ops", "support-me", principal="acme")
    listed = await rest.get(
        "/v1/sessions", params={"principal": "acme", "pageSize": 100}, headers=ops
    )
    assert "support-me" in [s["sessionId"] for s in listed.json()["sessions"]]
    # Reading only: a turn or a delete acts in the admin's own namespace.
    assert (await rest.get("/v1/sessions/support-me", headers=ops)).status_code == 404
    refused = await rest.post("/v1/sessions/support-me/turns", json={"message": "x"}, headers=ops)
    assert refused.status_code == 404
    # Anyone else naming a principal is refused, whether or not it exists.
    for principal in ("acme", "nobody"):
        denied = await rest.get(
            "/v1/sessions/support-me", params={"principal": principal}, headers=_auth("beta")
        )
        assert denied.status_code == 403
    await until(
        lambda: (
            "admin ops read a history of principal acme"
            in "".join(s.log() for s in tenants.servers)
        ),
        what="the admin's read in a server's log",
    )


async def test_principal_headers_from_outside_are_never_believed(
    rest: httpx.AsyncClient, tenants: Tenants
) -> None:
    created = await rest.post(
        "/v1/sessions", json={"sessionId": "forge-me", "agentName": "echo"}, headers=_auth("acme")
    )
    assert created.status_code == 200
    forged = {"x-turnmesh-principal": "acme admin", "x-turnmesh-forwarded": "server-x"}
    through_envoy = await rest.get("/v1/sessions/forge-me", headers={**_auth("beta"), **forged})
    assert through_envoy.status_code == 404
    # Straight at a server, past Envoy: the key decides; a guessed mesh key fails.
    channel = insecure_channel(tenants.servers[0].address)
    stub = SessionServiceStub(channel)
    request = spb.GetSessionRequest(session_id="forge-me")
    try:
        for metadata, code in [
            (
                (("authorization", f"Bearer {KEYS['beta']}"), *forged.items()),
                grpc.StatusCode.NOT_FOUND,
            ),
            (tuple(forged.items()), grpc.StatusCode.UNAUTHENTICATED),
            ((("x-turnmesh-mesh-key", "guess"), *forged.items()), grpc.StatusCode.UNAUTHENTICATED),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await stub.GetSession(request, metadata=metadata, timeout=10)
            assert failed.value.code() == code
    finally:
        await channel.close()


async def test_listing_pages_hold_under_concurrent_creates_and_deletes(
    rest: httpx.AsyncClient,
) -> None:
    """Sessions spread over both servers (memory stores: the listing asks
    each); pages of 7 while others come and go: every session that lived
    throughout is listed once, in order, and nothing twice."""
    pager = _auth("pager")

    async def create(sid: str, team: str) -> None:
        made = await rest.post(
            "/v1/sessions",
            json={"sessionId": sid, "agentName": "echo", "metadata": {"team": team}},
            headers=pager,
        )
        assert made.status_code == 200, made.text

    stable = [f"p-{i:02d}" for i in range(30)]
    doomed = [f"d-{i:02d}" for i in range(10)]
    for i, sid in enumerate(stable):
        await create(sid, "red" if i % 3 == 0 else "blue")
        if i < len(doomed):
            await create(doomed[i], "blue")

    async def churn() -> None:
        for i, sid in enumerate(doomed):
            await create(f"n-{i:02d}", "red")
            deleted = await rest.delete(f"/v1/sessions/{sid}", headers=pager)
            assert deleted.status_code == 200

    listed: list[dict[str, str]] = []
    token = ""
    churning = asyncio.create_task(churn())
    for _ in range(50):
        page = await rest.get(
            "/v1/sessions", params={"pageSize": 7, "pageToken": token}, headers=pager
        )
        assert page.status_code == 200, page.text
        body = page.json()
        assert len(body.get("sessions", [])) <= 7
        listed += body.get("sessions", [])
        token = body.get("nextPageToken", "")
        if not token:
            break
        await asyncio.sleep(0)
    await churning
    ids = [s["sessionId"] for s in listed]
    assert len(ids) == len(set(ids)), "a session was listed twice"
    assert [i for i in ids if i.startswith("p-")] == stable[::-1]
    times = [s["createdAt"] for s in listed]
    assert times == sorted(times, reverse=True)

    # Filters: by metadata and by agent, and a bad token is a clear 400.
    red = await rest.get(
        "/v1/sessions", params={"metadata": "team=red", "pageSize": 100}, headers=pager
    )
    red_ids = {s["sessionId"] for s in red.json()["sessions"]}
    assert {s for s in red_ids if s.startswith("p-")} == {
        s for i, s in enumerate(stable) if i % 3 == 0
    }
    none = await rest.get("/v1/sessions", params={"agentName": "demo"}, headers=pager)
    assert none.status_code == 200 and none.json().get("sessions", []) == []
    bad = await rest.get("/v1/sessions", params={"pageToken": "not-a-token"}, headers=pager)
    assert bad.status_code == 400 and "page_token" in bad.text
    big = await rest.get("/v1/sessions", params={"pageSize": 101}, headers=pager)
    assert big.status_code == 400


async def test_quotas_are_per_principal(mesh_factory: Mesh, tmp_path: Path) -> None:
    keys = _keys_file(tmp_path / "keys")
    mesh = mesh_factory
    mesh.common_args = ("--mesh-key", MESH_KEY)
    mesh.start_router()
    worker = mesh.spawn_worker("worker-probe", "probe_agent:ProbeAgent")
    server = mesh.spawn_server(
        "server",
        "--api-keys-file",
        str(keys),
        "--max-sessions-per-principal",
        "2",
        "--max-turns-per-principal",
        "1",
        "--agent",
        "probe",
        "--metrics-port",
        "0",
        "--metrics-principal-label",
    )
    mesh.wait_ready(worker, server)
    envoy = mesh.start_envoy([server])
    async with httpx.AsyncClient(base_url=f"http://{envoy.listener_address}", timeout=60) as rest:
        for sid in ("q1", "q2"):
            made = await rest.post("/v1/sessions", json={"sessionId": sid}, headers=_auth("acme"))
            assert made.status_code == 200, made.text
        full = await rest.post("/v1/sessions", json={"sessionId": "q3"}, headers=_auth("acme"))
        assert full.status_code == 429
        assert full.json()["reason"] == "SESSION_QUOTA_EXCEEDED"
        assert int(full.headers["retry-after"]) > 0
        # A2A over JSON-RPC: the same 429 and Retry-After, with a JSON-RPC error.
        message = {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "x"}]}
        call = {"jsonrpc": "2.0", "id": 7, "method": "SendMessage", "params": {"message": message}}
        rpc = await rest.post("/probe/jsonrpc", json=call, headers=_auth("acme"))
        assert rpc.status_code == 429, rpc.text
        assert int(rpc.headers["retry-after"]) > 0
        assert (rpc.json()["id"], rpc.json()["error"]["code"]) == (7, -32058)
        assert rpc.json()["error"]["data"][0]["reason"] == "SESSION_QUOTA_EXCEEDED"
        keyless = await rest.post("/probe/jsonrpc", json=call)
        assert keyless.status_code == 401
        assert keyless.json()["error"]["code"] == -32066
        assert (await rest.post("/v1/sessions", json={}, headers=_auth("beta"))).status_code == 200
        assert (await rest.delete("/v1/sessions/q2", headers=_auth("acme"))).status_code == 200
        again = await rest.post("/v1/sessions", json={"sessionId": "q3"}, headers=_auth("acme"))
        assert again.status_code == 200

        async with AsyncClient(envoy.listener_address, api_key=KEYS["acme"]) as acme:
            held = aiter(acme.stream_turn("q1", "hold", metadata={"gate": "quota"}))
            await anext(held)
            busy = await rest.post(
                "/v1/sessions/q3/turns", json={"message": "second"}, headers=_auth("acme")
            )
            assert busy.status_code == 429
            assert busy.json()["reason"] == "TURN_QUOTA_EXCEEDED"
            assert int(busy.headers["retry-after"]) > 0
            beta_sid = (await rest.post("/v1/sessions", json={}, headers=_auth("beta"))).json()
            ok = await rest.post(
                f"/v1/sessions/{beta_sid['session']['sessionId']}/turns",
                json={"message": "mine", "metadata": {"deltas": 1}},
                headers=_auth("beta"),
            )
            assert ok.status_code == 200 and "RUN_FINISHED" in ok.text
            (mesh.probe_dir / "gate-quota").write_text("open")
            assert [e async for e in held][-1].type == event_pb2.RUN_FINISHED
        after = await rest.post(
            "/v1/sessions/q3/turns",
            json={"message": "now", "metadata": {"deltas": 1}},
            headers=_auth("acme"),
        )
        assert after.status_code == 200 and "RUN_FINISHED" in after.text
        # Asked for (--metrics-principal-label): turns by principal.
        metrics = (await rest.get(f"http://{server.info['metrics_address']}/metrics")).text
    assert 'turnmesh_principal_turns_total{outcome="finished",principal="acme"} 2.0' in metrics
    assert 'turnmesh_principal_turns_total{outcome="finished",principal="beta"} 1.0' in metrics
    with pytest.raises(UnauthenticatedError):
        async with AsyncClient(envoy.listener_address, api_key="no-such-key") as stranger:
            await stranger.list_sessions()


FORGED_HEADERS = [
    "x-turnmesh-principal",
    "x-turnmesh-forwarded",
    "x-turnmesh-mesh-key",
    "x-turnmesh-internal",
]


def test_forged_mesh_metadata_never_crosses_principals(tenants: Tenants) -> None:
    """Fuzzed: any value of any mesh-internal header, through Envoy or
    straight at a server, never reads another principal's session."""
    with httpx.Client(base_url=f"http://{tenants.edge}", timeout=30) as rest:
        made = rest.post("/v1/sessions", json={"sessionId": "fuzz-target"}, headers=_auth("acme"))
        assert made.status_code == 200
        channel = grpc.insecure_channel(tenants.servers[1].address)
        stub = SessionServiceStub(channel)
        values = st.one_of(
            st.sampled_from(["acme", "acme admin", "ops admin", MESH_KEY[:-1], "", "a/b"]),
            st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=40),
        )

        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
        @given(headers=st.dictionaries(st.sampled_from(FORGED_HEADERS), values, min_size=1))
        def hit(headers: dict[str, str]) -> None:
            answer = rest.get(
                "/v1/sessions/fuzz-target/history", headers={**_auth("beta"), **headers}
            )
            assert answer.status_code == 404, answer.text
            metadata = (("authorization", f"Bearer {KEYS['beta']}"), *headers.items())
            with pytest.raises(grpc.RpcError) as refused:
                stub.GetHistory(
                    spb.GetHistoryRequest(session_id="fuzz-target"), metadata=metadata, timeout=30
                )
            code = refused.value.code()
            assert code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAUTHENTICATED)

        try:
            hit()
        finally:
            channel.close()


async def _two_tenants_talk(target: str, sid: str) -> None:
    """acme and beta each hold a session called ``sid`` and say something."""
    for who in ("acme", "beta"):
        async with AsyncClient(target, api_key=KEYS[who]) as client:
            await client.create_session(sid, agent="echo")
            await client.send(sid, f"{who} says hello")


async def _list_when_whole(client: AsyncClient) -> spb.ListSessionsResponse:
    """A listing, retried while a dead server is still listed by the router
    (the listing refuses to skip a server it cannot reach: UNAVAILABLE)."""
    for _ in range(200):
        try:
            return await client.list_sessions(page_size=100)
        except UnavailableError:
            await asyncio.sleep(0.1)
    raise AssertionError("the listing stayed unavailable")


async def _each_sees_only_its_own(target: str, sid: str) -> None:
    for who, other in (("acme", "beta"), ("beta", "acme")):
        async with AsyncClient(target, api_key=KEYS[who]) as client:
            said = " ".join(m.content for m in await client.history(sid))
            assert f"{who} says hello" in said and other not in said
            listed = [s.session_id for s in (await _list_when_whole(client)).sessions]
            assert listed.count(sid) == 1


async def test_isolation_survives_a_sqlite_server_restart(
    mesh_factory: Mesh, tmp_path: Path
) -> None:
    keys = _keys_file(tmp_path / "keys")
    mesh = mesh_factory
    mesh.common_args = ("--mesh-key", MESH_KEY)
    mesh.start_router()
    worker = mesh.spawn_worker("worker-echo", "echo")
    flags = ("--store", f"sqlite:{tmp_path / 'sessions.db'}", "--api-keys-file", str(keys))
    first = mesh.spawn_server("server-a", *flags)
    mesh.wait_ready(worker, first)
    await _two_tenants_talk(first.address, "same-name")
    mesh.kill(first)  # SIGKILL: nothing is flushed on the way out
    second = mesh.spawn_server("server-b", *flags)
    mesh.wait_ready(second)
    await _each_sees_only_its_own(second.address, "same-name")


async def test_isolation_survives_failover_on_a_shared_store(
    mesh_factory: Mesh, tmp_path: Path, shared_store: str
) -> None:
    keys = _keys_file(tmp_path / "keys")
    mesh = mesh_factory
    mesh.common_args = ("--mesh-key", MESH_KEY)
    router = mesh.start_router()
    worker = mesh.spawn_worker("worker-echo", "echo")
    flags = ("--store", shared_store, "--lease-seconds", "2", "--api-keys-file", str(keys))
    servers = [mesh.spawn_server(f"server-{i}", *flags) for i in (1, 2)]
    mesh.wait_ready(worker, *servers)
    sid = f"failover-{uuid.uuid4().hex[:8]}"
    await _two_tenants_talk(servers[1].address, sid)
    async with insecure_channel(router.address) as channel:
        route = await RouterServiceStub(channel).Route(
            rpb.RouteRequest(session_id=f"acme/{sid}", lookup_only=True),
            metadata=(("x-turnmesh-mesh-key", MESH_KEY),),
        )
    owner = next(s for s in servers if s.member_id == route.owner.member_id)
    survivor = next(s for s in servers if s is not owner)
    mesh.kill(owner)
    await _each_sees_only_its_own(survivor.address, sid)


async def test_isolation_with_mutual_tls_and_no_mesh_key(
    mesh_factory: Mesh, tmp_path: Path
) -> None:
    """With mTLS alone, a forwarded call (native or from a compatibility
    surface) carries the caller's key, and the owner reads the principal
    from it: the same isolation as with a mesh key."""
    keys = _keys_file(tmp_path / "keys")
    ca = TestCA(tmp_path / "ca")
    mesh = mesh_factory
    router = mesh.spawn("router", "router", *ca.issue("router").flags())
    mesh.wait_ready(router)
    mesh.router = router
    worker = mesh.spawn(
        "worker", "worker", "--router", router.address, "--agent", "echo", *ca.issue("w").flags()
    )
    servers = [
        mesh.spawn(
            f"server-{i}",
            "server",
            "--router",
            router.address,
            "--agent",
            "echo",
            "--api-keys-file",
            str(keys),
            *ca.issue(f"server-{i}").flags(),
        )
        for i in (1, 2)
    ]
    mesh.wait_ready(worker, *servers)
    operator = ca.issue("operator")
    credentials = grpc.ssl_channel_credentials(
        ca.ca_file.read_bytes(), operator.key_file.read_bytes(), operator.cert_file.read_bytes()
    )
    first, second = (s.address for s in servers)
    async with (
        AsyncClient(first, credentials=credentials, api_key=KEYS["acme"]) as acme,
        AsyncClient(second, credentials=credentials, api_key=KEYS["acme"]) as acme_elsewhere,
        AsyncClient(second, credentials=credentials, api_key=KEYS["beta"]) as beta,
    ):
        # Four sessions: round-robin placement puts some on each server, so
        # calls through the other one are forwarded.
        sids = [(await acme.create_session()).session_id for _ in range(4)]
        for sid in sids:
            await acme_elsewhere.send(sid, f"acme on {sid}")
            with pytest.raises(NotFoundError):
                await beta.history(sid)
        channel = grpc.aio.secure_channel(first, credentials)
        compat = CompatServiceStub(channel)
        try:
            for sid, who in itertools.product(sids, ("acme", "beta")):
                answer = await compat.Chat(
                    cpb.ChatRequest(message="and?", session_id=sid),
                    metadata=(("authorization", f"Bearer {KEYS[who]}"),),
                    timeout=30,
                )
                # acme continues its session; beta gets one of its own.
                assert (answer.session_id == sid) == (who == "acme")
        finally:
            await channel.close()
        listed = {s.session_id for s in (await beta.list_sessions(page_size=100)).sessions}
        assert not listed & set(sids)


class _Key(CredentialService):
    """The principal's API key, for the scheme the agent card names."""

    def __init__(self, principal: str) -> None:
        self._key = KEYS[principal]

    async def get_credentials(self, security_scheme_name: str, context: object) -> str | None:
        return self._key if security_scheme_name == "bearer" else None


@pytest.mark.parametrize("binding", ["HTTP+JSON", "GRPC", "JSONRPC"])
async def test_a2a_tasks_are_their_principals_own(
    tenants: Tenants, rest: httpx.AsyncClient, binding: str
) -> None:
    """A2A on a keyed mesh: the card is open and names the bearer scheme
    (the real a2a-sdk client sends the key from it); another principal's
    task is not found, and a context id is each principal's own."""
    card = await rest.get("/echo/.well-known/agent-card.json")  # no key
    assert card.status_code == 200, card.text
    scheme = card.json()["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]
    assert scheme["scheme"] == "Bearer"

    made: list[Client] = []

    async def client(who: str, streaming: bool = False) -> Client:
        config = ClientConfig(
            streaming=streaming,
            httpx_client=rest,
            grpc_channel_factory=grpc.aio.insecure_channel,
            supported_protocol_bindings=[binding],
        )
        created = await ClientFactory(config).create_from_url(
            f"http://{tenants.edge}/echo", interceptors=[AuthInterceptor(_Key(who))]
        )
        made.append(created)
        return created

    acme, beta = await client("acme"), await client("beta")
    context_id = f"a2a-{uuid.uuid4()}"

    def sent(text: str) -> a2a_pb2.SendMessageRequest:
        message = a2a_pb2.Message(
            message_id=str(uuid.uuid4()), context_id=context_id, role=a2a_pb2.ROLE_USER
        )
        message.parts.add(text=text)
        return a2a_pb2.SendMessageRequest(message=message)

    (answered,) = [r async for r in acme.send_message(sent("acme's secret"))]
    task = answered.task
    assert task.status.state == a2a_pb2.TASK_STATE_COMPLETED
    with pytest.raises(TaskNotFoundError):
        await beta.get_task(a2a_pb2.GetTaskRequest(id=task.id))
    with pytest.raises(TaskNotFoundError):
        await beta.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))
    with pytest.raises(TaskNotFoundError):
        async for _ in (await client("beta", streaming=True)).subscribe(
            a2a_pb2.SubscribeToTaskRequest(id=task.id)
        ):
            pass
    # The same context id is beta's own session: nothing of acme's in it.
    (theirs,) = [r async for r in beta.send_message(sent("beta here"))]
    assert theirs.task.context_id == context_id and theirs.task.id != task.id
    assert "acme" not in str(theirs.task)
    assert (await acme.get_task(a2a_pb2.GetTaskRequest(id=task.id))).id == task.id
    # No key: refused before anything runs.
    keyless = await ClientFactory(
        ClientConfig(
            streaming=False,
            httpx_client=rest,
            grpc_channel_factory=grpc.aio.insecure_channel,
            supported_protocol_bindings=[binding],
        )
    ).create_from_url(f"http://{tenants.edge}/echo")
    made.append(keyless)
    with pytest.raises(A2AClientError):
        await keyless.get_task(a2a_pb2.GetTaskRequest(id=task.id))
    for created in made:
        await created.close()
