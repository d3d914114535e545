"""A2A's JSON-RPC 2.0 binding: one request per POST, its ``method`` an
A2AService RPC's name (A2A v1.0's method names are those), its ``params``
that RPC's request in proto JSON. Each call goes to the A2AServicer's own
method of that name, so every binding runs the same code (and an RPC the
servicer gains is served here too); this module only speaks the envelope.

Answers: a JSON-RPC response (``application/json``), or for the streaming
RPCs SSE frames each holding one (an error after the first as an ``error``
event, as a2a-sdk's server sends it). An error before any frame is a plain
JSON-RPC error response, HTTP 200 as the spec and a2a-sdk's client want,
with its code from the error table's JSON-RPC column; one that asks the
caller to come back later (it carries a Retry-After: quotas, rate limits,
a busy context, no live worker) keeps its HTTP status and Retry-After too,
which the edge sets from ``STATUS_HEADER``. Batches, notifications and v0.3
method names are refused (docs/api.md says why).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, cast

import grpc
from a2a.types import a2a_pb2
from google.api import httpbody_pb2
from google.protobuf import descriptor, empty_pb2, json_format, message, message_factory

from turnmesh.runtime import sanitize
from turnmesh.runtime.error_decoding import from_rpc_error
from turnmesh.runtime.errors import (
    JSONRPC_INVALID_PARAMS,
    JSONRPC_INVALID_REQUEST,
    JSONRPC_METHOD_NOT_FOUND,
    JSONRPC_PARSE_ERROR,
    FieldViolation,
    InvalidArgument,
    InvalidParams,
    TurnmeshError,
)
from turnmesh.runtime.handlers import ServicerContext
from turnmesh.runtime.interceptors import worded_for_callers
from turnmesh.server.compat._common import json_body, parse_json_body, sse_body

log = logging.getLogger(__name__)

VERSION = "2.0"
# The response header the edge turns into the HTTP status (envoy/problem.lua).
STATUS_HEADER = "x-turnmesh-jsonrpc-status"
RETRY_AFTER_HEADER = "retry-after"
_SERVICE = a2a_pb2.DESCRIPTOR.services_by_name["A2AService"]
# A2A v0.3's method names, answered "not found" with the v1.0 names to use.
# Written out, not read from a2a-sdk's v0.3 models: importing those (and the
# SDK's JSON-RPC models, with its whole server package) cost every server
# about 0.2 s and 5 MiB at start; a unit test holds the list to the SDK's.
V03_METHODS = frozenset(
    {
        "agent/getAuthenticatedExtendedCard",
        "message/send",
        "message/stream",
        "tasks/cancel",
        "tasks/get",
        "tasks/pushNotificationConfig/delete",
        "tasks/pushNotificationConfig/get",
        "tasks/pushNotificationConfig/list",
        "tasks/pushNotificationConfig/set",
        "tasks/resubscribe",
    }
)
# A batch: a JSON array (named a batch however deep it is).
_BATCH = re.compile(rb"\s*\[")
# Longer texts (an echoed parse failure) are cut: an error never carries a body back.
MAX_MESSAGE = 300

Id = str | int | None
Handler = Callable[[message.Message, ServicerContext], Any]


@dataclass(frozen=True)
class RpcError:
    """A JSON-RPC error object (``data`` left out when None)."""

    code: int
    message: str
    data: Any = None

    def response(self, request_id: Id) -> dict[str, Any]:
        """The error response for a request, as a2a-sdk's server writes it."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return {"error": error, "id": request_id, "jsonrpc": VERSION}


