"""Every row of the error table, round-tripped through every surface.

A session service that raises the row's error sits behind the real error
interceptor, the real compatibility surfaces (which call it in-process, as
they call their own server's) and the real Envoy. Each row must come out as the table
says: the same gRPC status and client exception natively, the table's HTTP
status, problem type and title over REST, OpenAI's error type on OpenAI's
paths, and Retry-After wherever the row asks for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from a2a.types import a2a_pb2_grpc

from turnmesh.client import AsyncClient, TurnmeshClientError
from turnmesh.client.errors import client_class
from turnmesh.envoy import EdgeConfig
from turnmesh.envoy.process import RunningEnvoy, write_config
from turnmesh.envoy.process import start as start_envoy
from turnmesh.runtime import errors
from turnmesh.runtime.serving import GrpcProcess
from turnmesh.server.compat import CompatServicer, Mesh, Models
from turnmesh.server.compat.a2a import A2AServicer, AgentCards, PushNotifications
from turnmesh.server.stores.memory import MemoryStore
from turnmesh.v1 import compat_service_pb2_grpc, session_service_pb2_grpc
from turnmesh.v1 import session_service_pb2 as spb

pytestmark = pytest.mark.integration

SESSION_SERVICE = spb.DESCRIPTOR.services_by_name["SessionService"].full_name


def _error(kind: type[errors.TurnmeshError]) -> errors.TurnmeshError:
    if issubclass(kind, errors.InvalidArgument):
        return kind([errors.FieldViolation("message", "must not be blank")])
    if issubclass(kind, errors.HistoryMiss):
        return errors.HistoryMiss("s")
    return kind(f"the {kind.__name__} row")


class RaisingSessions(session_service_pb2_grpc.SessionServiceServicer):
    """Every session call raises the error the test chose; readiness works."""

    def __init__(self) -> None:
        self.error: errors.TurnmeshError = errors.TurnmeshError("unset")

    async def GetReadiness(
        self, request: spb.GetReadinessRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> spb.GetReadinessResponse:
        return spb.GetReadinessResponse(ready=True, status=spb.LIFECYCLE_STATE_READY)

    def _raise(self, *args: object) -> Any:
        raise self.error

    async def GetSession(self, *args: object) -> spb.GetSessionResponse:
        return self._raise()  # type: ignore[no-any-return]

    async def CreateSession(self, *args: object) -> spb.CreateSessionResponse:
        return self._raise()  # type: ignore[no-any-return]

    async def GetHistory(self, *args: object) -> spb.GetHistoryResponse:
        return self._raise()  # type: ignore[no-any-return]

    async def DeleteSession(self, *args: object) -> spb.DeleteSessionResponse:
        return self._raise()  # type: ignore[no-any-return]

    async def ForkSession(self, *args: object) -> spb.ForkSessionResponse:
        return self._raise()  # type: ignore[no-any-return]

    async def GetHealth(self, *args: object) -> spb.GetHealthResponse:
        return self._raise()  # type: ignore[no-any-return]

    async def get_task_record(self, *args: object) -> str:
        return self._raise()  # type: ignore[no-any-return]

    async def put_task_record(self, *args: object) -> bool:
        return self._raise()  # type: ignore[no-any-return]

    async def list_task_records(self, *args: object) -> dict[str, Any]:
        return self._raise()  # type: ignore[no-any-return]

    async def StartTurn(self, *args: object) -> spb.StartTurnResponse:
        return self._raise()  # type: ignore[no-any-return]

    async def GetTurn(self, *args: object) -> spb.GetTurnResponse:
        return self._raise()  # type: ignore[no-any-return]

    async def CancelTurn(self, *args: object) -> spb.CancelTurnResponse:
        return self._raise()  # type: ignore[no-any-return]

    async def Turn(self, *args: object) -> AsyncGenerator[Any, None]:
        self._raise()
        yield  # pragma: no cover

    async def SubscribeTurn(self, *args: object) -> AsyncGenerator[Any, None]:
        self._raise()
        yield  # pragma: no cover

    async def turn_batches(self, *args: object) -> AsyncGenerator[Any, None]:
        return self._raise()  # type: ignore[no-any-return]


@dataclass
class Edge:
    sessions: RaisingSessions
    envoy: RunningEnvoy

    @property
    def address(self) -> str:
        return self.envoy.listener_address


@pytest.fixture(scope="module")
async def edge(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Edge]:
    workdir: Path = tmp_path_factory.mktemp("error-table")
    # Abstract only in the mypy-protobuf stubs: at runtime the calls it does not
    # define answer UNIMPLEMENTED, as they should here.
    sessions = RaisingSessions()  # type: ignore[abstract]
    mesh = Mesh()
    a2a = A2AServicer(mesh, PushNotifications(MemoryStore(), lambda _: True, None, 60.0))
    compat = CompatServicer(
        mesh,
        Models(lambda: ["demo"]),
        AgentCards(lambda: ["demo"], "demo", lambda: False, "0"),
        a2a,
    )

    def register(server: grpc.aio.Server) -> None:
        session_service_pb2_grpc.add_SessionServiceServicer_to_server(sessions, server)
        compat_service_pb2_grpc.add_CompatServiceServicer_to_server(compat, server)
        a2a_pb2_grpc.add_A2AServiceServicer_to_server(  # type: ignore[no-untyped-call]
            a2a, server
        )

    process = GrpcProcess(
        host="127.0.0.1", port=0, service_names=[SESSION_SERVICE], register=register
    )
    await process.start()
    await process.set_serving(True)
    mesh.connect(sessions)
    config = write_config(
        EdgeConfig(
            upstreams=[process.address],
            port=0,
            admin_port=0,
            playground=None,
            api_keys=False,  # no keys here
        ),
        workdir / "envoy.json",
    )
    with (workdir / "envoy.log").open("wb") as log:
        envoy = await asyncio.to_thread(start_envoy, config, workdir, stdout=log)
    try:
        async with httpx.AsyncClient(base_url=f"http://{envoy.listener_address}") as http:
            for _ in range(500):  # Envoy's first health check marks the server healthy
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get("/ready")).status_code == 200:
                        break
                await asyncio.sleep(0.05)
        yield Edge(sessions, envoy)
    finally:
        envoy.proc.terminate()
        await asyncio.to_thread(envoy.proc.wait, 10)
        await mesh.close()
        await process.stop(grace=0)


ROWS = [(row.name, row) for row in errors.rows()]


@pytest.mark.parametrize(("name", "row"), ROWS, ids=[name for name, _ in ROWS])
async def test_every_row_comes_out_as_the_table_says(
    edge: Edge, name: str, row: errors.Row
) -> None:
    kind = errors.kind_for(row.code, row.reason)
    assert kind.__name__ == name
    error = _error(kind)
    edge.sessions.error = error
    retry = str(error.retry_after) if error.retry_after is not None else None

    # Native gRPC through Envoy: the same status, reason and exception class.
    async with AsyncClient(edge.address, timeout=30) as client:
        with pytest.raises(TurnmeshClientError) as info:
            await client.get_session("s")
    assert type(info.value) is client_class(kind)
    assert info.value.code == row.code
    # Invalid arguments carry a BadRequest, not an ErrorInfo (so no reason);
    # A2A's InvalidParams carries both.
    assert info.value.reason == ("" if type(error) is errors.InvalidArgument else row.reason)
    assert info.value.retry_after == error.retry_after
    if isinstance(error, errors.InvalidArgument):
        assert info.value.violations == {"message": "must not be blank"}

    async with httpx.AsyncClient(base_url=f"http://{edge.address}", timeout=30) as http:
        # Native REST, and the simple chat and AG-UI surfaces: problem+json.
        problem_calls = [
            http.get("/v1/sessions/s"),
            http.post("/v1/chat", json={"message": "hi", "session_id": "s"}),
            http.post(
                "/v1/agui",
                json={"threadId": "s", "messages": [{"id": "1", "role": "user", "content": "hi"}]},
            ),
        ]
        for response in await asyncio.gather(*problem_calls):
            where = response.request.url.path
            shown = row
            if where in ("/v1/chat", "/v1/agui") and issubclass(kind, errors.NotFound):
                # An unknown session (thread) starts a new one: CreateSession's
                # NOT_FOUND is the agent's (the model's) there.
                shown = errors.ModelNotFound.row()
            assert response.status_code == row.http_status, where
            assert response.headers["content-type"] == "application/problem+json", where
            body = response.json()
            assert body["status"] == row.http_status, where
            assert body["title"] == shown.title, where
            assert body["type"] == shown.problem_type, where
            assert body["grpc_code"] == row.code.value[0], where
            assert response.headers.get("retry-after") == retry, where
            if row.code == grpc.StatusCode.UNAUTHENTICATED:
                assert response.headers["www-authenticate"].startswith("Bearer"), where

        # A2A's HTTP+JSON binding: Google's error shape, the row's status.
        a2a = await http.post(
            "/demo/message:send",
            json={"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}]}},
        )
        assert a2a.status_code == row.http_status, a2a.text
        a2a_error = a2a.json()["error"]
        assert (a2a_error["code"], a2a_error["status"]) == (row.http_status, row.code.name)
        assert a2a_error["message"]
        assert a2a.headers.get("retry-after") == retry

        # OpenAI's paths: OpenAI's error shape with the row's type.
        openai_calls = [
            http.post(
                "/v1/chat/completions",
                headers={"X-Session-Id": "s"},
                json={"model": "demo", "messages": [{"role": "user", "content": "hi"}]},
            ),
            http.post("/v1/responses", json={"model": "demo", "input": "hi"}),
        ]
        for response in await asyncio.gather(*openai_calls):
            where = response.request.url.path
            assert response.status_code == row.http_status, where
            payload = response.json()["error"]
            assert payload["type"] == row.openai_type, where
            assert payload["message"], where
            assert response.headers.get("retry-after") == retry, where
