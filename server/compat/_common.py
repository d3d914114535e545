"""What every compatibility surface shares: a client of the public
SessionService (so forwarding, policies and validation are the ones the
native API has), error translation, and HTTP body framing."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any

import grpc
from google.api import httpbody_pb2
from google.protobuf import json_format
from pydantic import BaseModel, ConfigDict, ValidationError

from turnmesh.runtime import bodies, principals, tracing, wire
from turnmesh.runtime.auth import bearer
from turnmesh.runtime.errors import (
    FieldViolation,
    InvalidArgument,
    NotFound,
    TurnmeshError,
    Unavailable,
    mapped_rpc_errors,
)
from turnmesh.runtime.interceptors import INTERNAL_METADATA
from turnmesh.runtime.principals import PRINCIPAL_METADATA
from turnmesh.runtime.serving import mesh_channel
from turnmesh.runtime.tls import PLAINTEXT, Transport
from turnmesh.v1 import event_pb2, message_pb2
from turnmesh.v1 import session_service_pb2 as spb
from turnmesh.v1.session_service_pb2_grpc import SessionServiceStub

if TYPE_CHECKING:
    from turnmesh.v1.session_service_pb2_grpc import SessionServiceAsyncStub

_TURN = spb.DESCRIPTOR.services_by_name["SessionService"].methods_by_name["Turn"]
# A surface's calls to its own server are quick, but a session's owner may be
# another server: the same bound as the typed client's default.
CALL_TIMEOUT_SECONDS = 60.0


class Mesh:
    """The public API as the compatibility surfaces see it: calls to this
    server's own SessionService, made with the caller's API key. A failed call
    raises the error the service raised (``turnmesh.runtime.errors``), so the
    surface reports it exactly as the native API would."""

    def __init__(
        self, channel: grpc.aio.Channel | None = None, metadata: Sequence[tuple[str, str]] = ()
    ) -> None:
        self._channel = channel
        # One stub for the channel, shared by every caller's view.
        self._stubs: SessionServiceAsyncStub | None = (
            SessionServiceStub(channel) if channel is not None else None
        )
        self._internal_token: str | None = None
        self._metadata = tuple(metadata)

    def connect(
        self, address: str, internal_token: str | None = None, transport: Transport = PLAINTEXT
    ) -> None:
        self._channel = mesh_channel(address, transport)
        self._stubs = SessionServiceStub(self._channel)
        self._internal_token = internal_token

    def for_caller(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> Mesh:
        """A view whose calls carry this caller's key, principal and trace.

        The internal token marks calls the server makes to itself: the
        caller's request was authenticated and counted once already, and the
        token makes the server believe the principal it names. The key goes
        too: with mutual TLS and no mesh key, a call forwarded to another
        server is opened there by it."""
        if self._channel is None:
            raise Unavailable("this server is still starting")
        key = bearer(metadata)
        extra = [("authorization", f"Bearer {key}")] if key else []
        if self._internal_token:
            extra += [
                (INTERNAL_METADATA, self._internal_token),
                (PRINCIPAL_METADATA, principals.current().header()),
            ]
        view = Mesh(metadata=(*extra, *tracing.inject()))
        view._channel, view._stubs = self._channel, self._stubs
        return view

    @property
    def _stub(self) -> SessionServiceAsyncStub:
        if self._stubs is None:
            raise Unavailable("this server is still starting")
        return self._stubs

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    async def get_session(self, session_id: str) -> spb.Session:
        with mapped_rpc_errors():
            response = await self._stub.GetSession(
                spb.GetSessionRequest(session_id=session_id),
                metadata=self._metadata,
                timeout=CALL_TIMEOUT_SECONDS,
            )
        return response.session

    async def session_exists(self, session_id: str) -> bool:
        try:
            await self.get_session(session_id)
        except (NotFound, InvalidArgument):
            return False  # an invalid id cannot exist either
        return True

    async def create_session(
        self,
        session_id: str | None,
        agent: str | None,
        history: Sequence[message_pb2.Message] = (),
        *,
        param: str = "agent_name",
    ) -> str:
        """A new session; an unknown agent is NotFound naming ``param``."""
        request = spb.CreateSessionRequest(
            session_id=session_id or "", agent_name=agent or "", messages=history
        )
        try:
            with mapped_rpc_errors():
                response = await self._stub.CreateSession(
                    request, metadata=self._metadata, timeout=CALL_TIMEOUT_SECONDS
                )
        except NotFound as exc:
            raise NotFound(exc.detail, reason="MODEL_NOT_FOUND", metadata={"param": param}) from exc
        return response.session.session_id

    async def delete_session(self, session_id: str) -> None:
        with mapped_rpc_errors():
            await self._stub.DeleteSession(
                spb.DeleteSessionRequest(session_id=session_id),
                metadata=self._metadata,
                timeout=CALL_TIMEOUT_SECONDS,
            )

    async def history(self, session_id: str) -> list[message_pb2.Message]:
        with mapped_rpc_errors():
            response = await self._stub.GetHistory(
                spb.GetHistoryRequest(session_id=session_id),
                metadata=self._metadata,
                timeout=CALL_TIMEOUT_SECONDS,
            )
        return list(response.messages)

    @contextlib.asynccontextmanager
    async def turn(
        self,
        session_id: str,
        message: str,
        *,
        files: Sequence[message_pb2.File] = (),
        metadata: Mapping[str, Any] | None = None,
        policy: spb.TurnPolicy.ValueType = spb.TURN_POLICY_COLLECT,
    ) -> AsyncIterator[AsyncIterator[event_pb2.Event]]:
        """A turn's events; leaving the block closes the stream (a disconnect:
        the turn goes on, as it does for any caller)."""
        request = spb.TurnRequest(session_id=session_id, message=message, policy=policy)
        if metadata:
            json_format.ParseDict(dict(metadata), request.metadata)
        call: grpc.aio.UnaryStreamCall[Any, event_pb2.Event]
        if files and self._channel is not None:
            # Possibly megabytes: serialized a file at a time, off the loop.
            serialized = await wire.serialize_off_loop(request, {"files": files})
            turn = wire.raw_unary_stream(self._channel, _TURN, event_pb2.Event)
            call = turn(serialized, metadata=self._metadata)
        else:
            request.files.extend(files)
            call = self._stub.Turn(request, metadata=self._metadata)

        async def events() -> AsyncIterator[event_pb2.Event]:
            with mapped_rpc_errors():
                async for event in call:
                    yield event

        try:
            yield events()
        finally:
            call.cancel()


# The turn policies by the short names the other APIs' requests use.
POLICIES: dict[str, spb.TurnPolicy.ValueType] = {
    name: spb.TurnPolicy.Value(f"TURN_POLICY_{name.upper()}")
    for name in ("collect", "enqueue", "interrupt", "reject")
}


class ContentPart(BaseModel):
    """A part of an OpenAI message's content: text, or a file or image whose
    fields each surface reads from its extras."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


