"""The JSON-RPC binding's answers for what the mesh cannot easily be made to
do on cue (server/compat/a2a/jsonrpc.py): an error in the middle of a
stream, an error worded in Python's own words, a failure that is no row of
the error table, a refusal that asks the caller to come back later; and the
error table's JSON-RPC column against the pinned a2a-sdk's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, cast

from a2a.types import a2a_pb2
from a2a.utils.errors import A2A_REASON_TO_ERROR, JSON_RPC_ERROR_CODE_MAP
from google.api import httpbody_pb2

from turnmesh.runtime import errors
from turnmesh.runtime.handlers import ServicerContext
from turnmesh.server.compat.a2a import jsonrpc


class _Context:
    def __init__(self) -> None:
        self.headers: list[tuple[str, str]] = []

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()

    async def send_initial_metadata(self, headers: tuple[tuple[str, str], ...]) -> None:
        self.headers += headers


class _Servicer:
    """Fails as it is told to."""

    def __init__(self, failure: Exception) -> None:
        self.failure = failure

    async def GetTask(self, request: a2a_pb2.GetTaskRequest, context: object) -> a2a_pb2.Task:
        raise self.failure

    async def SubscribeToTask(
        self, request: a2a_pb2.SubscribeToTaskRequest, context: object
    ) -> AsyncIterator[a2a_pb2.StreamResponse]:
        yield a2a_pb2.StreamResponse(task=a2a_pb2.Task(id=request.id))
        raise self.failure


async def _answer(failure: Exception, method: str) -> tuple[list[bytes], _Context]:
    call = {"jsonrpc": "2.0", "id": "r", "method": method, "params": {"id": "t"}}
    body = httpbody_pb2.HttpBody(content_type="application/json", data=json.dumps(call).encode())
    context = _Context()
    answers = jsonrpc.answer(_Servicer(failure), "demo", body, cast(ServicerContext, context))
    return [a.data async for a in answers], context


def _json(data: bytes | str) -> Any:
    return json.loads(data)


async def test_an_error_mid_stream_is_an_error_event() -> None:
    frames, _ = await _answer(errors.Unavailable("the worker went away"), "SubscribeToTask")
    first, last = frames
    assert first.startswith(b"data: ")
    assert _json(first[len(b"data: ") :])["result"]["task"]["id"] == "t"
    event, data = last.decode().strip().split("\n")
    assert event == "event: error"
    error = _json(data[len("data: ") :])
    assert (error["id"], error["error"]["code"]) == ("r", -32064)
    assert error["error"]["data"][0]["reason"] == "UNAVAILABLE"


async def test_python_words_never_leave() -> None:
    (body,), _ = await _answer(errors.NotFound("'NoneType' object has no attribute 'x'"), "GetTask")
    error = _json(body)["error"]
    assert error["code"] == -32055 and "NoneType" not in error["message"]
    (body,), _ = await _answer(KeyError("secret"), "GetTask")
    error = _json(body)["error"]
    assert error["code"] == -32603 and "secret" not in body.decode()


async def test_a_refusal_with_retry_after_keeps_its_status() -> None:
    (body,), context = await _answer(errors.TurnQuotaExceeded("too many turns"), "GetTask")
    assert dict(context.headers) == {jsonrpc.STATUS_HEADER: "429", "retry-after": "1"}
    assert _json(body)["error"]["code"] == -32058
    (body,), context = await _answer(errors.TaskNotFound("no task"), "GetTask")
    assert context.headers == []  # HTTP 200, as JSON-RPC clients read errors
    assert _json(body)["error"]["code"] == -32001


def test_a2a_rows_take_the_sdks_codes() -> None:
    a2a_rows = [
        r for r in errors.rows() if errors.kind_for(r.code, r.reason).domain == "a2a-protocol.org"
    ]
    assert {r.reason for r in a2a_rows} >= {"TASK_NOT_FOUND", "INVALID_PARAMS"}
    for row in a2a_rows:
        assert row.jsonrpc_code == JSON_RPC_ERROR_CODE_MAP[A2A_REASON_TO_ERROR[row.reason]]
    assert errors.TaskNotFound.jsonrpc_code() == -32001
    assert errors.ContentTypeNotSupported.jsonrpc_code() == -32005
    assert errors.InvalidArgument.jsonrpc_code() == -32602
    assert errors.RateLimited.jsonrpc_code() == -32058


def test_v03_method_names_are_the_pinned_sdks() -> None:
    """The v0.3 names written out in the binding are a2a-sdk's own list."""
    from typing import get_args

    from a2a.compat.v0_3 import types as v03

    names = {
        str(request.model_fields["method"].default)
        for request in get_args(v03.A2ARequest.model_fields["root"].annotation)
    }
    assert names == jsonrpc.V03_METHODS


def test_error_responses_are_written_as_the_sdks_server_writes_them() -> None:
    """Each JSON-RPC error the binding writes by hand, against a2a-sdk's
    models and response helper: codes, members and their order."""
    from a2a.server import jsonrpc_models as sdk
    from a2a.server.request_handlers.response_helpers import build_error_response

    rpc = jsonrpc.RpcError
    cases: list[tuple[jsonrpc.RpcError, Any]] = [
        (rpc(errors.JSONRPC_PARSE_ERROR, "p"), sdk.JSONParseError(message="p")),
        (rpc(errors.JSONRPC_INVALID_REQUEST, "r"), sdk.InvalidRequestError(message="r")),
        (rpc(errors.JSONRPC_METHOD_NOT_FOUND, "m"), sdk.MethodNotFoundError(message="m")),
        (rpc(errors.JSONRPC_INVALID_PARAMS, "a"), sdk.InvalidParamsError(message="a")),
        (
            rpc(-32050, "d", [{"reason": "X"}]),
            sdk.JSONRPCError(code=-32050, message="d", data=[{"reason": "X"}]),
        ),
        (rpc(-32050, "e", []), sdk.JSONRPCError(code=-32050, message="e", data=[])),
    ]
    for ours, theirs in cases:
        for request_id in (7, "a", None):
            expected = build_error_response(request_id, theirs)
            assert json.dumps(ours.response(request_id)) == json.dumps(expected)