class _Refused(Exception):
    """A request answered with a JSON-RPC error of its own (not a row of the
    error table): a parse error, an invalid request, an unknown method."""

    def __init__(self, error: RpcError, request_id: Id = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.request_id = request_id


@dataclass(frozen=True)
class Call:
    request_id: Id
    method: descriptor.MethodDescriptor
    params: message.Message


async def answer(
    servicer: object,
    agent: str,
    body: httpbody_pb2.HttpBody,
    context: ServicerContext,
) -> AsyncIterator[httpbody_pb2.HttpBody]:
    """The JSON-RPC call in ``body`` to the agent at this endpoint, answered
    by ``servicer``'s method of the same name."""
    request_id: Id = None
    try:
        request, request_id = await _envelope(body)
        # Neither the body's bytes nor their JSON are kept while the call runs.
        del body
        call = _call(request, request_id, agent)
        del request
        handler = cast(Handler, getattr(servicer, call.method.name))
        if not call.method.server_streaming:
            result = await handler(call.params, context)
            yield json_body(_result(request_id, result))
            return
        stream = cast(AsyncGenerator[message.Message, None], handler(call.params, context))
        # The first response, or the error that refuses the call, decides
        # between SSE and a plain JSON answer (as a2a-sdk's server does).
        first = await anext(stream, None)
    except _Refused as refused:
        yield json_body(refused.error.response(refused.request_id))
        return
    except Exception as exc:  # every failure is answered in JSON-RPC's words
        error = _error(exc)
        if error.retry_after is not None:
            await context.send_initial_metadata(
                (
                    (STATUS_HEADER, str(error.http_status)),
                    (RETRY_AFTER_HEADER, str(error.retry_after)),
                )
            )
        yield json_body(_error_response(request_id, error))
        return
    async with contextlib.aclosing(stream):
        if first is None:
            return
        yield sse_body(_result(request_id, first))
        try:
            async for response in stream:
                yield sse_body(_result(request_id, response))
        except Exception as exc:  # answered in-band: the status line is sent
            yield sse_body(_error_response(request_id, _error(exc)), event="error")


async def _envelope(body: httpbody_pb2.HttpBody) -> tuple[dict[str, Any], Id]:
    """The request object and its id."""
    try:
        request = await parse_json_body(body)
    except InvalidArgument as exc:
        # Read again only when refused (a large body is not copied twice).
        if _BATCH.match(body.data):
            raise _Refused(
                RpcError(
                    JSONRPC_INVALID_REQUEST,
                    "batch requests are not served: send one JSON-RPC request per POST",
                )
            ) from None
        why = exc.violations[0].description
        if why == "must be a JSON object":  # valid JSON, but no request object
            raise _Refused(
                RpcError(JSONRPC_INVALID_REQUEST, "the body must be a JSON-RPC request")
            ) from None
        raise _Refused(RpcError(JSONRPC_PARSE_ERROR, f"the body is {why}")) from None
    return request, _request_id(request)


def _call(request: dict[str, Any], request_id: Id, agent: str) -> Call:
    if request.get("jsonrpc") != VERSION:
        raise _Refused(_invalid_request('"jsonrpc" must be "2.0"'), request_id)
    method_name = request.get("method")
    if not isinstance(method_name, str) or not method_name:
        raise _Refused(_invalid_request('"method" must be a method\'s name'), request_id)
    method = _method(method_name, request_id)
    params = request.get("params", {})
    if not isinstance(params, dict):
        raise _Refused(RpcError(JSONRPC_INVALID_PARAMS, '"params" must be an object'), request_id)
    return Call(request_id, method, _params(method, params, agent))


def _request_id(request: dict[str, Any]) -> Id:
    if "id" not in request:
        raise _Refused(
            _invalid_request(
                'every call needs an "id": notifications are not served '
                "(each A2A method answers with something the caller needs)"
            )
        )
    value = request["id"]
    if value is None or (isinstance(value, (str, int)) and not isinstance(value, bool)):
        return value
    raise _Refused(_invalid_request('"id" must be a string, an integer or null'))


def _invalid_request(why: str) -> RpcError:
    return RpcError(JSONRPC_INVALID_REQUEST, f"invalid request: {why}")


def _method(name: str, request_id: Id) -> descriptor.MethodDescriptor:
    method = _SERVICE.methods_by_name.get(name)
    if method is not None:
        return method
    shown = repr(name) if len(name) <= 100 else "requested"
    if name in V03_METHODS:
        why = (
            f"the method {shown} is A2A v0.3's: this agent speaks A2A v1.0, "
            f"whose methods are {', '.join(_SERVICE.methods_by_name)}"
        )
    else:
        why = f"no method {shown}: A2A v1.0's are {', '.join(_SERVICE.methods_by_name)}"
    raise _Refused(RpcError(JSONRPC_METHOD_NOT_FOUND, why), request_id)


def _params(
    method: descriptor.MethodDescriptor, params: dict[str, Any], agent: str
) -> message.Message:
    """The RPC's request from ``params`` (unknown fields are ignored, as
    a2a-sdk's server does); the endpoint's agent is its tenant."""
    # Any: the class is the method's own (every A2A request has its tenant).
    request: Any = message_factory.GetMessageClass(method.input_type)()
    try:
        json_format.ParseDict(params, request, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        text = str(exc)
        if sanitize.is_internal(text) or len(text) > MAX_MESSAGE:
            text = f"not a valid {method.input_type.name}"
        raise InvalidParams([FieldViolation("params", text)]) from None
    if agent and "tenant" in method.input_type.fields_by_name:
        tenant = request.tenant
        if tenant and tenant != agent:
            raise InvalidParams(
                [FieldViolation("params.tenant", "names another agent than this endpoint's")]
            )
        request.tenant = agent
    return cast(message.Message, request)


def _result(request_id: Id, result: message.Message) -> dict[str, Any]:
    value = None if isinstance(result, empty_pb2.Empty) else json_format.MessageToDict(result)
    return {"jsonrpc": VERSION, "result": value, "id": request_id}


def _error(exc: Exception) -> TurnmeshError:
    """A handler's failure as a row of the error table, worded for callers."""
    if isinstance(exc, grpc.RpcError):
        exc = from_rpc_error(exc)
    if not isinstance(exc, TurnmeshError):
        log.exception("unhandled error in a JSON-RPC call", exc_info=exc)
        return TurnmeshError("internal error")
    return worded_for_callers(exc, "A2A JSON-RPC")


def _error_response(request_id: Id, error: TurnmeshError) -> dict[str, Any]:
    """A JSON-RPC error response with the row's code, its text, and its
    google.rpc details (ErrorInfo: reason, domain and metadata, which
    a2a-sdk's client reads; BadRequest's field violations) as ``data``."""
    data = [json_format.MessageToDict(detail) for detail in error.details()]
    return RpcError(type(error).jsonrpc_code(), error.detail, data).response(request_id)