def invalid(field: str, description: str) -> InvalidArgument:
    return InvalidArgument([FieldViolation(field, description)])


async def parse_json_body(body: httpbody_pb2.HttpBody) -> dict[str, Any]:
    """The request's JSON object (parsed off the event loop when large)."""
    # Receiving and decoding the request took a loop step of its own already
    # (tens of milliseconds for 100 MB): copying its data out starts another.
    await asyncio.sleep(0)
    data = body.data
    # The request keeps no copy of its own: a turn may hold the call open
    # for minutes, and the parsed body holds what it needs.
    body.ClearField("data")
    try:
        return await bodies.parse_json(data)
    except bodies.BodyError as exc:
        raise invalid("body", str(exc)) from None
    except BrokenProcessPool:
        raise Unavailable("this server could not decode the body now; retry") from None


def json_body(payload: Any) -> httpbody_pb2.HttpBody:
    return httpbody_pb2.HttpBody(
        content_type="application/json", data=json.dumps(payload, separators=(",", ":")).encode()
    )


def sse_body(payload: Any, event: str | None = None) -> httpbody_pb2.HttpBody:
    """One SSE frame; the stream's first HttpBody sets the content type."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    prefix = f"event: {event}\n" if event else ""
    return httpbody_pb2.HttpBody(
        content_type="text/event-stream", data=f"{prefix}data: {data}\n\n".encode()
    )


def from_pydantic(exc: ValidationError) -> InvalidArgument:
    """A request body that does not fit the schema, one violation per error."""
    violations = []
    for error in exc.errors()[:20]:
        field = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in error["loc"]).replace(
            ".[", "["
        )
        violations.append(FieldViolation(field or "body", error["msg"]))
    return InvalidArgument(violations)


def turn_error(event: event_pb2.Event) -> TurnmeshError:
    """A turn that ended with RUN_ERROR, for a surface that answers in one piece."""
    if event.problem.status in (502, 503):  # worker_failed, worker_unavailable, owner_lost
        return Unavailable(event.message or "the turn failed")
    return TurnmeshError(event.message or "the turn failed", reason=event.code.upper() or None)
