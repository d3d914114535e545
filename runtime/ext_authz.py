"""Envoy's external authorization (``envoy.service.auth.v3.Authorization/Check``)
on the session servers' gRPC port: Envoy asks it about each REST request's
headers before reading the body, so an unauthenticated upload is answered 401
at the edge, never buffered.

It decides exactly as ``ApiKeyInterceptor`` does, with the same ``ApiKeys``
(so a reloaded keys file counts at once), and answers a denial with the row
the server would have raised (status, ``WWW-Authenticate``, detail); Envoy's
local reply mappers (``envoy/ext_authz.py``) give it the server's body. An
allowed request carries its principal to Envoy's access log as dynamic
metadata; the server still checks the key itself and never reads the
principal from Envoy.

The messages come from a descriptor set (``envoy_auth.binpb``, made by
scripts/gen_protos.py) loaded into a pool of this module's own, so nothing
else in the process sees Envoy's protos.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.rpc import code_pb2

import turnmesh.v1
from turnmesh.runtime.auth import ApiKeys, authenticate, bearer
from turnmesh.runtime.errors import Unauthenticated
from turnmesh.runtime.handlers import ServicerContext
from turnmesh.runtime.principals import ANONYMOUS_PRINCIPAL

SERVICE = "envoy.service.auth.v3.Authorization"
CHECK_METHOD = f"/{SERVICE}/Check"
# Where Envoy finds the principal: %DYNAMIC_METADATA(envoy.filters.http.ext_authz:principal)%.
PRINCIPAL_KEY = "principal"
DESCRIPTOR_SET = Path(turnmesh.v1.__file__).resolve().parent / "envoy_auth.binpb"


def _message_classes() -> tuple[Any, Any]:
    pool = descriptor_pool.DescriptorPool()
    files = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SET.read_bytes())
    for file in files.file:  # dependencies first, as protoc writes them
        pool.Add(file)
    request, response = (
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"envoy.service.auth.v3.{n}"))
        for n in ("CheckRequest", "CheckResponse")
    )
    return request, response


CheckRequest, CheckResponse = _message_classes()


def decide(keys: ApiKeys, request: Any) -> Any:
    """The CheckResponse for a CheckRequest: OK with the caller's principal,
    or the 401 the server would answer."""
    response = CheckResponse()
    try:
        principal = (
            authenticate(keys, bearer(request.attributes.request.http.headers.items()))
            if keys.configured
            else ANONYMOUS_PRINCIPAL
        )
    except Unauthenticated as error:
        response.status.code = code_pb2.UNAUTHENTICATED
        response.status.message = error.detail
        denied = response.denied_response
        denied.status.code = error.http_status
        for name, value in error.trailers:
            option = denied.headers.add()
            option.header.key, option.header.value = name, value
        # Envoy's local reply mappers put it in the problem's detail.
        denied.body = error.detail
        return response
    response.status.code = code_pb2.OK
    response.ok_response.SetInParent()
    response.dynamic_metadata.update({PRINCIPAL_KEY: principal.name})
    return response


def authorization_handler(keys: ApiKeys) -> grpc.GenericRpcHandler:
    """The Authorization service for a grpc.aio server (no generated stubs:
    the messages come from the descriptor set)."""

    async def check(request: Any, context: ServicerContext) -> Any:
        return decide(keys, request)

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Check": grpc.unary_unary_rpc_method_handler(
                check,
                request_deserializer=CheckRequest.FromString,
                response_serializer=CheckResponse.SerializeToString,
            )
        },
    )
