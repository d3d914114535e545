"""What one turn request asks, built once where the request is received.

An ``Admission`` is the request as the session's owner places it: the
session (scoped to the caller's principal), the message and its files, the
caller's tools and answers, the policy, the webhook, the idempotency key and
what makes a retry the same request (``digest``), and what the request
holds in memory until its turn ends (``size``). The service builds it
(``admit``) and everything below takes it whole: the core's limits and
idempotency decision, the session's turns under its policy.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass

from google.protobuf import struct_pb2

from turnmesh.runtime import wire
from turnmesh.runtime.principals import principal_of
from turnmesh.server.sessions.answers import Answers
from turnmesh.v1 import message_pb2
from turnmesh.v1 import session_service_pb2 as spb

__all__ = ["Admission", "admit", "pending_bytes", "request_digest"]


@dataclass(frozen=True, slots=True)
class Admission:
    """One turn request, as its session's owner places it."""

    session_id: str
    # Whose turn it is: the principal the session is scoped to.
    principal: str
    message: str
    files: list[message_pb2.File]
    metadata: struct_pb2.Struct
    policy: spb.TurnPolicy.ValueType
    tools: list[message_pb2.ToolDefinition]
    answers: Answers
    # The request's own URL ("": the session's, if it has one).
    webhook_url: str
    idempotency_key: str
    # What makes a retry with the key the same request ("" without a key).
    digest: str
    # Bytes the request holds until its turn ends, joined or not.
    size: int
    # StartTurn: the turn (or the one it joins) runs to its end whoever leaves.
    background: bool
    # The caller's stream ending cancels the turn (DISCONNECT_POLICY_CANCEL).
    cancel_on_disconnect: bool


async def admit(
    request: spb.TurnRequest, session_id: str, *, background: bool = False
) -> Admission:
    """The admission of a validated request for the session ``session_id``
    (scoped). Its size is its size on the wire, or, for a call made in this
    process, measured; measuring and hashing copy each file's bytes: in a
    thread then, where the event loop runs between one file's copy and the
    next."""
    files = list(request.files)
    size = wire.received_bytes()
    key = request.idempotency_key
    if files:
        if size is None:
            size = await asyncio.to_thread(pending_bytes, request.message, files)
        digest = await asyncio.to_thread(request_digest, request) if key else ""
    else:
        if size is None:
            size = pending_bytes(request.message, files)
        digest = request_digest(request) if key else ""
    return Admission(
        session_id=session_id,
        principal=principal_of(session_id),
        message=request.message,
        files=files,
        metadata=request.metadata,
        policy=request.policy,
        tools=list(request.tools),
        answers=Answers(request.tool_results, request.resume),
        webhook_url=request.webhook_url,
        idempotency_key=key,
        digest=digest,
        size=size,
        background=background,
        cancel_on_disconnect=request.on_disconnect == spb.DISCONNECT_POLICY_CANCEL,
    )


def pending_bytes(message: str, files: list[message_pb2.File]) -> int:
    """What a turn's request holds in memory until the turn ends. Each file's
    content is copied to be measured (the protobuf runtime has no other way):
    a server measures a request by its size on the wire instead
    (``runtime.wire.received_bytes``)."""
    return len(message.encode()) + sum(len(f.content) for f in files)


def request_digest(request: spb.TurnRequest) -> str:
    """What makes a turn the same turn: the request without its key and its
    disconnect policy (a retry may come from a client that behaves otherwise)."""
    same = spb.TurnRequest()
    same.CopyFrom(request)
    same.ClearField("idempotency_key")
    same.ClearField("on_disconnect")
    return hashlib.sha256(same.SerializeToString(deterministic=True)).hexdigest()[:32]
