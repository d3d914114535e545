"""Hostile input, generated: malformed bodies at every REST path through Envoy
and hostile field values at every gRPC method. Nothing answers 5xx (or
INTERNAL/UNKNOWN), no process dies, and no history changes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import grpc
import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import SharedMesh
from turnmesh.runtime import sanitize
from turnmesh.runtime.serving import CHANNEL_OPTIONS
from turnmesh.v1 import compat_service_pb2 as cpb
from turnmesh.v1 import session_service_pb2 as spb
from turnmesh.v1.compat_service_pb2_grpc import CompatServiceStub
from turnmesh.v1.session_service_pb2_grpc import SessionServiceStub

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

hostile_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        ["../../etc/passwd", "..%2F..", "a b", "%00", "\u202e", "🙂" * 50, "x" * 20_000, ""]
    ),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | hostile_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(hostile_text, children, max_size=4)
    ),
    max_leaves=20,
)


def deep(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"nested": [value]}
    return value


def _odd_body(field: str, value: str) -> bytes:
    message = f'{{"role": "user", "content": {value}}}'
    return f'{{"{field}": {value}, "messages": [{message}]}}'.encode()


bodies = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(
        st.sampled_from(
            [
                "message",
                "session_id",
                "sessionId",
                "files",
                "policy",
                "metadata",
                "model",
                "messages",
                "input",
                "threadId",
                "stream",
                "idempotencyKey",
                "agentName",
            ]
        ),
        json_values,
        max_size=6,
    ).map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200),  # not JSON, often not UTF-8
    st.integers(min_value=10, max_value=200).map(lambda d: json.dumps(deep(d)).encode()),
    # Lone surrogates, and the wrong JSON type where the surfaces want another.
    st.tuples(
        st.sampled_from(["message", "input", "content", "threadId", "model", "messages"]),
        st.sampled_from(['"\\ud800"', '"a\\udfffb"', "[]", "{}", "1e999", "null"]),
    ).map(lambda pair: _odd_body(*pair)),
)

ROUTES = [
    ("POST", "/v1/sessions"),
    ("GET", "/v1/sessions"),
    ("GET", "/v1/sessions/{id}"),
    ("DELETE", "/v1/sessions/{id}"),
    ("GET", "/v1/sessions/{id}/history"),
    ("POST", "/v1/sessions/{id}/turns"),
    ("POST", "/v1/sessions/{id}/turns/{id}:cancel"),
    ("GET", "/v1/sessions/{id}/turns/{id}/events"),
    ("POST", "/v1/chat"),
    ("POST", "/v1/chat:stream"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/responses"),
    ("GET", "/v1/responses/{id}"),
    ("POST", "/v1/agui"),
]


def _canary(shared_mesh: SharedMesh) -> tuple[str, list[Any]]:
    with httpx.Client(base_url=f"http://{shared_mesh.edge}", timeout=30) as rest:
        sid = rest.post("/v1/sessions", json={"agentName": "echo"}).json()["session"]["sessionId"]
        rest.post(f"/v1/sessions/{sid}/turns", json={"message": "canary"}).read()
        return sid, rest.get(f"/v1/sessions/{sid}/history").json()["messages"]


def _all_alive(shared_mesh: SharedMesh) -> None:
    for component in shared_mesh.mesh.components:
        assert component.proc.poll() is None, f"{component.name} died:\n{component.log()[-2000:]}"
    assert shared_mesh.envoy.proc.poll() is None


def test_rest_paths_survive_hostile_bodies(shared_mesh: SharedMesh) -> None:
    canary, before = _canary(shared_mesh)
    with httpx.Client(base_url=f"http://{shared_mesh.edge}", timeout=30) as rest:

        @FUZZ
        @given(
            route=st.sampled_from(ROUTES),
            ident=hostile_text,
            body=bodies,
            after=st.integers(min_value=-(2**40), max_value=2**40),
            content_type=st.sampled_from(["application/json", "text/plain"]),
        )
        def hit(
            route: tuple[str, str], ident: str, body: bytes, after: int, content_type: str
        ) -> None:
            method, template = route
            path = template.replace("{id}", quote(ident or "x", safe=""))
            params: dict[str, str] | None = None
            if path.endswith("/events"):
                params = {"after_seq": str(after)}
            elif method == "GET" and path.startswith("/v1/sessions"):
                # Listing's and admin reads' query fields, hostile too.
                params = {"pageToken": ident, "pageSize": str(after), "principal": ident}
                if path == "/v1/sessions":
                    # Shorter: four 20,000-character values pass httpx's URL limit.
                    params |= {"metadata": ident[:1000], "agentName": ident[:1000]}
            response = rest.request(
                method,
                path,
                content=body if method == "POST" else None,
                params=params,
                headers={"content-type": content_type},
            )
            assert response.status_code < 500, (method, path, response.status_code, response.text)
            assert not sanitize.is_internal(response.text), response.text[:500]

        hit()
        assert rest.get(f"/v1/sessions/{canary}/history").json()["messages"] == before
    _all_alive(shared_mesh)


BAD_CODES = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}


def test_grpc_methods_survive_hostile_fields(shared_mesh: SharedMesh) -> None:
    canary, before = _canary(shared_mesh)
    address = shared_mesh.servers[0].address
    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    sessions = SessionServiceStub(channel)
    compat = CompatServiceStub(channel)
    calls: dict[str, Callable[[str, int], object]] = {
        "CreateSession": lambda t, n: sessions.CreateSession(
            spb.CreateSessionRequest(session_id=t, agent_name=t), timeout=30
        ),
        "GetSession": lambda t, n: sessions.GetSession(
            spb.GetSessionRequest(session_id=t, principal=t if n % 2 else ""), timeout=30
        ),
        "ListSessions": lambda t, n: sessions.ListSessions(
            spb.ListSessionsRequest(
                page_size=n, page_token=t, agent_name=t, metadata=[t, f"{t}={t}"], principal=t
            ),
            timeout=30,
        ),
        "DeleteSession": lambda t, n: sessions.DeleteSession(
            spb.DeleteSessionRequest(session_id=t + "-fuzz"), timeout=30
        ),
        "GetHistory": lambda t, n: sessions.GetHistory(
            spb.GetHistoryRequest(session_id=t, principal=t), timeout=30
        ),
        "Turn": lambda t, n: list(
            sessions.Turn(
                spb.TurnRequest(
                    session_id=t,
                    message=t,
                    policy=n,  # type: ignore[arg-type]  # any int, on purpose
                    on_disconnect=n,  # type: ignore[arg-type]  # any int, on purpose
                ),
                timeout=30,
            )
        ),
        "CancelTurn": lambda t, n: sessions.CancelTurn(
            spb.CancelTurnRequest(session_id=t, turn_id=t), timeout=30
        ),
        "SubscribeTurn": lambda t, n: list(
            sessions.SubscribeTurn(
                spb.SubscribeTurnRequest(session_id=t, turn_id=t, after_seq=n), timeout=30
            )
        ),
        "Chat": lambda t, n: compat.Chat(cpb.ChatRequest(message=t, session_id=t), timeout=30),
        "GetResponse": lambda t, n: compat.GetResponse(
            cpb.GetResponseRequest(response_id=t), timeout=30
        ),
    }

    @FUZZ
    @given(
        name=st.sampled_from(sorted(calls)),
        text=hostile_text,
        number=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    )
    def hit(name: str, text: str, number: int) -> None:
        error: Any = None
        try:
            calls[name](text, number)
        except grpc.RpcError as exc:
            error = exc
        if error is not None:
            assert error.code() not in BAD_CODES, (name, text[:80], number, error.details())
            assert not sanitize.is_internal(error.details() or ""), error.details()

    try:
        hit()
    finally:
        channel.close()
    with httpx.Client(base_url=f"http://{shared_mesh.edge}", timeout=30) as rest:
        assert rest.get(f"/v1/sessions/{canary}/history").json()["messages"] == before
    _all_alive(shared_mesh)
