"""What every compatibility surface shares: a client of the public
SessionService (so forwarding, policies and validation are the ones the
native API has), error translation, and HTTP body framing."""

from __future__ import annotations

import json
from typing import Any

import grpc
from google.api import httpbody_pb2
from pydantic import ValidationError

from turnmesh.client import (
    AlreadyExistsError,
    AsyncClient,
    InvalidArgumentError,
    NotFoundError,
    SessionBusyError,
    TurnmeshClientError,
    UnavailableError,
)
from turnmesh.runtime import tracing
from turnmesh.runtime.auth import bearer
from turnmesh.runtime.errors import (
    AlreadyExists,
    FieldViolation,
    InvalidArgument,
    NotFound,
    SessionBusy,
    TurnmeshError,
    Unavailable,
)
from turnmesh.runtime.interceptors import INTERNAL_METADATA
from turnmesh.runtime.serving import mesh_channel
from turnmesh.runtime.tls import PLAINTEXT, Transport
from turnmesh.v1 import event_pb2, message_pb2


class Mesh:
    """The public API as the compatibility surfaces see it: calls to this
    server's own SessionService, made with the caller's API key."""

    def __init__(
        self,
        channel: grpc.aio.Channel | None = None,
        api_key: str = "",
        internal_token: str | None = None,
        trace: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self._channel = channel
        self._internal_token = internal_token
        # The internal token marks calls the server makes to itself: the
        # caller's request was authenticated and counted once already.
        extra = ((INTERNAL_METADATA, internal_token),) if internal_token else ()
        extra += trace  # the calls belong to the caller's trace
        self._client = (
            AsyncClient("", channel=channel, api_key=api_key or None, timeout=60, metadata=extra)
            if channel
            else None
        )

    def connect(
        self, address: str, internal_token: str | None = None, transport: Transport = PLAINTEXT
    ) -> None:
        self._channel = mesh_channel(address, transport)
        self._internal_token = internal_token

    def for_caller(self, metadata: object) -> Mesh:
        """A view whose calls carry this caller's `Authorization` and trace."""
        if self._channel is None:
            raise Unavailable("this server is still starting")
        return Mesh(
            self._channel,
            bearer(metadata),  # type: ignore[arg-type]
            self._internal_token,
            tracing.inject(),
        )

    @property
    def client(self) -> AsyncClient:
        if self._client is None:
            raise Unavailable("this server is still starting")
        return self._client

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    async def session_exists(self, session_id: str) -> bool:
        try:
            await self.client.get_session(session_id)
        except NotFoundError:
            return False
        except InvalidArgumentError:
            return False  # not even a valid id: it cannot exist
        except TurnmeshClientError as exc:
            raise to_domain(exc) from exc
        return True

    async def create_session(
        self,
        session_id: str | None,
        agent: str | None,
        history: list[message_pb2.Message] | None = None,
        *,
        param: str = "agent_name",
    ) -> str:
        try:
            session = await self.client.create_session(
                session_id, agent=agent, messages=history or ()
            )
        except NotFoundError as exc:
            raise NotFound(
                exc.message, reason="MODEL_NOT_FOUND", metadata={"param": param}
            ) from exc
        except TurnmeshClientError as exc:
            raise to_domain(exc) from exc
        return session.session_id


def to_domain(exc: TurnmeshClientError) -> TurnmeshError:
    """A client error of the self-call, as the error this surface reports."""
    if isinstance(exc, InvalidArgumentError) and exc.violations:
        return InvalidArgument([FieldViolation(f, d) for f, d in exc.violations.items()])
    mapped: dict[type[TurnmeshClientError], type[TurnmeshError]] = {
        NotFoundError: NotFound,
        AlreadyExistsError: AlreadyExists,
        SessionBusyError: SessionBusy,
        UnavailableError: Unavailable,
    }
    kind = mapped.get(type(exc), TurnmeshError)
    return kind(
        exc.message if kind is not TurnmeshError else "internal error", reason=exc.reason or None
    )


def invalid(field: str, description: str) -> InvalidArgument:
    return InvalidArgument([FieldViolation(field, description)])


def parse_json_body(body: httpbody_pb2.HttpBody) -> dict[str, Any]:
    try:
        data = json.loads(body.data or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise invalid("body", f"not valid JSON: {exc.msg if hasattr(exc, 'msg') else exc}") from exc
    if not isinstance(data, dict):
        raise invalid("body", "must be a JSON object")
    return data


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
    if event.problem.status in (502, 503):
        return Unavailable(event.message or "the turn failed")
    return TurnmeshError(event.message or "the turn failed", reason=event.code.upper() or None)
